"""What a step's record holds, gathered from the recorder's events: the gradients and parameters
of the optimizers (or a hand loop's leaves) with their digests and norms, and the losses and
batches consumed since the last step.

`StepData` is a part of `Recorder` (record/recorder.py): it reads the recorder's names, op control
and open round, and writes the round to the trace when the step ends.
"""

from __future__ import annotations

import operator
import time

from twice.core.digests import local_tensor
from twice.core.fastpath import digest_many, lanes_norm
from twice.record.norms import norms as tensor_norms
from twice.record.openstep import StepRound
from twice.record.sharding import full_digests

__all__ = ["StepData", "AUTO_PARAMS_TENSORS", "AUTO_PARAMS_INTERVAL"]

# Per-tensor digests are written every step for models with at most this many parameter tensors,
# else every AUTO_PARAMS_INTERVAL steps: names for a difference where it costs little space.
AUTO_PARAMS_TENSORS = 64
AUTO_PARAMS_INTERVAL = 100


class StepData:
    """The recorder's part that gathers a step's tensors, digests them and writes the round."""

    def _tracing_this_step(self) -> bool:
        return self._traced(self.step_index)

    def _traced(self, step: int) -> bool:
        if self.only_steps is not None:
            return step in self.only_steps
        return step % self.trace_every == 0

    def _tracing_events(self) -> bool:
        """Whether a batch, loss or module input arriving now is kept: this step's, or, once an
        optimizer stepped in this round, maybe the next step's (a round is known to have ended
        only when an optimizer steps again). What an untraced round consumed is dropped at its
        end, so a traced step holds its own, whatever --trace-every."""
        return self._traced(self.step_index) or (
            bool(self._clock.members) and self._traced(self.step_index + 1)
        )

    def _named_grads(self, holder) -> tuple[list[str], list]:
        """(names, gradients) of the parameters of `holder` (an optimizer, or a hand loop's
        leaves) that have a gradient."""
        names, grads = [], []
        for name, param in self.names.of(holder):
            if param.grad is not None:
                names.append(name)
                grads.append(param.grad)
        return names, grads

    def _take_grads(self, optimizer) -> None:
        names, grads = self._named_grads(optimizer)
        digests, norms = self._digests(grads, True, late=True)
        self._round.grads.extend(zip(names, digests))
        self._round.grad_squares.extend(norms)

    def _digests(self, tensors: list, norms: bool, late: bool = False) -> tuple[list, list]:
        """Digests of tensors and, with `norms`, their L2 norms (floats on the CPU, 0-d tensors on
        an accelerator): on the CPU through digests.digest_many, one pass over each tensor's
        bytes. A DTensor is this rank's shard. With `late`, a step's record may take them as
        LateDigests, read from the device a step later (record/latewrite.py)."""
        tensors = list(map(local_tensor, tensors))
        if self.ops.current is None:
            if late and (found := self.late.digests(tensors, norms, lanes_norm, tensor_norms)):
                return found
            digests, found = digest_many(tensors, norms)
        # an op-recorded step: through the op log's cache (the same values: both use digest_tensor)
        else:
            digests, found = (
                [self.ops.current.digest(t) for t in tensors],
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

    def _take_params(self, optimizer) -> None:
        named = self.names.of(optimizer)
        # Their norms too, every PARAM_CHECK_EVERY steps (record/stepchecks.py): inf or NaN iff
        # some parameter is (cheap health check). Between checks, a non-finite update shows in
        # the learning rate (checked every step) or in the next step's loss and gradients.
        # (map and zip over itemgetters: no generator to resume per tensor, on cold caches)
        digests, found = self._digests(
            list(map(tensor_of, named)), self.checks.param_norms_due(self.step_index), late=True
        )
        self._round.params.extend(zip(map(name_of, named), digests))
        self._round.named.extend(named)
        if self.full_every and self.step_index % self.full_every == 0:
            self._round.full.extend(full_digests(named))
        self.layouts.observe(optimizer, named)
        if found:  # their norm is taken when the record is made (openstep.py)
            self._round.param_squares.append(found)

    def _move_pending(
        self, round_: StepRound, losses: int | None = None, batches: int | None = None
    ) -> None:
        """Move the pending losses and batches (the first `losses` and `batches` of them, when
        given) into `round_`."""
        losses = len(self._pending_losses) if losses is None else losses
        batches = len(self._pending_batches) if batches is None else batches
        round_.losses.extend(self._pending_losses[:losses])
        del self._pending_losses[:losses]
        for digester in self._pending_batches[:batches]:
            if round_.batch is None:
                round_.batch = digester
            else:
                round_.batch.update(digester.hexdigest())
        round_.batch_count += batches
        del self._pending_batches[:batches]
        data = self.inputs.take()
        if round_.batch is None and data is not None:
            round_.batch = data  # a loop without a DataLoader: what its modules were given

    def _write_round(self, replicas: bool = False) -> None:
        """Write the round that ended (after the replica check, with `replicas`). One that left
        values on the device is held, and written when the next one is (or at flush_late)."""
        round_ = self._round
        per_tensor = self._per_tensor_due(len(round_.params))
        entry = (round_, self.step_index, per_tensor, time.perf_counter() - self._t0, replicas)
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
            with self._paused():
                self.checks.after_step(step, round_)

    def _per_tensor_due(self, tensors: int) -> bool:
        every = self.params_every
        if every is None:
            every = 1 if tensors <= AUTO_PARAMS_TENSORS else AUTO_PARAMS_INTERVAL
        return every > 0 and self.step_index % every == 0


# The name and the tensor of a (name, tensor) pair (map over itemgetters: no generator per tensor)
name_of, tensor_of = operator.itemgetter(0), operator.itemgetter(1)
