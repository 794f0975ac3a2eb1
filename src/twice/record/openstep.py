"""The step in progress: what the optimizers of one round have contributed, and its StepRecord;
and what the process consumed since the last step ended (losses, batches, module inputs).

`OpenStep` is a part of `Recorder` (record/recorder.py): it owns the open round, the clock that
says where it ends (core/steps.py) and what was consumed since the last step.
"""

from __future__ import annotations

import math
import operator
import warnings
import weakref
from dataclasses import dataclass, field
from typing import Any

from twice.core.digests import OPAQUE_TYPES, Digester, digest_pairs, float_bits
from twice.core.escaping import escape_controls
from twice.core.records import StepRecord
from twice.core.steps import RoundClock
from twice.record.inputs import ModuleInputs
from twice.record.norms import floats

__all__ = ["OpenStep", "StepRound"]


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


class OpenStep:
    """The step in progress until its round ends: the round the optimizers fill, the clock that
    says when it ends, and the losses, batches and outermost module inputs consumed since the last
    step ended (a traced step's own, whatever --trace-every: an untraced round's are dropped)."""

    def __init__(self) -> None:
        self.round = StepRound()
        self.clock = RoundClock()
        self.losses: list[Any] = []
        self.batches: list[Digester] = []  # one digester per batch read since the last step
        self.confirmed = 0  # of those, how many a module call with gradients on came after
        self.quiet = False  # a call without gradients came after the others
        self.aside: list[Digester] = []  # batches read only for evaluation
        # modules called with gradients on, by identity (a module may define __eq__ and no hash)
        self.trained: dict[int, weakref.ref] = {}
        self.inputs = ModuleInputs()  # the batch where no DataLoader gives one
        # Every process records its parameters before its first update (params_before): a run
        # resumed by the script itself is found in another run by it (store/tracealign.py).
        self.probe_params = True
        # types in batches already warned about (by an earlier recorder too)
        self.opaque_warned = len(OPAQUE_TYPES)

    def add_batch(self, batch: Any) -> None:
        """A batch read now: digested, it belongs to the step in progress. The batches read
        before it that only a call without gradients came after were evaluation data."""
        if self.quiet:
            self._set_aside()
        self.batches.append(Digester(strict=False).update(batch))

    def module_called(self, module: Any, grad: bool) -> bool:
        """An outermost call of `module`, with gradients on or not; returns whether the step has
        DataLoader batches (its data then comes from them, not from the calls).

        With gradients on, the batches read before it are the step's. A call without gradients
        after a batch is evaluation (a validation loader) when the next thing is another batch
        read, or when the module is one trained with gradients: that batch is set aside, the
        step's only where it has no other. A call of another module without gradients (a
        teacher, an EMA or target network before the student) leaves it the step's."""
        if grad:
            self.confirmed, self.quiet = len(self.batches), False
            if id(module) not in self.trained:
                self.trained[id(module)] = weakref.ref(module, self._forget(id(module)))
        elif len(self.batches) > self.confirmed:
            self.quiet = True
            known = self.trained.get(id(module))
            if known is not None and known() is module:
                self._set_aside()
        return bool(self.batches)

    def _forget(self, key: int):
        """A callback that drops a trained module's entry once the module is gone."""
        trained = self.trained
        return lambda _ref: trained.pop(key, None)

    def _set_aside(self) -> None:
        self.aside.extend(self.batches[self.confirmed :])
        del self.batches[self.confirmed :]
        self.quiet = False

    def warn_opaque(self) -> None:
        """Warn about the types in batches that twice cannot read, met since the last warning."""
        names, self.opaque_warned = OPAQUE_TYPES[self.opaque_warned :], len(OPAQUE_TYPES)
        warnings.warn_explicit(
            escape_controls(
                f"twice: the batches hold {', '.join(names)}, which twice cannot read: the batch "
                "digest covers its type only, so a difference in its contents goes unseen in the "
                "trace; yield tensors, arrays, numbers, strings, or lists, dicts, dataclasses or "
                "plain objects of those"
            ),
            RuntimeWarning,
            "twice",
            0,
            module="twice",
        )

    def move_pending(
        self,
        round_: StepRound,
        losses: int | None = None,
        batches: int | None = None,
        sealed: bool = False,
    ) -> None:
        """Move the pending losses and batches (the first `losses` and `batches` of them, when
        given) into `round_`, and the module inputs (only those sealed by the step's backward
        when `sealed`: a hand loop's step ends inside the next step's first module call).

        The step's data, by what shows it was trained on: the DataLoader batches, else the data
        its module calls with gradients on were given (a loop without a DataLoader), else what
        was read or given only for calls without gradients."""
        losses = len(self.losses) if losses is None else losses
        batches = min(len(self.batches), len(self.batches) if batches is None else batches)
        round_.losses.extend(self.losses[:losses])
        del self.losses[:losses]
        _fold(round_, self.batches[:batches])
        round_.batch_count += batches
        del self.batches[:batches]
        self.confirmed = max(0, self.confirmed - batches)
        data, quiet = self.inputs.take(sealed)
        if round_.batch is None:
            round_.batch = data  # a loop without a DataLoader: what its modules were given
        if round_.batch is None:
            _fold(round_, self.aside)
        if round_.batch is None:
            round_.batch = quiet
        self.aside, self.quiet = [], False

    def drop_pending(self, losses: int | None = None, batches: int | None = None) -> None:
        """Forget the first `losses` and `batches` consumed (all of them, when not given): what an
        untraced step consumed is not the next traced step's."""
        batches = len(self.batches) if batches is None else batches
        del self.losses[:losses], self.batches[:batches]
        self.confirmed, self.aside = max(0, self.confirmed - batches), []
        self.quiet = False

    def end_round(self) -> None:
        """The round ended (written or not): the next one starts empty."""
        self.clock.reset()
        self.round = StepRound()

    def drop(self) -> None:
        """Forget the step in progress: its round and what it consumed."""
        self.round, self.losses, self.batches = StepRound(), [], []
        self.confirmed, self.aside, self.quiet = 0, [], False
        self.clock.reset()

    def resume(self, keep_batches: int | None) -> None:
        """A checkpoint was restored: the open round and the losses go, and the batches but the
        last `keep_batches` (None: all of them stay)."""
        self.round = StepRound()
        self.clock.reset()
        self.losses = []
        if keep_batches is not None:
            self.batches = self.batches[-keep_batches:] if keep_batches > 0 else []
        self.confirmed, self.aside, self.quiet = len(self.batches), [], False

    def forked(self) -> None:
        """In a forked child: nothing consumed yet, no optimizer seen in a round."""
        self.round, self.losses, self.batches = StepRound(), [], []
        self.confirmed, self.aside, self.quiet = 0, [], False
        self.clock = RoundClock()


def _fold(round_: StepRound, digesters: list) -> None:
    """Fold batch digests into the round's batch, in the order they were read."""
    for digester in digesters:
        if round_.batch is None:
            round_.batch = digester
        else:
            round_.batch.update(digester.hexdigest())
