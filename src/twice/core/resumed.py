"""Why a resumed run differs from the run it continues, in one sentence: a difference at the first
resumed step is state the resume did not restore (pure: a divergence in, a sentence out)."""

from __future__ import annotations

from twice.core.causes import NAMES
from twice.core.divergence import Divergence

__all__ = ["explain_resumed"]


# What a resume failed to restore, by the first field that differs at the first resumed step.
_NOT_RESTORED = {
    "params_before": "the model's parameters",
    "batch": "the data position (the loader's or sampler's state)",
    "rng": "the RNG state",
    "loss": "the model's state, or something else the forward pass reads",
    "grads": "the model's state, or something else the backward pass reads",
    "grad_norm": "the gradient clipping or scaling state",
    "lr": "the learning-rate scheduler's state",
    "params": "the optimizer's state",
}


def explain_resumed(
    label: str, checkpoint: str, at: int, divergence: Divergence | None, lead: str | None = None
) -> str:
    """The explanation when run `label` resumed from `checkpoint` at step `at`: a difference at the
    first resumed step is state the resume did not restore, never "same code, seeds and
    settings". `lead` replaces the opening "run B resumed from ..." """
    resumed = lead or f"run {label} resumed from {checkpoint}"
    if divergence is None:
        return f"{resumed}; the runs agree from step {at} on"
    if divergence.step <= at:
        return (
            f"{resumed}; first divergence at the first resumed step: the resume did not restore "
            f"{_NOT_RESTORED[divergence.first]} ({NAMES[divergence.first][0]} differ first)"
        )
    after = divergence.step - at
    return (
        f"{resumed} at step {at}; first divergence {after} step{'s' if after > 1 else ''} later, "
        f"at step {divergence.step} ({NAMES[divergence.first][0]} differ first): state the "
        "checkpoint does not hold (a counter, a cache, a schedule kept outside tracked objects), "
        "or nondeterminism inside the run"
    )
