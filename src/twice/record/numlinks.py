"""The middle links of a NaN's story, in the words people search for: which gradients were
exactly zero, and what the division that made 0/0 read, as written on the user's line."""

from __future__ import annotations

import torch

from twice.record.callsite import division_operands
from twice.record.health import Event
from twice.record.names import names_in_words

__all__ = ["zero_gradients", "name_operands"]


def zero_gradients(
    step: int, overwritten: torch.Tensor | None, before: torch.Tensor | None
) -> Event | None:
    """At the fault: the parameters whose gradients are exactly zero, or vanishing (their norm
    underflows to 0), as they were before the faulting op (`before`, when it overwrote
    `overwritten`); None when there are none."""
    from twice.record.hooks import active_recorder

    recorder = active_recorder()
    named = recorder.names.all() if recorder is not None else []
    zero, tiny = [], []
    for name, param in named:
        grad = param.grad
        if grad is None:
            continue
        if overwritten is not None and grad is overwritten:
            grad = before
        # Exactly zero, or so small (subnormal) that the squares underflow and the norm is 0.
        if float(torch.linalg.vector_norm(grad)) == 0.0:
            (zero if not bool(grad.any()) else tiny).append(name)
    if not (zero or tiny):
        return None
    parts = []
    if zero:
        parts.append(
            f"the gradients of {names_in_words(zero)} are exactly zero at step {step} "
            "(every element)"
        )
    if tiny:
        parts.append(
            f"{'those' if zero else 'the gradients'} of {names_in_words(tiny)} "
            f"{'' if zero else f'at step {step} '}are vanishing: zeros and values so small "
            "(subnormal) that their norm underflows to 0"
        )
    return Event(
        "zero_grad",
        step,
        "; ".join(parts),
        details={"parameters": zero + tiny, "exactly_zero": zero, "vanishing": tiny},
    )


def name_operands(event: Event, numerator) -> None:
    """Add to a division-by-zero event what it divided, as written on its line: "`p.grad.norm()`
    is zero and `p.grad` is all zero: 0/0 is NaN". `numerator` is the first operand's value as it
    was before the op."""
    operands = division_operands(event.line)
    if operands is None:
        return
    top, bottom = operands
    zeros = int((numerator.detach() == 0).sum()) if isinstance(numerator, torch.Tensor) else 0
    event.summary += f": `{bottom}` is zero"
    if zeros:
        event.summary += (
            f" and `{top}` is all zero"
            if zeros == numerator.numel()
            else f" and `{top}` holds {zeros} exact zeros"
        ) + ": 0/0 is NaN"
    event.details.update(numerator=top, denominator=bottom)
