"""What a step's record holds, from tensors to trace line: the gradients and parameters of the
optimizers (or a hand loop's leaves) with their digests and norms, and each ended round written to
the trace (held for its device values a step where it left some: record/latewrite.py), followed by
the checks after each step (record/stepchecks.py).

`StepData` is a part of `Recorder` (record/recorder.py): it owns the parameters' names, the trace
file and the late writer, and is given the op control (an op-recorded step's tensors are digested
through its op log's cache; twice's own work is kept out of the watching modes) and the checks.
The step a round belongs to is passed in: the numbering is the lifecycle's (record/lifecycle.py).
"""

from __future__ import annotations

import operator
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from twice.core.digests import local_tensor
from twice.core.fastpath import digest_many, lanes_norm
from twice.record.latewrite import LateWriter
from twice.record.names import ParamNames
from twice.record.norms import norms as tensor_norms
from twice.record.opcontrol import OpControl
from twice.record.openstep import StepRound
from twice.record.sharding import Layouts, full_digests
from twice.record.stepchecks import StepChecks
from twice.store.traces import TraceWriter

__all__ = ["StepData", "AUTO_PARAMS_TENSORS", "AUTO_PARAMS_INTERVAL"]

# Per-tensor digests are written every step for models with at most this many parameter tensors,
# else every AUTO_PARAMS_INTERVAL steps: names for a difference where it costs little space.
AUTO_PARAMS_TENSORS = 64
AUTO_PARAMS_INTERVAL = 100


class StepData:
    """Gathers a step's tensors, digests them and writes the round to the trace."""

    def __init__(
        self,
        trace: Path | Callable[[], Path],
        ops: OpControl,
        checks: StepChecks,
        *,
        params_every: int | None = None,
        full_every: int | None = None,
    ):
        """Rounds written to `trace` (a callable: named at the first record), checked by
        `checks`; per-tensor digests every `params_every` steps, whole-tensor ones every
        `full_every`."""
        self.params_every = params_every
        self.full_every = full_every
        self.names = ParamNames()  # per optimizer: (name, parameter) pairs
        self.layouts = Layouts()  # DTensor meshes and placements (record/sharding.py)
        self.checks = checks
        self._ops = ops
        self._t0 = time.perf_counter()  # a record's time counts from here
        self._writer = TraceWriter(trace)
        # Device values read a step late (record/latewrite.py): the round held until then.
        self.late = LateWriter()
        self._late_entry: tuple | None = None
        self.late.on_kill.append(self.flush_late)

    def named_grads(self, holder) -> tuple[list[str], list]:
        """(names, gradients) of the parameters of `holder` (an optimizer, or a hand loop's
        leaves) that have a gradient."""
        names, grads = [], []
        for name, param in self.names.of(holder):
            if param.grad is not None:
                names.append(name)
                grads.append(param.grad)
        return names, grads

    def take_grads(self, round_: StepRound, optimizer) -> None:
        """Add `optimizer`'s gradients (digests and norms) to `round_`."""
        names, grads = self.named_grads(optimizer)
        digests, norms = self.digests(grads, True, late=True)
        round_.grads.extend(zip(names, digests))
        round_.grad_squares.extend(norms)

    def digests(self, tensors: list, norms: bool, late: bool = False) -> tuple[list, list]:
        """Digests of tensors and, with `norms`, their L2 norms (floats on the CPU, 0-d tensors on
        an accelerator): on the CPU through digests.digest_many, one pass over each tensor's
        bytes. A DTensor is this rank's shard. With `late`, a step's record may take them as
        LateDigests, read from the device a step later (record/latewrite.py)."""
        tensors = list(map(local_tensor, tensors))
        ops = self._ops.current
        if ops is None:
            if late and (found := self.late.digests(tensors, norms, lanes_norm, tensor_norms)):
                return found
            digests, found = digest_many(tensors, norms)
        # an op-recorded step: through the op log's cache (the same values: both use digest_tensor)
        else:
            digests, found = (
                [ops.digest(t) for t in tensors],
                [lanes_norm(t) for t in tensors] if norms else None,
            )
        if not norms:
            return digests, []
        missing = [
            i for i, norm in enumerate(found) if norm is None
        ]  # not float32/64 on the CPU: torch's
        for i, norm in zip(missing, tensor_norms([tensors[i] for i in missing])):
            found[i] = norm
        return digests, found

    def take_params(self, round_: StepRound, holder, step: int) -> None:
        """Add the parameters of `holder` (an optimizer, or a hand loop's leaves) after step
        `step`'s update to `round_`."""
        named = self.names.of(holder)
        # Their norms too, every PARAM_CHECK_EVERY steps (record/stepchecks.py): inf or NaN iff
        # some parameter is (cheap health check). Between checks, a non-finite update shows in
        # the learning rate (checked every step) or in the next step's loss and gradients.
        # (map and zip over itemgetters: no generator to resume per tensor, on cold caches)
        digests, found = self.digests(
            list(map(tensor_of, named)), self.checks.param_norms_due(step), late=True
        )
        round_.params.extend(zip(map(name_of, named), digests))
        round_.named.extend(named)
        if self.full_every and step % self.full_every == 0:
            round_.full.extend(full_digests(named))
        self.layouts.observe(holder, named)
        if found:  # their norm is taken when the record is made (openstep.py)
            round_.param_squares.append(found)

    def take_named(self, round_: StepRound, named: list[tuple[str, Any]]) -> None:
        """Add the (name, parameter) pairs a script gave (twice.Run.step), with their gradients,
        to `round_`."""
        with_grads = [(name, param.grad) for name, param in named if param.grad is not None]
        digests, norms = self.digests([grad for _, grad in with_grads], True, late=True)
        round_.grads.extend((name, value) for (name, _), value in zip(with_grads, digests))
        round_.grad_squares.extend(norms)
        param_digests, _ = self.digests([param for _, param in named], False, late=True)
        round_.params.extend((name, value) for (name, _), value in zip(named, param_digests))

    def write(self, round_: StepRound, step: int, replicas: bool = False) -> None:
        """Write `round_`, step `step`'s (after the replica check, with `replicas`). One that left
        values on the device is held, and written when the next one is (or at flush_late)."""
        per_tensor = self._per_tensor_due(len(round_.params), step)
        entry = (round_, step, per_tensor, time.perf_counter() - self._t0, replicas)
        if self.late.start(round_):
            entry, self._late_entry = self._late_entry, entry
            if entry is None:
                return
            self.late.resolve(entry[0])
        else:
            self.flush_late()
        self._emit(*entry)

    def flush_late(self) -> None:
        """Write the round held for its device values, if one is."""
        entry, self._late_entry = self._late_entry, None
        if entry is not None:
            self.late.resolve(entry[0])
            self._emit(*entry)

    def _emit(self, round_, step: int, per_tensor: bool, elapsed: float, replicas: bool) -> None:
        record, losses = round_.record(step, per_tensor, elapsed)
        self._writer.write(record)
        self.checks.after_record(record, round_, losses)
        if replicas:
            with self._ops.paused():
                self.checks.after_step(step, round_)

    def _per_tensor_due(self, tensors: int, step: int) -> bool:
        every = self.params_every
        if every is None:
            every = 1 if tensors <= AUTO_PARAMS_TENSORS else AUTO_PARAMS_INTERVAL
        return every > 0 and step % every == 0

    def close(self) -> None:
        """Close the trace file (writing the round held for its device values)."""
        self.flush_late()
        self._writer.close()

    def finish(self) -> None:
        """The process ends: close the trace; the checks' last word."""
        self.close()
        self.checks.finish()

    def forked(self, trace: Path) -> None:
        """In a forked child: its own trace, fresh checks and late writer (a round the parent
        held is the parent's to write)."""
        self._writer = TraceWriter(trace)
        self.checks = self.checks.forked()
        self._late_entry, self.late = None, self.late.forked()
        self.late.on_kill.append(self.flush_late)


# The name and the tensor of a (name, tensor) pair (map over itemgetters: no generator per tensor)
name_of, tensor_of = operator.itemgetter(0), operator.itemgetter(1)
