"""Two traces compared as they stream from disk: bytes first, records only where bytes differ.

A million-step trace is ~400 MB; parsing and validating every line of two of them took 48 s and
3.6 GB. Two runs that agree write the same bytes for every step except the line's `time`, so both
files are read in blocks and walked line by line in step (`same_lines`: twice._native's loop, or
the same walk in Python): while a pair of lines is equal apart from its time and each ends with
the canonical `"step":N` above the last step, it is counted as one common, equal step. The first
line that is not so is parsed into a validated StepRecord, as a full read would (with its error,
if it is damaged), and compared field by field; the walk then goes on. Memory stays at a few
blocks whatever the trace's length (the tests hold the result to a full parse's).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from twice.core.errors import CorruptRecord
from twice.core.records import StepRecord, differing_fields, record_line
from twice.store.reader import open_record, parse

__all__ = [
    "read_lines",
    "PairScan",
    "scan_pair",
    "same_lines",
    "take_equal",
    "TraceLines",
    "line_step",
]

BLOCK = 1 << 23
MAX_LINE = 64 << 20  # a step record is ~1 KB per hundred tensors; a longer line is damage
NO_LIMIT = 2**63 - 1
_HINT = "the trace is damaged or was edited; re-record the run"
_NUMBER = frozenset(b"0123456789.-+eE")
_DIGITS = frozenset(b"0123456789")


@dataclass
class PairScan:
    """What a scan of one stream of two runs found."""

    counts: list[int] = field(default_factory=lambda: [0, 0])  # records within the limits
    common: int = 0  # steps recorded in both
    same_before: int = 0  # common steps with equal compared fields before the first difference
    first: tuple[StepRecord, StepRecord] | None = None  # the records at the first difference
    only: tuple[int, int] | None = None  # (side 0 or 1, step): the first step one run lacks
    resumed: bool = False  # one run's trace starts later (a resume): see differing_fields
    last_same: int = -1  # the last common step, before the first difference, found equal
    # fields compared only where both records hold them (records.differing_fields)
    partial: frozenset[str] = frozenset()
    # each run's --trace-every: a step the other run was not due to record is no difference
    every: tuple[int, int] = (1, 1)

    def add_one(self, side: int, step: int) -> None:
        """Count one step recorded on one side only."""
        self.counts[side] += 1
        if self.only is None and step % self.every[1 - side] == 0:
            self.only = (side, step)

    def add_pair(self, record_a: StepRecord, record_b: StepRecord) -> None:
        """Count one step recorded in both runs, comparing it while no difference was found."""
        self.counts[0] += 1
        self.counts[1] += 1
        self.common += 1
        if self.first is None:
            if differing_fields(record_a, record_b, self.resumed, self.partial):
                self.first = (record_a, record_b)
            else:
                self.same_before += 1
                self.last_same = record_a.step


_TAIL = re.compile(rb'(,"time":(0|[1-9][0-9]{0,19})(\.[0-9]{1,20})?([eE][+-]?[0-9]{1,2})?)?}\n')


def record_valid(line: bytes, body: int) -> bool:
    """Whether `line` (with its newline; its body ends at `body`) is the canonical line of a valid
    record: csrc/records.c's record_valid, in Python. params_before (once per trace) is left to
    the reader; so is anything not ASCII or escaped."""
    if not line.isascii() or b"\\" in line or _TAIL.fullmatch(line, body) is None:
        return False
    try:
        record = StepRecord.from_json(parse(line))
    except ValueError:
        return False
    if record.params_before is not None:
        return False
    canonical = record_line(record)
    found = line_step(canonical)
    return found is not None and canonical[: found[0]] == line[:body]


def line_step(line: bytes) -> tuple[int, int] | None:
    """(where the line's body ends, its step) for a line ending in `"step":N}` or
    `"step":N,"time":T}` plus its newline, else None (native.c's line_body)."""
    close = len(line) - 2
    if close <= 0 or line[close] != 0x7D or line[0] != 0x7B:
        return None
    p = close
    while p > 0 and line[p - 1] in _NUMBER:
        p -= 1
    body = p - 8 if p >= 8 and line[p - 8 : p] == b',"time":' else close
    q = body
    while q > 0 and line[q - 1] in _DIGITS:
        q -= 1
    if q == body or body - q > 19 or q < 7 or line[q - 7 : q] != b'"step":':
        return None
    if body - q > 1 and line[q] == 0x30:
        return None
    step = int(line[q:body])
    return (body, step) if step < 2**63 else None


def _same_lines_py(a: bytes, b: bytes, at_a: int, at_b: int, last_a: int, last_b: int, limit: int):
    last, lines = max(last_a, last_b), 0
    while True:
        end_a, end_b = a.find(b"\n", at_a), b.find(b"\n", at_b)
        if end_a < 0 or end_b < 0:
            break
        line_a, line_b = a[at_a : end_a + 1], b[at_b : end_b + 1]
        found_a, found_b = line_step(line_a), line_step(line_b)
        if found_a is None or found_b is None or found_a[1] != found_b[1]:
            break
        (body, step), (body_b, _) = found_a, found_b
        if step <= last or step >= limit or line_a[:body] != line_b[:body_b]:
            break
        if not record_valid(line_a, body) or _TAIL.fullmatch(line_b, body_b) is None:
            break
        last, lines, at_a, at_b = step, lines + 1, end_a + 1, end_b + 1
    return lines, at_a, at_b, last


def same_lines(a, b, at_a: int, at_b: int, last_a: int, last_b: int, limit: int = NO_LIMIT):
    """(lines, new position in a, in b, last step): the pairs of lines from the positions on that
    are equal apart from their times, in canonical form, with steps above both last steps and
    below `limit`."""
    from twice.core import digests

    native = digests.native
    if native is not None and hasattr(native, "same_lines"):
        return native.same_lines(a, b, at_a, at_b, last_a, last_b, limit)
    return _same_lines_py(bytes(a), bytes(b), at_a, at_b, last_a, last_b, limit)


try:  # a canonical line, already validated, is parsed by orjson (a dependency) where it loads
    from orjson import loads as _loads
except ImportError:
    _loads = parse


def _canonical(line: bytes | None) -> bool:
    """Whether the compiled module (where built) holds `line` a canonical, valid record."""
    from twice.core import digests

    return line is not None and digests.native is not None and digests.native.record_valid(line)


class TraceLines:
    """A trace read in blocks: `buffer[pos:end]` holds the whole lines not yet taken (a line in
    progress follows them); `number` is the line number at `pos`."""

    def __init__(self, path: Path):
        self.path = path
        self.buffer = b""
        self.pos = 0
        self.number = 1
        self.last_step = -1
        self.floor = 0  # a step below it contradicts the run's resume record (resumed.json)
        self._file = None
        self.end = 0  # the buffer's whole lines end here
        self._eof = False
        try:
            self._file = open_record(path)
        except FileNotFoundError:
            self._eof = True

    def fill(self) -> bool:
        """Read one more block into the buffer; False at the end of the file."""
        if self._eof:
            return False
        try:
            data = self._file.read(BLOCK)
        except OSError as exc:
            raise CorruptRecord(f"cannot read trace {self.path}: {exc}", _HINT) from None
        if not data:
            self._eof = True  # a last line without its newline was cut short by a kill: dropped
            return False
        if len(self.buffer) - self.pos > MAX_LINE and b"\n" not in data:
            raise CorruptRecord(
                f"trace {self.path} line {self.number} is longer than {MAX_LINE >> 20} MiB, far "
                "more than a step record holds",
                _HINT,
            )
        self.buffer = self.buffer[self.pos :] + data  # whole lines, then a line in progress
        self.pos = 0
        self.end = self.buffer.rfind(b"\n") + 1
        return True

    def close(self) -> None:
        """Close the file."""
        if self._file is not None:
            self._file.close()

    def line(self) -> bytes | None:
        """The next whole line (without taking it), reading more as needed."""
        while True:
            end = self.buffer.find(b"\n", self.pos, self.end)
            if end >= 0:
                return self.buffer[self.pos : end + 1]
            if not self.fill():
                return None

    def step(self) -> int | None:
        """The next line's step: from its canonical tail, else from its parsed record."""
        line = self.line()
        if line is None:
            return None
        found = line_step(line)
        return found[1] if found is not None else self.record(peek=True).step

    def skip(self) -> None:
        """Take the next line without building its record: validated all the same (a skipped
        prefix of a resumed run is still read as a trace: `{not JSON,"step":0}` is damage),
        by the compiled validator where it is built, else parsed."""
        line = self.line()
        found = line_step(line)
        if (
            found is None
            or found[1] <= self.last_step
            or found[1] < self.floor
            or not _canonical(line)
        ):
            self.record()  # parsed and validated: the error a full read gives, or the record
            return
        self.pos += len(line)
        self.number += 1
        self.last_step = found[1]

    def record(self, peek: bool = False) -> StepRecord:
        """The next line as a validated StepRecord (taken, unless `peek`)."""
        line = self.line()
        try:
            if _canonical(line):  # the compiled validator's language is from_json's (a test)
                record = StepRecord(**_loads(line))
            else:
                record = StepRecord.from_json(parse(line))
        except (ValueError, RecursionError) as exc:
            problem = "nested too deeply" if isinstance(exc, RecursionError) else exc
            raise CorruptRecord(
                f"trace {self.path} line {self.number} is not a step record: {problem}", _HINT
            ) from None
        if record.params_before is not None and self.number != 1:
            raise CorruptRecord(
                f"trace {self.path} line {self.number}: params_before on a record that is not "
                "the trace's first; a process records it once, before its first update",
                _HINT,
            )
        if record.step < self.floor:
            raise CorruptRecord(
                f"trace {self.path} line {self.number}: step {record.step} is before step "
                f"{self.floor}, where the run's resume record (resumed.json) says it resumed",
                "the run folder was edited, or resumed.json belongs to another run; re-record "
                "the run",
            )
        if record.step <= self.last_step:
            raise CorruptRecord(
                f"trace {self.path} line {self.number}: step {record.step} follows step "
                f"{self.last_step}; a trace's steps must strictly increase",
                "the trace was edited, or several processes wrote to one trace; re-record the "
                "run (each process writes a trace of its own)",
            )
        if not peek:
            self.pos += len(line)
            self.number += 1
            self.last_step = record.step
        return record


def read_lines(path: Path) -> list[StepRecord]:
    """Every record of a trace, each validated as the comparison validates it (the one reader of
    a trace: store.traces.read_trace is this)."""
    lines = TraceLines(Path(path))
    try:
        records = []
        while lines.line() is not None:
            records.append(lines.record())
        return records
    finally:
        lines.close()


def take_equal(a: TraceLines, b: TraceLines, limit: int = NO_LIMIT) -> int:
    """Take the lines of `a` and `b` that are equal apart from their times (see same_lines), up to
    `limit`; returns how many pairs were taken."""
    if a.line() is None or b.line() is None:
        return 0
    lines, a.pos, b.pos, last = same_lines(
        memoryview(a.buffer)[: a.end],
        memoryview(b.buffer)[: b.end],
        a.pos,
        b.pos,
        a.last_step,
        b.last_step,
        limit,
    )
    if lines:
        a.number += lines
        b.number += lines
        a.last_step = b.last_step = last
    return lines


def scan_pair(
    path_a: Path,
    path_b: Path,
    steps: int | None = None,
    start: int = 0,
    resumed_at: tuple[int, int] = (0, 0),
    partial: frozenset[str] = frozenset(),
    every: tuple[int, int] = (1, 1),
) -> PairScan:
    """Compare two traces of one stream over steps [start, steps): counts, common steps, the
    records at the first step whose compared fields differ, and the first step only one holds
    (that the other was due to record, by its --trace-every `every`). `resumed_at`: where each
    run resumed; a run's trace holding a step before it is damaged. `partial`: see PairScan."""
    a, b = TraceLines(Path(path_a)), TraceLines(Path(path_b))
    a.floor, b.floor = resumed_at
    scan = PairScan(resumed=any(resumed_at), partial=partial, every=every)
    limit = NO_LIMIT if steps is None else steps
    try:
        while True:
            if a.last_step + 1 >= start:
                lines = take_equal(a, b, limit)
                if lines:
                    scan.counts[0] += lines
                    scan.counts[1] += lines
                    scan.common += lines
                    if scan.first is None:
                        scan.same_before += lines
                        scan.last_same = a.last_step
                    continue
            step_a, step_b = a.step(), b.step()
            step_a = None if step_a is None or step_a >= limit else step_a
            step_b = None if step_b is None or step_b >= limit else step_b
            if step_a is None and step_b is None:
                return scan
            if step_b is None or (step_a is not None and step_a < step_b):
                _take(a, step_a, start, scan, 0)
            elif step_a is None or step_b < step_a:
                _take(b, step_b, start, scan, 1)
            elif step_a < start:
                a.skip()
                b.skip()
            else:
                scan.add_pair(a.record(), b.record())
    finally:
        a.close()
        b.close()


def _take(lines: TraceLines, step: int, start: int, scan: PairScan, side: int) -> None:
    """Take one line recorded on one side only: parsed and counted from the start on."""
    if step < start:
        lines.skip()
    else:
        lines.record()
        scan.add_one(side, step)
