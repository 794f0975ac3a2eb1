"""The recorder: turns a process's step events into StepRecords in its trace.

A "step" is one round of optimizer updates: with one optimizer, one `step()` call; with several
(a GAN's discriminator and generator) the round ends when an optimizer that already stepped in it
steps again. Everything consumed in between (batches from DataLoader iterators, losses passed to
backward) belongs to that step. In a loop without torch.optim a step ends when the tensors its
backward produced gradients for have been updated by hand (record/handsteps.py). A script may mark
its steps itself (`twice.Run.step`, through `Recorder.record_explicit`), which then replaces the
hooks for that process. The events come from
record/hooks.py; where a round ends is core/steps.py's RoundClock.
"""

from __future__ import annotations

import math
import operator
import os
import time
from pathlib import Path
from typing import Any

from twice.core.digests import (
    OPAQUE_TYPES,
    Digester,
    digest,
    digest_pairs,
    float_bits,
    local_tensor,
)
from twice.core.fastpath import digest_many, lanes_norm
from twice.core.protocol import ChildSettings, parse_steps
from twice.core.records import StepRecord
from twice.core.steps import RoundClock
from twice.record.guard import costed, guarded
from twice.record.handsteps import HandSteps
from twice.record.health import StepHealth
from twice.record.inputs import ModuleInputs
from twice.record.names import ParamNames, process_stream
from twice.record.norms import floats
from twice.record.norms import norms as tensor_norms
from twice.record.opcontrol import OpControl
from twice.record.openstep import StepRound
from twice.record.replicas import ReplicaCheck, ReplicaDesync
from twice.record.sharding import Layouts, full_digests
from twice.rng.fingerprint import rng_digests
from twice.rng.seeding import capture_rng
from twice.store.layout import RunFolder
from twice.store.resumes import write_resume
from twice.store.traces import TraceWriter

__all__ = ["Recorder", "ReplicaDesync"]

# Per-tensor digests are written every step for models with at most this many parameter tensors,
# else every AUTO_PARAMS_INTERVAL steps: names for a difference where it costs little space.
AUTO_PARAMS_TENSORS = 64
AUTO_PARAMS_INTERVAL = 100
PARAM_CHECK_EVERY = 10


class Recorder:
    """Turns hook events into StepRecords written to `trace[.<stream>].jsonl` in the run folder."""

    def __init__(
        self,
        run_dir: Path,
        *,
        trace_every: int = 1,
        params_every: int | None = None,
        full_every: int | None = None,
        stop_after: int | None = None,
        stream: str | None = None,
        record_ops: Any = None,
        only_steps: set[int] | None = None,
        dump_ops: dict[int, int] | None = None,
        replica_every: int = 20,
        replica_mode: str = "stop",
    ):
        """Record into `run_dir`'s trace of `stream`. The keywords are the launcher's settings
        (core/protocol.py's ChildSettings): only_steps records only those steps (bisection's
        replays); dump_ops saves the outputs of op INDEX of STEP ({STEP: INDEX}, for twice
        locate)."""
        self.run_dir = Path(run_dir)
        self.trace_every = max(1, int(trace_every))
        self.params_every = params_every
        self.full_every = full_every
        self.stop_after = stop_after
        self.stream = stream
        self.step_index = 0
        self.explicit = False
        self.stopped = False
        self._exit_pending = False
        self.pid = os.getpid()
        self.fork_count = 0
        self._t0 = time.perf_counter()
        self.cost = 0.0  # seconds spent in the event handlers below
        self.layouts = Layouts()  # DTensor meshes and placements (record/sharding.py)
        self._writer = TraceWriter(lambda: RunFolder(self.run_dir).trace(process_stream(stream)))
        self._round = StepRound()
        self._clock = RoundClock()
        self._pending_losses: list[Any] = []
        self._pending_batches: list[
            Digester
        ] = []  # one digester per batch read since the last step
        self.names = ParamNames()  # per optimizer: (name, parameter) pairs
        self.inputs = ModuleInputs()  # the batch where no DataLoader gives one
        self.on_stop: list = []  # called when stop_after is reached, before the process exits
        self.rng_at_stop: dict | None = None
        # Every process records its parameters before its first update (params_before): a run
        # resumed by the script itself is found in another run by it (store/tracealign.py).
        self.probe_params = True
        self.only_steps: set[int] | None = only_steps
        self.ops = OpControl(self.run_dir, stream, record_ops, dump_ops)
        # Called several times a step: straight to the op control's methods, no call in between.
        self.set_phase, self._paused = self.ops.set_phase, self.ops.paused
        self._health: StepHealth | None = None  # made at the first recorded step
        self._replicas = ReplicaCheck(self.run_dir, replica_every, replica_mode)
        self.capture_error: dict | None = None  # set when an error of our own stopped the capture
        self._stepping: int | None = (
            None  # id of the optimizer whose step() is running (see _outermost)
        )
        self.steps_seen = (
            0  # outermost optimizer steps ended (GradScaler.step compares it: see on_skipped_step)
        )
        self._skipping = False
        self._opaque_warned = len(
            OPAQUE_TYPES
        )  # types in batches already warned about (by an earlier recorder too)
        # Until an optimizer steps, steps may be hand updates (record/handsteps.py).
        self._hand: HandSteps | None = HandSteps()
        self.batches_read = 0
        self.backward_calls = 0

    def events(self) -> dict[str, int]:
        """What this process's hooks saw: batches read, backward calls, optimizer steps, and the
        steps recorded (the process record keeps them, to say why a run has no step)."""
        return {
            "batches": self.batches_read,
            "backward_calls": self.backward_calls,
            "optimizer_steps": self.steps_seen,
            "steps": self.step_index,
        }

    @classmethod
    def from_settings(
        cls, run_dir: Path, settings: ChildSettings, stream: str | None = None, **overrides: Any
    ) -> Recorder:
        """A recorder configured by the launcher's settings (`overrides` win)."""
        kwargs = dict(
            trace_every=settings.trace_every,
            params_every=settings.params_every,
            full_every=settings.full_every,
            stop_after=settings.stop_after,
            stream=stream,
            record_ops=parse_steps(settings.record_ops or ""),
            only_steps=settings.only_steps,
            dump_ops=settings.dump_ops,
            replica_every=settings.replica_every,
            replica_mode=settings.replica_mode,
        )
        kwargs.update(overrides)
        return cls(run_dir, **kwargs)

    # -- events -----------------------------------------------------------------------------------
    @guarded
    def on_batch(self, batch: Any) -> None:
        """A DataLoader iterator yielded `batch`: it belongs to the step in progress."""
        if self._exit_pending:  # (a check before the call: three events a step, traced or not)
            self._exit_if_stopping()
        self.batches_read += 1
        if self._hand is not None and self._hand.open:
            self._hand_check(False)
        self.set_phase("forward")
        if self.explicit or not self._tracing_this_step():
            return
        with self._paused():
            self._pending_batches.append(Digester(strict=False).update(batch))
        if len(OPAQUE_TYPES) > self._opaque_warned:
            self._warn_opaque()

    @guarded
    def on_module_call(self, args: tuple, kwargs: dict) -> None:
        """A module is called: the outermost call's data is the step's batch where no DataLoader
        batch came (record/inputs.py)."""
        inputs = self.inputs  # an outermost call (hooks.py counts the inner ones itself)
        if self.explicit or self._pending_batches or not self._tracing_this_step():
            inputs.depth += 1
            return
        with self._paused():
            inputs.enter(args, kwargs, tensor_type[0])

    def _warn_opaque(self) -> None:
        import warnings

        names, self._opaque_warned = OPAQUE_TYPES[self._opaque_warned :], len(OPAQUE_TYPES)
        warnings.warn_explicit(
            f"twice: the batches hold {', '.join(names)}, which twice cannot read: the batch "
            f"digest "
            "covers its type only, so a difference in its contents goes unseen in the trace; yield "
            "tensors, arrays, numbers, strings, or lists, dicts, dataclasses or plain objects of "
            "those",
            RuntimeWarning,
            "twice",
            0,
            module="twice",
        )

    @guarded
    def on_backward(self, tensors: Any) -> None:
        """`backward` was called on `tensors`: a scalar one is a loss of the step in progress."""
        if self._exit_pending:
            self._exit_if_stopping()
        self.backward_calls += 1
        if self._hand is not None and not self.explicit and self._stepping is None:
            if self._hand.open:
                self._hand_check(True)
            self._hand.backward_starts(tensors)
        if self.explicit or not self._tracing_this_step():
            return
        if isinstance(tensors, tensor_type[0]) and tensors.numel() == 1:
            self._pending_losses.append(tensors.detach())

    @guarded
    def pre_step(self, optimizer, args, kwargs) -> None:
        """An optimizer's step() is about to run: its gradients, as the update will use them."""
        if self._exit_pending:
            self._exit_if_stopping()
        if self._hand is not None:  # an optimizer loop: its steps are the optimizer's
            self._hand.unwatch()
            self._hand = None
        if self.explicit:
            return
        if self._clock.closes(id(optimizer)):
            self._finish_round()
        if self.probe_params and not self._clock.members:
            # The first step after a resume: record the parameters as loaded, to tell a model that
            # was not restored from an optimizer or RNG that was not.
            self.probe_params = False
            with self._paused():
                self._round.params_before = digest_pairs(
                    [(n, digest(p)) for n, p in self.names.of(optimizer)]
                )
        # A torch.optim step's ops all come from the line calling step(); a user's own optimizer's
        # have lines of their own.
        self.set_phase(
            "optimizer", step_line_shared=type(optimizer).__module__.startswith("torch.")
        )
        if self._tracing_this_step() and not _has_closure(args, kwargs):
            # Before the update: some optimizers (maximize=True) change the gradients in place.
            with self._paused():
                self._take_grads(optimizer)

    @guarded
    def post_step(self, optimizer, args, kwargs) -> None:
        """An optimizer's step() has run: its parameters and learning rates; the step may end
        here."""
        self.set_phase("forward")
        if self.explicit:
            return
        round_ = self._round
        complete = self._clock.add(id(optimizer))
        round_.skipped = round_.skipped or self._skipping
        if self._clock.size is None:
            # The first round's end is only known when an optimizer repeats; with one optimizer
            # (the usual case) it ends here, so start recording the next step now if chosen.
            self.ops.start(self.step_index + 1)
        with self._paused():
            self._post_step_record(optimizer, args, kwargs, round_, complete)

    def _post_step_record(self, optimizer, args, kwargs, round_, complete: bool) -> None:
        if self._tracing_this_step():
            if _has_closure(args, kwargs):
                self._take_grads(
                    optimizer
                )  # a closure (LBFGS) computes the gradients inside step()
            self._take_params(optimizer)
            round_.lr.extend(
                float_bits(float(group["lr"])) for group in optimizer.param_groups if "lr" in group
            )
            self._move_pending(round_)
            round_.rng = rng_digests()
        if complete:
            self._finish_round()

    @costed
    def record_explicit(
        self, *, loss: Any = None, batch: Any = None, params: list[tuple[str, Any]] | None = None
    ) -> None:
        """One step from a hand-written loop: the given loss, batch and named parameters (with
        .grad)."""
        import torch

        self._exit_if_stopping()
        self.explicit = True
        if self._hand is not None:
            self._hand.unwatch()
            self._hand = None
        if self._tracing_this_step():
            round_ = StepRound()
            if loss is not None:
                round_.losses.append(
                    loss.detach() if isinstance(loss, torch.Tensor) else float(loss)
                )
            if batch is not None:
                round_.batch = Digester(strict=False).update(batch)
                round_.batch_count = 1
                if len(OPAQUE_TYPES) > self._opaque_warned:
                    self._warn_opaque()
            named = list(params or [])
            with_grads = [(name, param.grad) for name, param in named if param.grad is not None]
            digests, norms = self._digests([grad for _, grad in with_grads], True)
            round_.grads.extend((name, value) for (name, _), value in zip(with_grads, digests))
            round_.grad_squares.extend(norms)
            param_digests, _ = self._digests([param for _, param in named], False)
            round_.params.extend((name, value) for (name, _), value in zip(named, param_digests))
            round_.rng = rng_digests()
            self._round = round_
            self._write_round()
        self._advance()

    def drop_open_step(self) -> None:
        """Forget the step in progress (its round, losses and batches)."""
        self._round, self._pending_losses, self._pending_batches = StepRound(), [], []
        self._clock.reset()
        if self._hand is not None:
            self._hand.close()

    # -- hand-updated loops (record/handsteps.py) --------------------------------------------------
    @guarded
    def after_backward(self) -> None:
        """A backward call ended in a loop that has no optimizer (yet): its gradients, as the
        update will read them, and the counters that show the update."""
        hand = self._hand
        if hand is None or self.explicit or self._stepping is not None or hand.leaves is None:
            return
        if not hand.confirmed:
            # Not yet known to be a hand loop (most first backward calls come before an
            # optimizer's step): what the watch cannot read ends the watch, not the capture.
            try:
                self._watch_backward(hand)
            except Exception:  # noqa: BLE001 - the optimizer hooks may still record this loop
                hand.unwatch()
                self._hand = None
            return
        self._watch_backward(hand)

    def _watch_backward(self, hand: HandSteps) -> None:
        with self._paused():
            names, grads = self._named_grads(hand.leaves)
            digests, hand.grad_squares = self._digests(grads, True)
            hand.grad_digests = list(zip(names, digests))
        if self.probe_params and hand.params_before is None:  # before the first update
            leaves = self.names.of(hand.leaves)
            with self._paused():
                digests, _ = self._digests(list(map(_second, leaves)), False)
            hand.params_before = digest_pairs(list(zip(map(_first, leaves), digests)))
        hand.backward_ended(len(self._pending_losses), len(self._pending_batches))
        hand.watch_forward(self._hand_forward)

    @guarded
    def _hand_forward(self) -> None:
        """The first module forward after a backward: the step ends here if it was updated."""
        hand = self._hand
        if hand is not None:
            hand.unwatch()
            if hand.open:
                self._hand_check(False)

    def _hand_check(self, before_backward: bool) -> None:
        """End the open hand step if its tensors were updated; before the next backward, whose
        accumulation would hide it, also if its gradients' bytes changed (an update and a
        zeroing through `.data` move no counter)."""
        hand = self._hand
        if not hand.updated():
            if not before_backward:
                return
            with self._paused():
                names, grads = self._named_grads(hand.leaves)
                now, _ = self._digests(grads, False)
            if list(zip(names, now)) == hand.grad_digests:
                return  # gradient accumulation: the same step goes on
        self._end_hand_step()
        self._exit_if_stopping()

    def _end_hand_step(self) -> None:
        hand = self._hand
        if self._tracing_this_step():
            round_ = self._round = StepRound()
            round_.params_before, hand.params_before = hand.params_before, None
            self.probe_params = False
            round_.grads.extend(hand.grad_digests)
            round_.grad_squares.extend(hand.grad_squares)
            with self._paused():
                self._take_params(hand.leaves)
                self._move_pending(round_, hand.losses, hand.batches)
                round_.rng = rng_digests()
            self._write_round()
            with self._paused():
                self._replicas.after_step(self.step_index, round_.params, round_.named)
        else:
            del self._pending_losses[: hand.losses], self._pending_batches[: hand.batches]
        hand.close()
        hand.confirmed = True
        self._round = StepRound()
        self._advance()

    def close_trace(self) -> None:
        """Close this process's trace file."""
        self._writer.close()

    def _outermost(self, event: str, optimizer) -> bool:
        """Is this step event an outermost optimizer's? An optimizer that steps inside another's
        step (Lookahead's or SAM's base optimizer, ZeroRedundancyOptimizer's local one) is part
        of that step: recording it too would count its gradients twice in the norm. (If an outer
        step raised, its pre event is not closed: its next step starts afresh.)"""
        key = id(optimizer)
        if event == "pre_step":
            if self._stepping is not None and self._stepping != key:
                return False
            self._stepping = key
            return True
        if self._stepping is not None and self._stepping != key:
            return False
        self._stepping = None
        self.steps_seen += 1
        return True

    def on_skipped_step(self, optimizer) -> None:
        """GradScaler.step() found inf/NaN gradients and skipped `optimizer.step()`: the iteration
        still ran (a batch, a loss, gradients), so it is still a step, recorded with `skipped`, its
        parameters unchanged. Without this, a skipped iteration's batch and loss would be merged
        into the next step's record and the step count (--max-steps, resume) would drift from the
        loop's iterations: in fp16 training the first few steps are routinely skipped."""
        self._skipping = True
        try:
            self.pre_step(optimizer, (optimizer,), {})
            self.post_step(optimizer, (optimizer,), {})
        finally:
            self._skipping = False

    def _count_only(self, event: str, args: tuple) -> None:
        """After the capture stopped nothing is recorded, but with a step limit (--max-steps, the
        re-run of `verify --steps`, verify-resume's interrupted run) optimizer rounds are still
        counted, so that the run still ends where it was asked to rather than training on."""
        if self.stop_after is None or self.explicit or os.getpid() != self.pid:
            return
        self._exit_if_stopping()
        if event == "pre_step":
            ended = self._clock.closes(id(args[0]))
        elif event == "post_step":
            ended = self._clock.add(id(args[0]))
        else:
            return
        if ended:
            self._clock.reset()
            self._round = StepRound()
            self._advance()

    # -- pieces -----------------------------------------------------------------------------------
    def _tracing_this_step(self) -> bool:
        if self.only_steps is not None:
            return self.step_index in self.only_steps
        return self.step_index % self.trace_every == 0

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
        digests, norms = self._digests(grads, True)
        self._round.grads.extend(zip(names, digests))
        self._round.grad_squares.extend(norms)

    def _digests(self, tensors: list, norms: bool) -> tuple[list[str], list]:
        """Digests of tensors and, with `norms`, their L2 norms (floats on the CPU, 0-d tensors on
        an accelerator): on the CPU through digests.digest_many, one pass over each tensor's
        bytes. A DTensor is this rank's shard."""
        tensors = list(map(local_tensor, tensors))
        if self.ops.current is None:
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
        # Their norms too, every PARAM_CHECK_EVERY steps: inf or NaN iff some parameter is (cheap
        # health check). Between checks, a non-finite update shows in the learning rate (checked
        # every step) or in the next step's loss and gradients.
        # (map and zip over itemgetters: no generator to resume per tensor, on cold caches)
        digests, found = self._digests(
            list(map(_second, named)), self.step_index % PARAM_CHECK_EVERY == 0
        )
        self._round.params.extend(zip(map(_first, named), digests))
        self._round.named.extend(named)
        if self.full_every and self.step_index % self.full_every == 0:
            self._round.full.extend(full_digests(named))
        self.layouts.observe(optimizer, named)
        if found:
            found = floats(found)
            total = math.sqrt(sum(map(operator.mul, found, found)))
            self._round.param_norm = (
                total
                if self._round.param_norm is None
                else math.hypot(self._round.param_norm, total)
            )

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

    def _finish_round(self) -> None:
        if not self._clock.members:
            return
        if self._tracing_this_step():
            self._write_round()
            with self._paused():
                round_ = self._round
                self._replicas.after_step(self.step_index, round_.params, round_.named)
        self._clock.reset()
        self._round = StepRound()
        self._advance()

    @property
    def completed_steps(self) -> int:
        """Steps completed so far: 0 before the first optimizer step, 1 after it. The first round
        stays open until an optimizer steps a second time (only then is the number of optimizers
        in a round known), so an open first round with an update in it counts as done."""
        first_round_open = self._clock.size is None and bool(self._clock.members)
        return self.step_index + (1 if first_round_open and not self.explicit else 0)

    def resume_at(
        self, step: int, *, keep_batches: int | None = 0, source: str | Path | None = None
    ) -> None:
        """Continue numbering at `step` (after a checkpoint restore); the open round is dropped.

        `keep_batches` keeps that many of the batches read last: a framework that fetches the
        resumed step's batches before it restores state (Lightning, the Hugging Face Trainer) has
        read them already, after any it skipped to reach the resumed position. None keeps them
        all. `source` (the checkpoint restored) is recorded in the run folder for verdicts to
        name."""
        if source is not None:
            write_resume(self.run_dir, source, step)
        self.step_index = step
        self._round = StepRound()
        self._clock.reset()
        if self._hand is not None:
            self._hand.close()
        self._pending_losses = []
        if keep_batches is not None:
            self._pending_batches = (
                self._pending_batches[-keep_batches:] if keep_batches > 0 else []
            )

    def _advance(self) -> None:
        self.ops.stop(self.step_index)
        self.step_index += 1
        self.ops.start(self.step_index)
        if self.stop_after is not None and self.step_index >= self.stop_after and not self.stopped:
            self.stopped = True
            self._writer.close()
            # Leave at the next event (the next batch, backward or step), not inside this step:
            # the loop finishes its bookkeeping first (scheduler.step(), its own checkpoint). The
            # RNGs are taken now, as the step ends: before the next event the loop may already
            # have drawn from them (input noise, dropout, a new epoch's DataLoader iterator).
            self.rng_at_stop = capture_rng()
            self._exit_pending = True

    def _exit_if_stopping(self) -> None:
        if self._exit_pending and os.getpid() == self.pid:
            self._exit_pending = False
            for callback in self.on_stop:
                callback()  # twice.Run checkpoints here: between two steps
            # Through normal interpreter exit, so that atexit handlers record the process.
            raise SystemExit(0)

    def _write_round(self) -> None:
        round_ = self._round
        per_tensor = self._per_tensor_due(len(round_.params))
        record, losses = round_.record(self.step_index, per_tensor, time.perf_counter() - self._t0)
        self._writer.write(record)
        self._check_health(record, round_, losses)

    def _check_health(self, record: StepRecord, round_: StepRound, losses: list[float]) -> None:
        """The cheap always-on numerics mode: loss, gradients and parameters, once per step."""
        if self._health is None:
            self._health = StepHealth(self.run_dir)
        self._health.check(
            record.step,
            losses,
            round_.grads,
            round_.grad_norms,
            round_.grad_total,
            round_.skipped,
            round_.lr,
            round_.param_norm,
        )

    def _per_tensor_due(self, tensors: int) -> bool:
        every = self.params_every
        if every is None:
            every = 1 if tensors <= AUTO_PARAMS_TENSORS else AUTO_PARAMS_INTERVAL
        return every > 0 and self.step_index % every == 0

    def finish(self) -> None:
        """Write the step still open (the last one) and close the trace."""
        if os.getpid() != self.pid:
            return
        hand = self._hand
        if hand is not None and hand.open and not self.stopped and self.capture_error is None:
            # The last backward of a loop that updates by hand: the loop ended, so it did.
            self._end_hand_step()
        self.ops.stop(self.step_index)
        self.ops.close()
        if (
            not self.explicit
            and self._clock.members
            and not self.stopped
            and self.capture_error is None
        ):
            if self._tracing_this_step():
                self._write_round()
            self._round = StepRound()
            self._clock.reset()
        self._writer.close()
        self._replicas.finish()

    def after_fork_in_child(self, index: int) -> None:
        # A forked process (Hogwild worker, DataLoader worker) records into a stream of its own,
        # named by fork order so that two runs name their processes alike.
        """In a forked child: record into a stream of its own (`fork<index>`), from step 0."""
        self.pid = os.getpid()
        self.stream = f"{self.stream + '.' if self.stream else ''}fork{index}"
        self._writer = TraceWriter(RunFolder(self.run_dir).trace(self.stream))
        self.ops.forked(self.stream)
        self._round, self._pending_losses, self._pending_batches = StepRound(), [], []
        self._clock = RoundClock()
        if self._hand is not None:
            self._hand.unwatch()
            self._hand = HandSteps()
        self._replicas = ReplicaCheck(self.run_dir, self._replicas.every, self._replicas.mode)
        self.fork_count = 0
        self.step_index = 0


_first, _second = operator.itemgetter(0), operator.itemgetter(1)


# [torch.Tensor] once hooks.install ran (a list read is cheaper than an import statement, cold)
tensor_type: list[type] = [type("_NoTensor", (), {})]


def _has_closure(args, kwargs) -> bool:
    # Step hooks receive the bound call's arguments: args[0] is the optimizer itself.
    return (len(args) > 1 and callable(args[1])) or (
        bool(kwargs) and callable(kwargs.get("closure"))
    )
