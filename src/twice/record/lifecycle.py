"""The recorder's process lifecycle: step numbering, the stop after `--max-steps`, resume at a
checkpoint's step, the end of the process, and a forked child's own stream.

`ProcessLifecycle` is a part of `Recorder` (record/recorder.py).
"""

from __future__ import annotations

import os
from pathlib import Path

from twice.core.steps import RoundClock
from twice.record.handsteps import HandSteps
from twice.record.openstep import StepRound
from twice.rng.seeding import capture_rng
from twice.store.layout import RunFolder
from twice.store.resumes import write_resume
from twice.store.traces import TraceWriter

__all__ = ["ProcessLifecycle"]


class ProcessLifecycle:
    """The recorder's part that numbers steps, stops, resumes, finishes and forks."""

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
        self.flush_late()  # the step before the restore, held for its device values
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

    def drop_open_step(self) -> None:
        """Forget the step in progress (its round, losses and batches)."""
        self._round, self._pending_losses, self._pending_batches = StepRound(), [], []
        self._clock.reset()
        if self._hand is not None:
            self._hand.close()

    def _advance(self) -> None:
        self.ops.stop(self.step_index)
        self.step_index += 1
        self.ops.start(self.step_index)
        if self.stop_after is not None and self.step_index >= self.stop_after and not self.stopped:
            self.stopped = True
            self.flush_late()
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
        self.flush_late()
        self._writer.close()
        self.checks.finish()

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
        self.checks = self.checks.forked()
        self._late_entry, self.late = None, self.late.forked()  # the parent's to write
        self.late.on_kill.append(self.flush_late)
        self.fork_count = 0
        self.step_index = 0

    def close_trace(self) -> None:
        """Close this process's trace file (writing the step held for its device values)."""
        self.flush_late()
        self._writer.close()
