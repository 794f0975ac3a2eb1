"""Trace files: appending step records as steps end, and reading them back validated.

A trace is `trace.jsonl` (or `trace.<stream>.jsonl`, one per process) in the run folder, one record
per line, each written with one write() call. Reading tolerates a last line cut short by a killed
process.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from twice.core.errors import CorruptRecord
from twice.core.manifest import Manifest
from twice.core.records import StepRecord, record_line
from twice.store.layout import RunFolder
from twice.store.reader import present
from twice.store.tracescan import read_lines

__all__ = ["TraceWriter", "read_trace", "trace_files"]


class TraceWriter:
    """Appends records to a JSONL file, one write() call each, so that a killed process loses at
    most one line."""

    def __init__(self, path: Path | Callable[[], Path], fsync_every: float = 5.0):
        # A callable names the trace when the first record is written: a process started by
        # spawn or forkserver knows which it is only once multiprocessing has set it up.
        self._path_of = path if callable(path) else None
        self.path = None if callable(path) else Path(path)
        self._claimed = False
        self._fd: int | None = None
        self._fsync_every = fsync_every
        self._last_sync = 0.0

    def write(self, record: StepRecord) -> None:
        """Append one record as one line, with one write() call."""
        if self._fd is None:
            self._fd = self._open()
        # Straight to the OS (no buffered file object to flush): survives the process being killed.
        data = record_line(record)
        while data:  # a regular file takes it whole, short of a full disk
            data = data[os.write(self._fd, data) :]
        if record.time is not None and record.time - self._last_sync >= self._fsync_every:
            os.fsync(self._fd)  # and on disk now and then: survives the machine
            self._last_sync = record.time

    def _open(self) -> int:
        """The trace's file, claimed by this process the first time: each process that steps
        writes a trace of its own, since two appending to one would interleave their steps. A
        name another process of the run holds already (a subprocess of the script, not started
        through multiprocessing) gets `.sub1`, `.sub2`, ... in the order the claims happen."""
        if self.path is None:
            self.path = Path(self._path_of())
        self.path.parent.mkdir(parents=True, exist_ok=True)
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT
        if self._claimed:
            return os.open(self.path, flags, 0o644)
        first = self.path
        for attempt in range(1, 10_000):
            try:
                fd = os.open(self.path, flags | os.O_EXCL, 0o644)
            except FileExistsError:
                self.path = RunFolder.claimed_trace(first, attempt)
                continue
            self._claimed = True
            return fd
        raise OSError(f"no trace name left beside {self.path}")

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


def trace_files(run_dir: Path, manifest: Manifest | None = None) -> dict[str, Path]:
    """The traces of a run by stream ("main" for trace.jsonl, else the tag of trace.<tag>.jsonl):
    the closed set its manifest lists, each present, else (a run still running, or recorded
    before the list) the files named as streams are. A listed stream that is missing is a
    CorruptRecord; a trace-like file the manifest does not list is never merged."""
    from twice.store.runs import read_manifest

    folder = RunFolder(run_dir)
    listed = (manifest if manifest is not None else read_manifest(run_dir)).streams
    if listed is None:
        return folder.traces()
    missing = [stream for stream in listed if not present(folder.trace(stream))]
    if missing:
        raise CorruptRecord(
            f"{run_dir}: the manifest lists trace stream(s) {', '.join(missing)}, but "
            f"{folder.trace(missing[0]).name} is missing",
            "the run folder is damaged or was edited; re-record the run",
        )
    return {stream: folder.trace(stream) for stream in listed}
