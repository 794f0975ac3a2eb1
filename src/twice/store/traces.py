"""Trace files: appending step records as steps end, and reading them back validated.

A trace is `trace.jsonl` (or `trace.<stream>.jsonl`, one per process) in the run folder, one record
per line, each written with one write() call. Reading tolerates a last line cut short by a killed
process.
"""

from __future__ import annotations

import os
from pathlib import Path

from twice.core.records import StepRecord, record_line
from twice.store.layout import RunFolder
from twice.store.tracescan import read_lines

__all__ = ["TraceWriter", "read_trace", "trace_files"]


class TraceWriter:
    """Appends records to a JSONL file, one write() call each, so that a killed process loses at
    most one line."""

    def __init__(self, path: Path, fsync_every: float = 5.0):
        self.path = Path(path)
        self._fd: int | None = None
        self._fsync_every = fsync_every
        self._last_sync = 0.0

    def write(self, record: StepRecord) -> None:
        """Append one record as one line, with one write() call."""
        if self._fd is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        # Straight to the OS (no buffered file object to flush): survives the process being killed.
        data = record_line(record)
        while data:  # a regular file takes it whole, short of a full disk
            data = data[os.write(self._fd, data) :]
        if record.time is not None and record.time - self._last_sync >= self._fsync_every:
            os.fsync(self._fd)  # and on disk now and then: survives the machine
            self._last_sync = record.time

    def close(self) -> None:
        """Flush the trace to disk and close it."""
        if self._fd is not None:
            try:
                os.fsync(self._fd)
            finally:
                os.close(self._fd)
                self._fd = None


def read_trace(path: Path) -> list[StepRecord]:
    """Read a trace; a last line without its newline (a kill mid-write) is dropped, any other
    damage is an error (store.tracescan's reader: one reader for every trace)."""
    return read_lines(Path(path))


def trace_files(run_dir: Path) -> dict[str, Path]:
    """The traces of a run by stream: "main" for trace.jsonl, else the tag of trace.<tag>.jsonl."""
    return RunFolder(run_dir).traces()
