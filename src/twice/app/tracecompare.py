"""Two runs' traces compared stream by stream: how their steps line up, where each stream first
diverges, the steps one run recorded alone, and their whole-tensor digests."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from twice.app.recordings import Recorded
from twice.core.divergence import Divergence, first_divergence
from twice.core.manifest import Manifest
from twice.store.layout import RunFolder
from twice.store.tracealign import Alignment, content_alignment, scan_offset
from twice.store.tracescan import scan_pair
from twice.store.traceseries import compare_whole_tensors

__all__ = ["StreamsCompared", "align_streams", "compare_streams", "compare_whole"]


@dataclass
class StreamsCompared:
    """What comparing two runs' traces, stream by stream, found."""

    divergences: list[Divergence] = field(default_factory=list)
    """Each diverging stream's first divergence."""
    skipped: dict[str, tuple[set[int], set[int]]] = field(default_factory=dict)
    """Per diverging stream: the steps whose update GradScaler skipped, in A and in B."""
    lengths: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Per stream: how many steps A and B recorded."""
    one_sided: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Per stream: (side, step) of a step one run recorded and the other lacks."""
    compared: int = 0
    """How many steps were compared, all streams together."""

    @property
    def first(self) -> Divergence | None:
        """The earliest divergence of all streams (the main stream's at a tie), or None."""
        return (
            min(self.divergences, key=lambda d: (d.step, d.stream != "main", d.stream))
            if self.divergences
            else None
        )


def align_streams(
    traces_a: dict, traces_b: dict, offset: int | None, resumed: bool
) -> Alignment | None:
    """How the steps of A and B correspond: as given (`--offset`), or, when neither resumed
    through twice, by content (a script that resumed itself), else None (by number). By content
    in every stream both runs recorded (each rank of a torchrun job that resumed itself, DCP
    included): only an offset every one of them finds, the same, lines the runs up."""
    if offset is not None:
        return Alignment(offset, False)
    common = sorted(set(traces_a) & set(traces_b))
    if resumed or not common:
        return None
    found = {content_alignment(traces_a[stream], traces_b[stream]) for stream in common}
    return found.pop() if len(found) == 1 else None


def compare_streams(
    a: Path,
    traces: tuple[dict, dict],
    alignment: Alignment | None,
    recording: Recorded,
    start: int,
    resumed_at: tuple[int, int],
) -> StreamsCompared:
    """Scan every stream either run recorded (A's folder `a`; `traces`: each run's stream ->
    trace file), lined up by `alignment`, or else by number from step `start` (each run's resume
    step `resumed_at`), within what `recording` says both recorded."""
    traces_a, traces_b = traces
    steps, partial = recording.steps, recording.partial
    found = StreamsCompared()
    for stream in sorted(set(traces_a) | set(traces_b)):
        missing = RunFolder(a).path / "no-such-trace"
        path_a, path_b = traces_a.get(stream, missing), traces_b.get(stream, missing)
        scan = (
            scan_offset(path_a, path_b, alignment.offset, steps)
            if alignment is not None
            else scan_pair(path_a, path_b, steps, start, resumed_at, partial, recording.every)
        )
        found.lengths[stream] = tuple(scan.counts)
        if scan.only is not None:
            found.one_sided[stream] = scan.only
        if scan.first is not None:
            record_a, record_b = scan.first
            first = first_divergence([record_a], [record_b], stream, scan.resumed, partial)
            # the state before the step is known equal: the step before it compared equal, or
            # its starting parameters (params_before, first in causal order: step 0's, a resumed
            # run's first step's) were recorded in both and equal
            start_known = (
                first.step > 0 and scan.last_same == first.step - 1
            ) or "params_before" in first.recorded
            found.divergences.append(
                replace(first, identical_before=scan.same_before, start_known=start_known)
            )
            found.skipped[stream] = (
                {record_a.step} if record_a.skipped else set(),
                {record_b.step} if record_b.skipped else set(),
            )
        found.compared += scan.common
    return found


def compare_whole(a: Manifest, b: Manifest, traces_a: dict, traces_b: dict) -> dict | None:
    """Where both runs recorded whole-tensor digests (--full-every): how they compare, each run's
    first process (its main stream, or its lowest rank: every rank records the same whole
    tensors), whatever the world sizes."""

    def first(traces: dict) -> Path | None:
        if "main" in traces:
            return traces["main"]
        ranks = sorted((int(s[4:]), s) for s in traces if s.startswith("rank") and s[4:].isdigit())
        return traces[ranks[0][1]] if ranks else None

    if not (a.full_every and b.full_every):
        return None
    path_a, path_b = first(traces_a), first(traces_b)
    return None if path_a is None or path_b is None else compare_whole_tensors(path_a, path_b)
