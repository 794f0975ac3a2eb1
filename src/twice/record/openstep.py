"""The step in progress: what the optimizers of one round have contributed, and its StepRecord."""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field
from typing import Any

from twice.core.digests import Digester, digest_pairs, float_bits
from twice.core.records import StepRecord
from twice.record.norms import floats

__all__ = ["StepRound"]


@dataclass
class StepRound:
    """What the optimizers of the current step have contributed so far."""

    grads: list[tuple[str, str]] = field(default_factory=list)
    params: list[tuple[str, str]] = field(default_factory=list)
    named: list[tuple[str, Any]] = field(default_factory=list)  # (name, parameter): replica check
    full: list[tuple[str, str]] = field(default_factory=list)  # whole-tensor digests (full_every)
    grad_squares: list[Any] = field(default_factory=list)
    lr: list[str] = field(default_factory=list)
    losses: list[Any] = field(default_factory=list)
    batch: Digester | None = None
    batch_count: int = 0
    rng: dict[str, str] = field(default_factory=dict)
    params_before: str | None = None
    param_norm: float | None = None  # from param_squares, when the record is made
    param_squares: list[list[Any]] = field(default_factory=list)  # per optimizer: its norms
    grad_norms: list[float] = field(default_factory=list)
    grad_total: float | None = None  # the L2 norm of all gradients, from grad_norms
    params_digest: str | None = None
    skipped: bool = False  # an optimizer's update was skipped by GradScaler (inf/NaN gradients)
    late: Any = None  # what record/latewrite.py is bringing back from the device

    def record(self, step: int, per_tensor: bool, elapsed: float) -> tuple[StepRecord, list[float]]:
        """The step's record (per-tensor digests when `per_tensor`), and its losses as floats.
        Also keeps the parameters' digest and the gradient norms on the round, which the health
        and replica checks read: one device-to-host read of each norm, shared."""
        loss_values = floats(self.losses)
        losses = [float_bits(x) for x in loss_values]
        self.params_digest = digest_pairs(self.params) if self.params else None
        for found in self.param_squares:  # inf or NaN iff some parameter is (health check)
            found = floats(found)
            total = math.sqrt(sum(map(operator.mul, found, found)))
            before = self.param_norm
            self.param_norm = total if before is None else math.hypot(before, total)
        norms = self.grad_norms = floats(self.grad_squares)
        # the squares in order
        self.grad_total = math.sqrt(sum(map(operator.mul, norms, norms))) if norms else None
        record = StepRecord(
            step=step,
            loss=None if not losses else losses[0] if len(losses) == 1 else losses,
            batch=self.batch.hexdigest() if self.batch is not None else None,
            grads=digest_pairs(self.grads) if self.grads else None,
            grad_norm=float_bits(self.grad_total) if norms else None,
            lr=self.lr,
            params=self.params_digest,
            rng=self.rng,
            params_before=self.params_before,
            params_full=digest_pairs(self.full) if self.full else None,
            skipped=True if self.skipped else None,
            param_digests=dict(self.params) if per_tensor and self.params else None,
            grad_digests=dict(self.grads) if per_tensor and self.grads else None,
            time=round(elapsed, 6),
        )
        return record, loss_values
