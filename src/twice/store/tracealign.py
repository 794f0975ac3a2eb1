"""Lining up two traces whose step numbers do not correspond: a script that resumed itself.

A script that checkpoints with its own `torch.save` and resumes through its own flag starts its
trace again at step 0. Every trace records the parameters before its first update
(`params_before` of its first record), so where that state occurs in the other run (the
parameters after some step k) says where the resumed run starts: at step k + 1. From there the
records are compared step against step, the resumed run's renumbered into the other's steps.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from twice.core.records import StepRecord
from twice.store.tracescan import PairScan, TraceLines

__all__ = ["Alignment", "content_alignment", "find_params", "first_record", "scan_offset"]


@dataclass(frozen=True)
class Alignment:
    """Run B's step 0 is run A's step `offset` (negative: A's step 0 is B's step -offset)."""

    offset: int
    by_content: bool  # found from the parameters, not given by hand (`twice diff --offset`)

    def phrase(self) -> str:
        """In words: "B starts at A's step 50 (parameters identical)"."""
        later, earlier, at = (
            ("B", "A", self.offset) if self.offset > 0 else ("A", "B", -self.offset)
        )
        how = " (parameters identical)" if self.by_content else " (--offset)"
        return f"{later} starts at {earlier}'s step {at}{how}"


def first_record(path: Path) -> StepRecord | None:
    """The trace's first record, or None when it has none."""
    lines = TraceLines(Path(path))
    try:
        return lines.record() if lines.line() is not None else None
    finally:
        lines.close()


def find_params(path: Path, params: str) -> int | None:
    """The step of the first record of the trace whose parameters (after the step) are `params`,
    or None."""
    lines = TraceLines(Path(path))
    needle = f'"params":"{params}"'.encode()
    try:
        while True:
            line = lines.line()
            if line is None:
                return None
            if needle in line:
                record = lines.record()
                if record.params == params:
                    return record.step
                continue
            lines.skip()
    finally:
        lines.close()


def content_alignment(trace_a: Path, trace_b: Path) -> Alignment | None:
    """Where the run that started later (its trace begins at step 0 from a state that is not the
    other's starting state) starts in the other: None when both start alike, or when neither's
    starting parameters occur in the other."""
    a, b = first_record(trace_a), first_record(trace_b)
    if a is None or b is None or a.step != 0 or b.step != 0:
        return None
    if a.params_before is None or b.params_before is None or a.params_before == b.params_before:
        return None
    step = find_params(trace_a, b.params_before)
    if step is not None:
        return Alignment(step + 1, True)
    step = find_params(trace_b, a.params_before)
    if step is not None:
        return Alignment(-(step + 1), True)
    return None


def scan_offset(path_a: Path, path_b: Path, offset: int, steps: int | None = None) -> PairScan:
    """Compare A's step s + offset with B's step s (negative offset: A's s with B's s - offset),
    the later-starting run's records renumbered into the other's steps; `steps` limits in those
    steps."""
    a, b = TraceLines(Path(path_a)), TraceLines(Path(path_b))
    shift_a, shift_b = (0, offset) if offset >= 0 else (-offset, 0)
    scan = PairScan(resumed=True)
    limit = float("inf") if steps is None else steps
    pending: list[StepRecord | None] = [None, None]
    try:
        while True:
            for side, (lines, shift) in enumerate(((a, shift_a), (b, shift_b))):
                if pending[side] is None and lines.line() is not None:
                    record = lines.record()
                    pending[side] = replace(record, step=record.step + shift) if shift else record
            record_a, record_b = pending
            if record_a is not None and record_a.step >= limit:
                record_a = pending[0] = None
            if record_b is not None and record_b.step >= limit:
                record_b = pending[1] = None
            if record_a is None and record_b is None:
                return scan
            if record_b is None or (record_a is not None and record_a.step < record_b.step):
                pending[0] = None
                if record_a.step >= shift_b:  # before B started: not a step B could have
                    scan.add_one(0, record_a.step)
                continue
            if record_a is None or record_b.step < record_a.step:
                pending[1] = None
                if record_b.step >= shift_a:  # before A started: not a step A could have
                    scan.add_one(1, record_b.step)
                continue
            pending[0] = pending[1] = None
            scan.add_pair(record_a, record_b)
    finally:
        a.close()
        b.close()
