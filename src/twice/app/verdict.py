"""A comparison's verdict, in words: what differs first, or why nothing can be judged, and the
notes after it (where the runs were lined up, resumed, or stopped recording)."""

from __future__ import annotations

from pathlib import Path

from twice.app.tracecompare import StreamsCompared
from twice.core.divergence import Divergence, divergence_phrase, loss_gap
from twice.core.manifest import Difference, Manifest
from twice.store.faults import read_capture_error
from twice.store.tracealign import Alignment

__all__ = ["phrase_verdict", "verdict_notes"]


def _events_phrase(manifest: Manifest) -> str:
    events = manifest.events
    if events is None:
        return "no process was recorded"
    return (
        f"{events.get('batches', 0)} DataLoader batches read, "
        f"{events.get('backward_calls', 0)} backward calls, "
        f"{events.get('optimizer_steps', 0)} optimizer steps"
    )


def _unjudged(
    manifest_a: Manifest, manifest_b: Manifest, empty: list[str], diffs: list[Difference]
) -> tuple[str, str]:
    """The verdict and explanation when no step was recorded in run(s) `empty`: what the hooks
    saw, how steps are found, and what was compared instead."""
    who = " and ".join(empty)
    verdict = f"cannot judge: no training step was recognised in {who}"
    seen = "; ".join(
        f"{label}: {_events_phrase(manifest)}"
        for label, manifest in (("A", manifest_a), ("B", manifest_b))
    )
    explanation = (
        f"the hooks saw {seen}. twice ends a step at an optimizer's step() or, in a loop without "
        "one, when the tensors a backward produced gradients for are updated; mark the steps of "
        "any other loop with twice.Run.step. Compared instead: the manifests ("
        + (f"{len(diffs)} differences, listed below" if diffs else "identical")
        + ")"
    )
    return verdict, explanation


def _one_sided_phrase(
    one_sided: dict[str, tuple[int, int]],
    lengths: dict[str, tuple[int, int]],
    statuses: tuple[str, str],
) -> str:
    """The first step one run recorded and the other did not, in words."""
    stream, (side, step) = min(one_sided.items(), key=lambda item: (item[1][1], item[0]))
    has, lacks = ("A", "B") if side == 0 else ("B", "A")
    where = "" if stream == "main" else f" in {stream}"
    na, nb = lengths[stream]
    return (
        f"step {step}{where} was recorded in {has} only ({na} vs {nb} steps recorded; "
        f"{lacks} is {statuses[1 - side]})"
    )


def _before(first: Divergence) -> str:
    """What the verdict says of the steps before the first divergence: bit-identical, or only
    those recorded where the step before it was not compared (--trace-every, a partial trace)."""
    if first.start_known or first.step == 0:
        return "steps before it bit-identical"
    return (
        f"the recorded steps before it bit-identical, but step {first.step - 1} was not "
        "compared: the runs may have parted there"
    )


def _divergence_verdict(
    first: Divergence, skipped: tuple[set[int], set[int]], also: list[str]
) -> str:
    """The verdict when a step diverges: where and in what, how far the loss moved, and whether
    GradScaler skipped the update in one run only (`skipped`: its skipped steps in A and B)."""
    verdict = f"runs differ: {divergence_phrase(first)}; " + _before(first)
    if also:
        verdict += "; also, " + "; ".join(also)
    if "loss" in first.fields:
        gap = loss_gap(first.loss_a, first.loss_b)
        if gap.get("abs") is not None:
            verdict += f"; loss differs by {gap['abs']:.3g}" + (
                f" ({gap['ulps']} ulps)" if gap.get("ulps") is not None else ""
            )
    in_a, in_b = (first.step in steps_ for steps_ in skipped)
    if in_a != in_b:
        verdict += (
            f"; GradScaler skipped the update at step {first.step} in {'A' if in_a else 'B'} "
            f"only "
            "(its scaled gradients were inf/NaN)"
        )
    return verdict


def phrase_verdict(
    manifests: tuple[Manifest, Manifest],
    diffs: list[Difference],
    found: StreamsCompared,
    held: list[list[str]],
    offset: int | None,
    statuses: tuple[str, str],
    mismatch: list[str],
    settings: list[str],
    explanation: str,
) -> tuple[str, str, bool]:
    """(the verdict, the explanation, whether the runs are identical), from the streams' scan
    `found`, the streams each run `held` a step in (where none was compared), the runs' lengths'
    `mismatch` and the recording `settings` they differ in."""
    first, compared = found.first, found.compared
    if first is not None:
        verdict = _divergence_verdict(first, found.skipped[first.stream], mismatch + settings)
        return verdict, explanation, False
    if compared == 0 and offset is not None:
        verdict = f"cannot judge: with --offset {offset} the runs have no step in common"
        return verdict, "choose an offset within both runs' steps, or leave it out", False
    if compared == 0 and not all(held):
        empty = [label for label, streams in zip("AB", held) if not streams]
        return *_unjudged(*manifests, empty, diffs), False
    if compared == 0 and not mismatch and not set(held[0]) & set(held[1]):
        verdict = (
            "cannot judge: the runs recorded their steps in different streams "
            f"(A: {', '.join(held[0])}; B: {', '.join(held[1])})"
        )
        return verdict, explanation, False
    if mismatch or found.one_sided:
        one_sided = found.one_sided
        verdict = "runs differ: " + "; ".join(
            mismatch + [_one_sided_phrase(one_sided, found.lengths, statuses)]
            if one_sided
            else mismatch
        )
        verdict += f"; the {compared} steps both recorded are bit-identical" if compared else ""
        verdict += "; " + "; ".join(settings) if settings else ""
        return verdict, explanation, False
    if settings:  # a difference of recording alone: what both recorded decides
        verdict = f"runs are bit-identical at the {compared} steps both recorded; " + "; ".join(
            settings
        )
        return verdict, explanation, True
    return f"runs are bit-identical: {compared} steps compared", explanation, True


def verdict_notes(
    a: Path,
    b: Path,
    alignment: Alignment | None,
    resumes: dict,
    first: Divergence | None,
    compared: int,
    start: int,
) -> str:
    """What the verdict adds after it: where the runs were lined up, where they resumed, and
    where a run's step capture stopped."""
    notes = ""
    if alignment is not None and alignment.offset:
        notes += f"; {alignment.phrase()}, compared from there"
    if resumes and first is None and compared:
        notes += (
            "; "
            + "; ".join(
                f"{label} resumed from {resume.name}" for label, resume in sorted(resumes.items())
            )
            + (f", so steps from {start} on" if start else "")
        )
    for label, path in (("A", Path(a)), ("B", Path(b))):
        stopped = read_capture_error(path)
        # the training went on untraced: its trace is shorter for that reason alone
        if stopped is not None:
            notes += (
                f"; {label}'s step capture stopped at step {stopped['step']} "
                f"({stopped['error']}): its trace ends there"
            )
    return notes
