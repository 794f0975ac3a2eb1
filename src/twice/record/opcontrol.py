"""The dispatch modes that watch the user's operations during a step, and keeping twice's own work
out.

Two modes can watch: the op recorder of a step chosen with `--record-ops` (its log goes to ops/),
and the numerics watch (`--numerics`). Both need the phase of the step (forward, backward, the
user's code between backward and the update, the optimizer) and neither may see twice's own
digests and norms. `set_phase` runs five times a step, mostly with no mode watching: it builds
nothing then.

The numerics watch (record/numerics.py) sits above the recorder (it asks the recorder in force
for its run folder and step), so it tells this module when it starts and stops
(`set_numerics_watch`) rather than being looked up here.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

__all__ = ["OpControl", "numerics_watch", "set_numerics_watch"]

_NOT_PAUSED = contextlib.nullcontext()  # what paused() gives when no mode watches (reusable)
_numerics: list[Any] = [None]  # the numerics watch in force, set by record/numerics.py


def numerics_watch():
    """The numerics watch in force in this process, if any."""
    return _numerics[0]


def set_numerics_watch(watch: Any) -> None:
    """Record the numerics watch now in force (None: none), for the modes of every step."""
    _numerics[0] = watch


class OpControl:
    """The op recorder of the step being recorded (if chosen) and the numerics watch, for one
    process."""

    def __init__(
        self,
        run_dir: Path,
        stream: str | None,
        record_ops: Any = None,
        dump_ops: dict[int, int] | None = None,
    ):
        self.run_dir = Path(run_dir)
        self.stream = stream
        self.record_ops: set[int] = set(record_ops or ())
        self.dump_ops: dict[int, int] = dict(dump_ops or {})
        self.current = None  # the OpRecorder of the step being recorded, if any
        self._log = None  # where recorded steps go: ops/ops[.<stream>].jsonl, opened on first use
        self.pid = os.getpid()

    def start(self, step: int) -> None:
        """Start recording `step`'s operations if it was chosen (and none is being recorded)."""
        if step in self.record_ops and self.current is None and os.getpid() == self.pid:
            from twice.record.oplog import OpRecorder

            self.current = OpRecorder(step, dump_index=self.dump_ops.get(step))
            self.current.__enter__()

    def stop(self, step_index: int) -> None:
        """Once the recorded step has ended (`step_index` is past it), write its log."""
        if self.current is not None and self.current.step <= step_index:
            ops, self.current = self.current, None
            ops.__exit__(None, None, None)
            ops.close()
            if self._log is None:
                from twice.record.oplog import OpLog

                self._log = OpLog(self.run_dir, self.stream)
            ops.write(self._log)

    def close(self) -> None:
        """Close the op log file, if one was opened."""
        if self._log is not None:
            self._log.close()

    def forked(self, stream: str) -> None:
        """In a forked child: its own stream; the parent's log handle is the parent's."""
        self.stream, self._log, self.pid = stream, None, os.getpid()

    def modes(self) -> list:
        """The dispatch modes watching the user's ops: the op log of this step, the numerics
        watch."""
        watch = numerics_watch()
        if self.current is None:
            return [watch] if watch is not None else []
        return [self.current, watch] if watch is not None else [self.current]

    def paused(self):
        """Our own tensor work (digests, norms) is not part of the user's step: keep it out of op
        logs."""
        modes = self.modes()
        if not modes:
            return _NOT_PAUSED

        @contextlib.contextmanager
        def paused():
            for mode in modes:
                mode.paused = True
            try:
                yield
            finally:
                for mode in modes:
                    mode.paused = False

        return paused()

    def set_phase(self, phase: str, step_line_shared: bool = False) -> None:
        """Tell the watching modes which part of the step runs now."""
        if self.current is None:  # five times a step, mostly with no mode watching: no list built
            watch = numerics_watch()
            if watch is not None:
                watch.set_phase(phase, step_line_shared)
            return
        for mode in self.modes():
            mode.set_phase(phase, step_line_shared)
