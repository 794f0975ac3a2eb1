"""The recorder's process lifecycle: step numbering and which steps are traced, the stop after
`--max-steps`, resume at a checkpoint's step, the end of the process, and a forked child's fresh
numbering.

`Lifecycle` is a part of `Recorder` (record/recorder.py): it owns the step index and the stop, and
is given the op control (started and stopped at each step's edges), the step data (its trace
closed at the stop and the end) and the open step (reset at a resume, written at the end).
"""

from __future__ import annotations

import os
from pathlib import Path

from twice.record.opcontrol import OpControl
from twice.record.openstep import OpenStep
from twice.record.stepdata import StepData
from twice.rng.seeding import capture_rng
from twice.store.resumes import write_resume

__all__ = ["Lifecycle"]


class Lifecycle:
    """Numbers a process's steps, chooses the traced ones, stops, resumes and finishes."""

    def __init__(
        self,
        run_dir: Path,
        ops: OpControl,
        data: StepData,
        open_step: OpenStep,
        *,
        trace_every: int = 1,
        only_steps: set[int] | None = None,
        stop_after: int | None = None,
    ):
        """Steps of the run in `run_dir`, every `trace_every`-th traced (only `only_steps`, when
        given: bisection's replays); the process stops after `stop_after` steps."""
        self.run_dir = run_dir
        self.trace_every = max(1, int(trace_every))
        self.only_steps = only_steps
        self.stop_after = stop_after
        self.step_index = 0
        self.stopped = False
        self.exit_pending = False  # stopped: the process leaves at the next event
        self.pid = os.getpid()  # the process whose steps these are
        self.fork_count = 0
        self.on_stop: list = []  # called when stop_after is reached, before the process exits
        self.rng_at_stop: dict | None = None
        self._ops, self._data, self._open = ops, data, open_step

    def traced(self, step: int) -> bool:
        """Whether step `step` is recorded."""
        if self.only_steps is not None:
            return step in self.only_steps
        return step % self.trace_every == 0

    def tracing_now(self) -> bool:
        """Whether the step in progress is recorded."""
        return self.traced(self.step_index)

    def tracing_events(self) -> bool:
        """Whether a batch, loss or module input arriving now is kept: this step's, or, once an
        optimizer stepped in this round, maybe the next step's (a round is known to have ended
        only when an optimizer steps again). What an untraced round consumed is dropped at its
        end, so a traced step holds its own, whatever --trace-every."""
        return self.traced(self.step_index) or (
            bool(self._open.clock.members) and self.traced(self.step_index + 1)
        )

    def completed_steps(self, explicit: bool) -> int:
        """Steps completed so far (see Recorder.completed_steps); `explicit`: the script marks its
        steps itself."""
        clock = self._open.clock
        first_round_open = clock.size is None and bool(clock.members)
        return self.step_index + (1 if first_round_open and not explicit else 0)

    def in_process(self) -> bool:
        """Whether this is the process the steps are numbered for (not a forked child of it that
        has not renumbered)."""
        return os.getpid() == self.pid

    def advance(self) -> None:
        """A step ended: number the next; stop the capture after `stop_after` steps."""
        self._ops.stop(self.step_index)
        self.step_index += 1
        self._ops.start(self.step_index)
        if self.stop_after is not None and self.step_index >= self.stop_after and not self.stopped:
            self.stopped = True
            self._data.close()
            # Leave at the next event (the next batch, backward or step), not inside this step:
            # the loop finishes its bookkeeping first (scheduler.step(), its own checkpoint). The
            # RNGs are taken now, as the step ends: before the next event the loop may already
            # have drawn from them (input noise, dropout, a new epoch's DataLoader iterator).
            self.rng_at_stop = capture_rng()
            self.exit_pending = True

    def exit_if_stopping(self) -> None:
        """Leave the process if the stop is pending (after the `on_stop` callbacks)."""
        if self.exit_pending and os.getpid() == self.pid:
            self.exit_pending = False
            for callback in self.on_stop:
                callback()  # twice.Run checkpoints here: between two steps
            # Through normal interpreter exit, so that atexit handlers record the process.
            raise SystemExit(0)

    def count_only(self, event: str, args: tuple, explicit: bool) -> None:
        """After the capture stopped nothing is recorded, but with a step limit (--max-steps, the
        re-run of `verify --steps`, verify-resume's interrupted run) optimizer rounds are still
        counted, so that the run still ends where it was asked to rather than training on."""
        if self.stop_after is None or explicit or os.getpid() != self.pid:
            return
        self.exit_if_stopping()
        clock = self._open.clock
        if event == "pre_step":
            ended = clock.closes(id(args[0]))
        elif event == "post_step":
            ended = clock.add(id(args[0]))
        else:
            return
        if ended:
            self._open.end_round()
            self.advance()

    def resume_at(self, step: int, keep_batches: int | None, source: str | Path | None) -> None:
        """Continue numbering at `step` (see Recorder.resume_at)."""
        self._data.flush_late()  # the step before the restore, held for its device values
        if source is not None:
            write_resume(self.run_dir, source, step)
        self.step_index = step
        self._open.resume(keep_batches)

    def finish(self, write_open: bool) -> None:
        """The process ends: write the round still open (with `write_open`, unless stopped) and
        close the op log and the trace."""
        self._ops.stop(self.step_index)
        self._ops.close()
        open_step = self._open
        if write_open and open_step.clock.members and not self.stopped:
            if self.tracing_now():
                self._data.write(open_step.round, self.step_index)
            open_step.end_round()
        self._data.finish()

    def forked(self) -> None:
        """In a forked child: its steps, numbered from 0."""
        self.pid = os.getpid()
        self.fork_count = 0
        self.step_index = 0
