"""What a long command is doing, on stderr: on a terminal a live display (rich) of the processes
it runs and their steps; elsewhere (a CI log, a pipe) one steady line per event, never a line
per tick.

A command opens a `Reporter` around its work; `run_command` (app/launch.py) tells the active one
when each run it starts begins and ends, and the reporter follows the run's steps by the lines
its trace gains. `-q` silences it; nothing is printed to stdout, which carries the result.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from twice.app.terminal import is_terminal, live_display, write_line
from twice.core.errors import CorruptRecord
from twice.store import reader
from twice.store.layout import RunFolder

__all__ = ["Reporter", "run_started", "run_ended", "active"]

_active: list[Reporter] = []


def active() -> Reporter | None:
    """The reporter of the command in progress, or None."""
    return _active[-1] if _active else None


def run_started(run_dir: Path, label: str | None, steps: int | None) -> None:
    """A run the command started (a re-run, a trial) began; `steps` is how many it should take."""
    reporter = active()
    if reporter is not None:
        from twice.store.runs import rerun_of

        label = label or Path(run_dir).name
        reporter.started(Path(run_dir), rerun_of(label) or label, steps)


def run_ended(run_dir: Path, code: int | None) -> None:
    """A run the command started ended with exit status `code`."""
    reporter = active()
    if reporter is not None:
        reporter.ended(Path(run_dir), code)


class Reporter:
    """The progress of one command (`twice verify`, `sweep`, `locate`, ...) on stderr."""

    def __init__(self, command: str, quiet: bool = False, stream: Any = None):
        self.command, self.quiet = command, quiet
        self.stream = stream  # stderr when None
        self.live = not quiet and is_terminal(stream)
        self._lock = threading.Lock()
        self._runs: dict[Path, dict] = {}
        self._bars: dict[str, Any] = {}
        self._display: Any = None
        self._stop = threading.Event()
        self._poller: threading.Thread | None = None

    def __enter__(self) -> Reporter:
        if self.live:
            self._display = live_display(self.stream)
            self._display.start()
            self._poller = threading.Thread(target=self._poll, daemon=True)
            self._poller.start()
        _active.append(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self in _active:
            _active.remove(self)
        self._stop.set()
        if self._poller is not None:
            self._poller.join(timeout=2)
        if self._display is not None:
            self._display.stop()

    # -- events ------------------------------------------------------------------------------
    def event(self, text: str) -> None:
        """One thing that happened, as a line (above the live display on a terminal)."""
        if self.quiet:
            return
        if self._display is not None:
            self._display.say(f"twice {self.command}: {text}")
        else:
            write_line(self.stream, f"twice {self.command}: {text}")

    def count(self, key: str, label: str, done: int, total: int | None) -> None:
        """A count of `total` things (trials, segments) reached `done`: a bar on a terminal; a
        line elsewhere only when the count changed."""
        if self.quiet:
            return
        with self._lock:
            previous = self._bars.get(key)
            if self._display is not None:
                if previous is None:
                    self._bars[key] = self._display.add_task(label, total=total, completed=done)
                else:
                    self._display.update(previous, description=label, completed=done, total=total)
                return
            if previous == (label, done):
                return
            self._bars[key] = (label, done)
        self.event(f"{label}: {done}/{total}" if total else f"{label}: {done}")

    def started(self, run_dir: Path, label: str, steps: int | None) -> None:
        """A run began (see run_started)."""
        with self._lock:
            self._runs[run_dir] = {"label": label, "steps": steps, "t0": time.monotonic()}
            if self._display is not None:
                self._runs[run_dir]["task"] = self._display.add_task(f"{label}: steps", total=steps)
        if self._display is None:
            self.event(f"{label} started" + (f" ({_steps(steps)})" if steps else ""))

    def ended(self, run_dir: Path, code: int | None) -> None:
        """A run ended (see run_ended)."""
        with self._lock:
            run = self._runs.pop(run_dir, None)
        if run is None:
            return
        steps = _trace_lines(run_dir)
        if self._display is not None and "task" in run:
            self._display.remove_task(run["task"])
        took = time.monotonic() - run["t0"]
        self.event(
            f"{run['label']} ended: {_steps(steps)} in {took:.1f} s"
            + ("" if code == 0 else f", exit {code}")
        )

    def _poll(self) -> None:
        """On a terminal: follow each live run's steps by its trace's lines, twice a second."""
        while not self._stop.wait(0.5):
            with self._lock:
                for run_dir, run in self._runs.items():
                    if "task" in run:
                        self._display.update(run["task"], completed=_trace_lines(run_dir))


def _trace_lines(run_dir: Path) -> int:
    """Whole lines in a run's main trace (its recorded steps so far)."""
    try:
        with reader.open_record(RunFolder(run_dir).trace()) as handle:
            return sum(block.count(b"\n") for block in iter(lambda: handle.read(1 << 20), b""))
    except (OSError, CorruptRecord):  # not there yet, or not a trace: the real read will say
        return 0


def _steps(count: int) -> str:
    return f"{count} step{'' if count == 1 else 's'}"
