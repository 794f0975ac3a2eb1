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
)
from twice.core.escaping import escape_controls
from twice.core.protocol import ChildSettings, parse_steps
from twice.core.steps import RoundClock
from twice.record.guard import costed, guarded
from twice.record.handloop import HandLoopWatch
from twice.record.handsteps import HandSteps
from twice.record.inputs import ModuleInputs
from twice.record.latewrite import LateWriter
from twice.record.lifecycle import ProcessLifecycle
from twice.record.names import ParamNames, process_stream
from twice.record.opcontrol import OpControl
from twice.record.openstep import StepRound
from twice.record.replicas import ReplicaDesync
from twice.record.sharding import Layouts
from twice.record.stepchecks import StepChecks
from twice.record.stepdata import StepData
from twice.rng.fingerprint import rng_digests
from twice.store.layout import RunFolder
from twice.store.traces import TraceWriter

__all__ = ["Recorder", "ReplicaDesync"]


class Recorder(StepData, HandLoopWatch, ProcessLifecycle):
    """Turns hook events into StepRecords written to `trace[.<stream>].jsonl` in the run folder.

    Its parts, one concern each: the events and the open round (here), what a step's record
    holds (record/stepdata.py), the hand-loop watch (record/handloop.py), the process
    lifecycle (record/lifecycle.py) and the checks after each step (record/stepchecks.py)."""

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
        health: bool = True,
    ):
        """Record into `run_dir`'s trace of `stream`. The keywords are the launcher's settings
        (core/protocol.py's ChildSettings): only_steps records only those steps (bisection's
        replays); dump_ops saves the outputs of op INDEX of STEP ({STEP: INDEX}, for twice
        locate); health=False turns the numerics check after each step off."""
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
        self.checks = StepChecks(self.run_dir, replica_every, replica_mode, health)
        # Device values read a step late (record/latewrite.py): the round held until then.
        self.late = LateWriter()
        self._late_entry: tuple | None = None
        self.late.on_kill.append(self.flush_late)
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
        if self.explicit or not self._tracing_events():
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
        if self.explicit or self._pending_batches or not self._tracing_events():
            inputs.depth += 1
            return
        with self._paused():
            inputs.enter(args, kwargs, tensor_type[0])

    def _warn_opaque(self) -> None:
        import warnings

        names, self._opaque_warned = OPAQUE_TYPES[self._opaque_warned :], len(OPAQUE_TYPES)
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
        if self.explicit or not self._tracing_events():
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
        else:  # what this untraced step consumed: not the next traced step's
            del self._pending_losses[:], self._pending_batches[:]
            self.inputs.take()
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
            digests, norms = self._digests([grad for _, grad in with_grads], True, late=True)
            round_.grads.extend((name, value) for (name, _), value in zip(with_grads, digests))
            round_.grad_squares.extend(norms)
            param_digests, _ = self._digests([param for _, param in named], False, late=True)
            round_.params.extend((name, value) for (name, _), value in zip(named, param_digests))
            round_.rng = rng_digests()
            self._round = round_
            self._write_round()
        self._advance()

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

    def _finish_round(self) -> None:
        if not self._clock.members:
            return
        if self._tracing_this_step():
            self._write_round(replicas=True)
        self._clock.reset()
        self._round = StepRound()
        self._advance()


# [torch.Tensor] once hooks.install ran (a list read is cheaper than an import statement, cold)
tensor_type: list[type] = [type("_NoTensor", (), {})]


def _has_closure(args, kwargs) -> bool:
    # Step hooks receive the bound call's arguments: args[0] is the optimizer itself.
    return (len(args) > 1 and callable(args[1])) or (
        bool(kwargs) and callable(kwargs.get("closure"))
    )
