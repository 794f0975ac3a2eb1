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

import operator
from pathlib import Path
from typing import Any

from twice.core.digests import OPAQUE_TYPES, Digester
from twice.core.protocol import ChildSettings, parse_steps
from twice.record.guard import costed, guarded
from twice.record.handloop import HandLoopWatch
from twice.record.lifecycle import Lifecycle
from twice.record.names import process_stream
from twice.record.opcontrol import OpControl
from twice.record.openstep import OpenStep, StepRound
from twice.record.replicas import ReplicaDesync
from twice.record.rounds import OptimizerRounds
from twice.record.stepchecks import StepChecks
from twice.record.stepdata import StepData
from twice.rng.fingerprint import rng_digests
from twice.store.layout import RunFolder

__all__ = ["Recorder", "ReplicaDesync"]


def _owned(path: str, doc: str) -> property:
    """A read-only attribute of the recorder that one of its parts owns (`path`: part.name)."""
    return property(operator.attrgetter(path), doc=doc)


class Recorder:
    """Turns hook events into StepRecords written to `trace[.<stream>].jsonl` in the run folder.

    It routes the events to its parts, each an object owning its state: `life`, the lifecycle
    (numbering, the stop, resume, finish: record/lifecycle.py); `open_step`, the step in progress
    (record/openstep.py); `rounds`, an optimizer loop's steps (record/rounds.py); the hand-loop
    watch (record/handloop.py), until an optimizer steps; `data`, what a step's record holds and
    the trace it goes to (record/stepdata.py, with the checks after each step,
    record/stepchecks.py); and `ops`, the op control (record/opcontrol.py). Itself it keeps what
    the events say of the loop: whether the script marks its steps (`explicit`), the optimizer
    stepping now, the events counted, the capture's error and cost."""

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
        self.run_dir = run_dir = Path(run_dir)
        self.stream = stream
        self.explicit = False  # the script marks its steps itself (record_explicit)
        self.cost = 0.0  # seconds spent in the event handlers below
        self.capture_error: dict | None = None  # set when an error of our own stopped the capture
        self._stepping: int | None = None  # the optimizer whose step() runs (see _outermost)
        # outermost optimizer steps ended (GradScaler.step compares it: see on_skipped_step)
        self.steps_seen = 0
        self._skipping = False
        self.batches_read = 0
        self.backward_calls = 0
        self.ops = OpControl(run_dir, stream, record_ops, dump_ops)
        # Called several times a step: straight to the op control's methods, no call in between.
        self.set_phase, self._paused = self.ops.set_phase, self.ops.paused
        self.data = StepData(
            lambda: RunFolder(run_dir).trace(process_stream(stream)),
            self.ops,
            StepChecks(run_dir, replica_every, replica_mode, health),
            params_every=params_every,
            full_every=full_every,
        )
        self.open_step = OpenStep()
        self.inputs = self.open_step.inputs  # (hooks.py reads it at every module call)
        self.life = Lifecycle(
            run_dir,
            self.ops,
            self.data,
            self.open_step,
            trace_every=trace_every,
            only_steps=only_steps,
            stop_after=stop_after,
        )
        self.rounds = OptimizerRounds(self.life, self.open_step, self.data, self.ops)
        # Until an optimizer steps, steps may be hand updates (record/handsteps.py).
        self._hand: HandLoopWatch | None = HandLoopWatch(
            self.life, self.open_step, self.data, self._paused, self._hand_forward
        )

    # -- what the parts own, read where the recorder's users read it -----------------------------
    step_index = _owned("life.step_index", "Steps ended so far: the step in progress's number.")
    stop_after = _owned("life.stop_after", "The step limit (--max-steps), if any.")
    stopped = _owned("life.stopped", "Whether the step limit was reached.")
    on_stop = _owned("life.on_stop", "Called at the step limit, before the process exits.")
    rng_at_stop = _owned("life.rng_at_stop", "The RNGs as the last step before the stop ended.")
    names = _owned("data.names", "The parameters' names, per optimizer (record/names.py).")
    layouts = _owned("data.layouts", "The DTensor layouts seen (record/sharding.py).")
    checks = _owned("data.checks", "The health and replica checks after each step.")
    fork_count = property(
        operator.attrgetter("life.fork_count"),
        lambda self, count: setattr(self.life, "fork_count", count),
        doc="Forks of this process so far (hooks.py counts them; a child's stream is named so).",
    )

    @property
    def completed_steps(self) -> int:
        """Steps completed so far: 0 before the first optimizer step, 1 after it. The first round
        stays open until an optimizer steps a second time (only then is the number of optimizers
        in a round known), so an open first round with an update in it counts as done."""
        return self.life.completed_steps(self.explicit)

    def events(self) -> dict[str, int]:
        """What this process's hooks saw: batches read, backward calls, optimizer steps, and the
        steps recorded (the process record keeps them, to say why a run has no step)."""
        return {
            "batches": self.batches_read,
            "backward_calls": self.backward_calls,
            "optimizer_steps": self.steps_seen,
            "steps": self.life.step_index,
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
        life = self.life
        if life.exit_pending:  # (a check before the call: three events a step, traced or not)
            life.exit_if_stopping()
        self.batches_read += 1
        hand = self._hand
        if hand is not None and hand.steps.open:
            hand.check(False)
        self.set_phase("forward")
        if self.explicit or not life.tracing_events():
            return
        open_step = self.open_step
        with self._paused():
            open_step.add_batch(batch)
        if len(OPAQUE_TYPES) > open_step.opaque_warned:
            open_step.warn_opaque()

    @guarded
    def on_module_call(self, module, args: tuple, kwargs: dict, grad: bool = True) -> None:
        """`module` is called (`grad`: with gradients on): the outermost call's data is the
        step's batch where no DataLoader batch came (record/inputs.py)."""
        inputs = self.inputs  # an outermost call (hooks.py counts the inner ones itself)
        reading = not self.explicit and self._reading_inputs()
        if not reading or self.open_step.module_called(module, grad):
            inputs.depth += 1
            return
        with self._paused():
            inputs.enter(args, kwargs, tensor_type[0], quiet=not grad)

    def _reading_inputs(self) -> bool:
        """Whether a module call's inputs are read now: while events are traced, and while a hand
        step is still open (it ends in this call's forward hook, after this; an untraced one's
        end drops its own inputs, the next step's stay)."""
        if self.life.tracing_events():
            return True
        return self._hand is not None and self._hand.steps.open

    @guarded
    def on_backward(self, tensors: Any) -> None:
        """`backward` was called on `tensors`: a scalar one is a loss of the step in progress."""
        life = self.life
        if life.exit_pending:
            life.exit_if_stopping()
        self.backward_calls += 1
        hand = self._hand
        if hand is not None and not self.explicit and self._stepping is None:
            hand.before_backward(tensors)
        if self.explicit or not life.tracing_events():
            return
        if isinstance(tensors, tensor_type[0]) and tensors.numel() == 1:
            self.open_step.losses.append(tensors.detach())

    @guarded
    def after_backward(self) -> None:
        """A backward call ended in a loop that has no optimizer (yet): the hand-loop watch reads
        its gradients, as the update will read them (record/handloop.py)."""
        hand = self._hand
        if hand is None or self.explicit or self._stepping is not None:
            return
        if not hand.after_backward():
            self._hand = None

    @guarded
    def _hand_forward(self) -> None:
        """The first module forward after a backward: the hand step ends here if it was
        updated."""
        hand = self._hand
        if hand is not None:
            hand.forward_seen()

    @guarded
    def pre_step(self, optimizer, args, kwargs) -> None:
        """An optimizer's step() is about to run: its gradients, as the update will use them."""
        life = self.life
        if life.exit_pending:
            life.exit_if_stopping()
        if self._hand is not None:  # an optimizer loop: its steps are the optimizer's
            self._hand.stop()
            self._hand = None
        if self.explicit:
            return
        self.rounds.before_step(optimizer, args, kwargs)

    @guarded
    def post_step(self, optimizer, args, kwargs) -> None:
        """An optimizer's step() has run: its parameters and learning rates; the step may end
        here."""
        self.set_phase("forward")
        if self.explicit:
            return
        self.rounds.after_step(optimizer, args, kwargs, self._skipping)

    @costed
    def record_explicit(
        self, *, loss: Any = None, batch: Any = None, params: list[tuple[str, Any]] | None = None
    ) -> None:
        """One step from a hand-written loop: the given loss, batch and named parameters (with
        .grad)."""
        import torch

        life = self.life
        life.exit_if_stopping()
        self.explicit = True
        if self._hand is not None:
            self._hand.stop()
            self._hand = None
        if life.tracing_now():
            round_ = StepRound()
            if loss is not None:
                round_.losses.append(
                    loss.detach() if isinstance(loss, torch.Tensor) else float(loss)
                )
            if batch is not None:
                round_.batch = Digester(strict=False).update(batch)
                round_.batch_count = 1
                if len(OPAQUE_TYPES) > self.open_step.opaque_warned:
                    self.open_step.warn_opaque()
            self.data.take_named(round_, list(params or []))
            round_.rng = rng_digests()
            self.open_step.round = round_
            self.data.write(round_, life.step_index)
        life.advance()

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

    # -- the process's lifecycle (record/lifecycle.py) ---------------------------------------------
    def _count_only(self, event: str, args: tuple) -> None:
        """After the capture stopped, optimizer rounds are still counted toward a step limit."""
        self.life.count_only(event, args, self.explicit)

    def resume_at(
        self, step: int, *, keep_batches: int | None = 0, source: str | Path | None = None
    ) -> None:
        """Continue numbering at `step` (after a checkpoint restore); the open round is dropped.

        `keep_batches` keeps that many of the batches read last: a framework that fetches the
        resumed step's batches before it restores state (Lightning, the Hugging Face Trainer) has
        read them already, after any it skipped to reach the resumed position. None keeps them
        all. `source` (the checkpoint restored) is recorded in the run folder for verdicts to
        name."""
        self.life.resume_at(step, keep_batches, source)
        if self._hand is not None:
            self._hand.drop_step()

    def drop_open_step(self) -> None:
        """Forget the step in progress (its round, losses and batches)."""
        self.open_step.drop()
        if self._hand is not None:
            self._hand.drop_step()

    def finish(self) -> None:
        """Write the step still open (the last one) and close the trace."""
        life = self.life
        if not life.in_process():
            return
        hand = self._hand
        if hand is not None and hand.steps.open and not life.stopped and self.capture_error is None:
            # The last backward of a loop that updates by hand: the loop ended, so it did.
            hand.end_step()
        life.finish(write_open=not self.explicit and self.capture_error is None)

    def after_fork_in_child(self, index: int) -> None:
        # A forked process (Hogwild worker, DataLoader worker) records into a stream of its own,
        # named by fork order so that two runs name their processes alike.
        """In a forked child: record into a stream of its own (`fork<index>`), from step 0."""
        self.stream = f"{self.stream + '.' if self.stream else ''}fork{index}"
        self.data.forked(RunFolder(self.run_dir).trace(self.stream))
        self.ops.forked(self.stream)
        self.open_step.forked()
        if self._hand is not None:
            self._hand.forked()
        self.life.forked()

    def close_trace(self) -> None:
        """Close this process's trace file (writing the step held for its device values)."""
        self.data.close()


# [torch.Tensor] once hooks.install ran (a list read is cheaper than an import statement, cold)
tensor_type: list[type] = [type("_NoTensor", (), {})]
