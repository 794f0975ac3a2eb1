"""Numerical health events: what went wrong at which step, how to fix it, and the always-on step
checks.

`HealthLog` appends events to numerics.jsonl in the run folder. `StepHealth` is the cheap mode that
runs with every traced step (loss, gradient norm, learning rate, parameter norm: values the trace
has computed already); `twice run --numerics` adds the full per-operation watch (record/numerics).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from twice.store.files import finite_json
from twice.store.layout import RunFolder

__all__ = ["Event", "HealthLog", "StepHealth", "FIXES"]

MAX_EVENTS = 2000
SKIPPED_STREAK = (
    20  # consecutive recorded steps whose update GradScaler skipped, before the log says so
)

FIXES = {
    "saturation": "logits or pre-activations grew until the function saturated: lower the "
    "learning rate, clip "
    "gradients, add weight decay or normalisation before it",
    "zero_grad": "gradients are exactly zero (saturation, dead units): any division by their "
    "norm is 0/0",
    "div_by_zero": "add an epsilon to the denominator (g / (g.norm() + 1e-12)), or skip the "
    "division when it is zero",
    "exp_overflow": "exp overflowed: use a numerically stable op (logsumexp, log_softmax, "
    "softplus) or clamp its input",
    "log_of_zero": "log of zero: use log_softmax / logsigmoid, or add an epsilon (log(x + 1e-12))",
    "loss_zero": "the loss is exactly zero: the model fits exactly, or the loss saturated; "
    "gradients vanish",
    "grad_explosion": "the gradient norm jumped by orders of magnitude: clip gradients, lower "
    "the learning rate",
    "non_finite": "the first non-finite value: fix its cause listed before it",
    "skipped_updates": "GradScaler skips every update: the gradients are inf/NaN even at a small "
    "loss scale; find "
    "the first non-finite value with `twice run --numerics`",
    "bad_scalar": "a scalar argument (learning rate, scale, epsilon) is itself infinite or NaN: "
    "check the configuration",
}


@dataclass
class Event:
    """One numerical warning or fault: what, where, and how to fix it."""

    kind: str
    step: int
    summary: str
    op: str | None = None
    phase: str | None = None
    module: str | None = None
    line: str | None = None
    details: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        """As plain JSON values, with the suggested fix for its kind."""
        return {
            "kind": self.kind,
            "step": self.step,
            "summary": self.summary,
            "op": self.op,
            "phase": self.phase,
            "module": self.module,
            "line": self.line,
            "details": self.details,
            "fix": FIXES.get(self.kind),
        }


_WRITTEN: dict[int, set[str]] = {}  # per process: the event lines it wrote to numerics.jsonl


class HealthLog:
    """Events of one process, appended to numerics.jsonl in the run folder (when there is one)."""

    def __init__(self, run_dir: Path | None):
        self.run_dir = Path(run_dir) if run_dir else None
        self.events: list[Event] = []
        self._seen: set[tuple] = set()

    def add(self, event: Event, key: tuple | None = None) -> None:
        # One event per (kind, op, module, line) per step keeps the log readable.
        """Append `event` unless one with the same key was logged (at most MAX_EVENTS per
        process)."""
        key = key or (event.kind, event.op, event.module, event.line, event.step)
        if key in self._seen or len(self.events) >= MAX_EVENTS:
            return
        self._seen.add(key)
        self.events.append(event)
        if self.run_dir is not None:
            line = json.dumps(finite_json(event.to_json()), sort_keys=True) + "\n"
            # Both checks of a process (the step's and the op watch) log here: a line is written
            # once per process, whichever logs it first.
            written = _WRITTEN.setdefault(os.getpid(), set())
            if line in written:
                return
            written.add(line)
            with open(RunFolder(self.run_dir).numerics_events, "a", encoding="utf-8") as handle:
                handle.write(line)

    def chain(self, fault: Event) -> list[dict]:
        """The warnings that plausibly led to `fault`, first cause first, then the fault.

        Each warning appears once, at its first occurrence, with the step it was last seen at.
        """
        first_seen: dict[tuple, Event] = {}
        last_seen: dict[tuple, Event] = {}
        for event in self.events:
            key = (event.kind, event.op, event.module)
            if event.step <= fault.step:
                first_seen.setdefault(key, event)
                last_seen[key] = event
        causes = sorted(
            first_seen.items(), key=lambda item: (_CAUSAL_ORDER.get(item[1].kind, 9), item[1].step)
        )
        chain = []
        for key, event in causes:
            entry = event.to_json()
            last = last_seen[key]
            entry["last_step"] = last.step
            if last.step != event.step:
                entry["summary"] += (
                    f" (from step {event.step} on; at step {last.step}: "
                    f"{last.summary.split(': ', 1)[-1]})"
                )
            chain.append(entry)
        return chain + [fault.to_json()]


_CAUSAL_ORDER = {
    "saturation": 0,
    "exp_overflow": 1,
    "loss_zero": 2,
    "zero_grad": 3,
    "grad_explosion": 4,
    "div_by_zero": 5,
    "log_of_zero": 5,
    "bad_scalar": 5,
    "skipped_updates": 6,
}


class StepHealth:
    """The cheap always-on numerics checks of one process: loss, gradients and parameters, once
    per step."""

    def __init__(self, run_dir: Path | None):
        self.log = HealthLog(run_dir)
        self._norm_history: list[float] = []
        self._skipped_streak = 0  # consecutive recorded steps whose update GradScaler skipped
        self._skipped_since = 0  # the first of them

    def check(
        self,
        step: int,
        losses: list[float],
        grads: list[tuple[str, str]],
        norms: list[float],
        total: float | None,
        skipped: bool,
        lr: list[str],
        param_norm: float | None,
    ) -> None:
        """One traced step's values: its losses, its (name, digest) gradient pairs with each one's
        norm and their total, the learning rates (as float_bits text) and the parameters' norm
        (None where not computed this step). Names are only read when some norm is exactly zero."""
        log = self.log
        if not all(map(math.isfinite, losses)):
            log.add(Event("non_finite", step, f"loss is {losses[0]} at step {step}"))
        elif losses and all(x == 0.0 for x in losses):
            log.add(Event("loss_zero", step, f"loss exactly 0 at step {step}"))
        if skipped:
            # GradScaler's own answer to inf/NaN gradients (routine for the first fp16 steps) is not
            # a fault; a long streak of them is: the parameters have stopped changing.
            if not self._skipped_streak:
                self._skipped_since = step
            self._skipped_streak += 1  # of recorded steps (one in N under --trace-every N)
            if self._skipped_streak == SKIPPED_STREAK:
                log.add(
                    Event(
                        "skipped_updates",
                        step,
                        f"GradScaler skipped the update at {SKIPPED_STREAK} "
                        f"consecutive recorded steps ({self._skipped_since}-{step}): the "
                        f"gradients are inf/NaN "
                        "at every loss scale tried, and the parameters have not changed since",
                    )
                )
            norms = []
        else:
            self._skipped_streak = 0
        if norms:
            if not math.isfinite(total):
                log.add(Event("non_finite", step, f"gradients non-finite at step {step}"))
            else:
                zero = (
                    [name for (name, _), n in zip(grads, norms) if n == 0.0]
                    if 0.0 in norms
                    else None
                )
                if zero:
                    log.add(
                        Event(
                            "zero_grad",
                            step,
                            f"gradients exactly zero: {', '.join(zero[:6])}"
                            + (" ..." if len(zero) > 6 else ""),
                            details={"parameters": zero},
                        ),
                        key=("zero_grad", tuple(zero)),
                    )
                history = self._norm_history
                # The median only when the norm is over 1000x the smallest recent one (it is then at
                # least as large).
                median = (
                    sorted(history)[len(history) // 2]
                    if len(history) >= 10 and total > 1e3 * min(history)
                    else None
                )
                if median is not None and total > 1e3 * median:
                    log.add(
                        Event(
                            "grad_explosion",
                            step,
                            f"gradient norm {total:.3g} at step {step}, "
                            f"over 1000x the recent median {median:.3g}",
                        )
                    )
                history.append(total)
                del history[:-50]
        if "n" in "".join(
            lr
        ):  # float_bits' "inf", "-inf", "nan:..." (a finite value's hex has no n)
            log.add(
                Event(
                    "bad_scalar", step, f"learning rate non-finite at step {step}: {', '.join(lr)}"
                )
            )
        if param_norm is not None and not math.isfinite(param_norm):
            log.add(
                Event("non_finite", step, f"parameters non-finite after the update at step {step}")
            )
