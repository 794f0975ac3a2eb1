"""Compare two recorded runs: manifests, traces stream by stream, and a verdict that comes first."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from twice.app.recordings import length_mismatch, recorded
from twice.core.causes import explain, explain_resumed
from twice.core.coverage import judge_inputs
from twice.core.divergence import Divergence, divergence_phrase, first_divergence, loss_gap
from twice.core.errors import Exit
from twice.core.manifest import MISSING, Difference, Manifest, compare_identity
from twice.core.seedcalls import seeding_difference
from twice.store.faults import first_fault, read_capture_error
from twice.store.layout import RunFolder
from twice.store.outputs import compare_outputs, outputs_phrase
from twice.store.resumes import read_resume
from twice.store.runs import config_not_default, effective_status, read_manifest
from twice.store.tracealign import Alignment, content_alignment, first_record, scan_offset
from twice.store.traces import trace_files
from twice.store.tracescan import scan_pair
from twice.store.traceseries import compare_whole_tensors

__all__ = ["Comparison", "compare_runs"]

# Identity keys whose presence legitimately differs between a run and its re-run (a module one
# run imported and the other did not) and says nothing about results; the same source with
# other contents is a code difference all the same.
_IGNORED = ("code.sources",)


@dataclass
class Comparison:
    """The outcome of comparing run A with run B."""

    a: Path
    b: Path
    identical: bool
    verdict: str
    explanation: str
    differences: list[Difference]
    divergence: Divergence | None
    steps: dict[str, tuple[int, int]] = field(default_factory=dict)
    statuses: tuple[str, str] = ("", "")
    compared_steps: int = 0
    outputs: dict[str, list[str]] = field(default_factory=dict)  # store.outputs.compare_outputs
    judged: bool = True  # False: neither run has a step to compare (exit 2, cannot judge)
    whole: dict | None = None  # store.traceseries.compare_whole_tensors (--full-every)
    # each stream's own first divergence (step, field), where it has one: every rank's
    diverged: dict[str, tuple[int, str]] = field(default_factory=dict)
    # the recording settings the runs differ in (core/manifest.py RECORDING): never a verdict
    recording: list[Difference] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        """The command's exit code: 0 when nothing differs, 1 when something does, 2 when no
        step was recorded to judge by."""
        return (
            Exit.CANNOT_JUDGE if not self.judged else Exit.SAME if self.identical else Exit.DIFFER
        )

    def to_json(self) -> dict:
        """As plain JSON values (what `--json` prints and reports read)."""
        return {
            "a": str(self.a),
            "b": str(self.b),
            "identical": self.identical,
            "verdict": self.verdict,
            "explanation": self.explanation,
            "differences": [d.to_json() for d in self.differences],
            "divergence": self.divergence.to_json() if self.divergence else None,
            "steps": {k: list(v) for k, v in self.steps.items()},
            "status": list(self.statuses),
            "compared_steps": self.compared_steps,
            "outputs": self.outputs,
            "judged": self.judged,
            "diverged": {k: {"step": v[0], "first": v[1]} for k, v in self.diverged.items()},
            "whole_tensors": self.whole,
            "recording": [d.to_json() for d in self.recording],
        }


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


def _alignment(
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


def _whole(a: Manifest, b: Manifest, traces_a: dict, traces_b: dict) -> dict | None:
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


def _identity_cause(diffs: list[Difference]) -> bool:
    """Whether the manifests differ in something that changes results by itself (then that, not
    the resume, is the explanation)."""
    return any(d.group != "environment" for d in diffs)


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


def compare_runs(
    a: Path,
    b: Path,
    steps: int | None = None,
    cache: dict | None = None,
    offset: int | None = None,
) -> Comparison:
    """Compare runs A and B (the first `steps` steps only, when given).

    Steps are matched by number, unless one run resumed itself (its trace starts at 0 from
    another run's later state: store/tracealign.py finds where) or `offset` says that B's step 0
    is A's step `offset`.

    The traces are streamed (store.tracescan): memory stays small whatever their length, and only
    lines whose bytes differ are parsed. `cache` is accepted for callers that pass one, and unused.
    """

    manifest_a, manifest_b = read_manifest(a), read_manifest(b)
    diffs = [
        d
        for d in compare_identity(manifest_a.identity, manifest_b.identity)
        if not (d.key.startswith(_IGNORED) and MISSING in (d.a, d.b))
    ]
    # What was recorded is not what was trained: fields and steps one run's settings left
    # unrecorded are compared nowhere, and a run stopped at --max-steps is compared up to there.
    recording = recorded(manifest_a, manifest_b, diffs, steps)
    diffs, steps, partial = recording.identity, recording.steps, recording.partial
    # "same input files" from what both records cover (core/coverage.py)
    diffs, inputs = judge_inputs(manifest_a, manifest_b, diffs)
    # Settings chosen away from their defaults (where the runs know them) first: those both runs
    # chose, then those one did, then the rest.
    chosen = config_not_default(a, manifest_a.identity.get("config")) + config_not_default(
        b, manifest_b.identity.get("config")
    )
    if chosen:
        diffs.sort(key=lambda d: -chosen.count(d.key[7:]) if d.key.startswith("config.") else 0)
    traces_a, traces_b = trace_files(a, manifest_a), trace_files(b, manifest_b)
    # A resumed run never ran the steps before its checkpoint: compare from where both ran.
    resumes = {label: read_resume(path) for label, path in (("A", a), ("B", b))}
    resumes = {label: resume for label, resume in resumes.items() if resume is not None}
    start = max((resume.step for resume in resumes.values()), default=0)
    resumed_at = tuple(resumes[label].step if label in resumes else 0 for label in "AB")
    alignment = _alignment(traces_a, traces_b, offset, bool(resumes))
    divergences: list[Divergence] = []
    skipped: dict[
        str, tuple[set[int], set[int]]
    ] = {}  # per diverging stream: the steps whose update GradScaler skipped
    lengths: dict[str, tuple[int, int]] = {}
    one_sided: dict[str, tuple[int, int]] = {}  # per stream: (side, step) of a step one lacks
    compared = 0
    for stream in sorted(set(traces_a) | set(traces_b)):
        missing = RunFolder(a).path / "no-such-trace"
        path_a, path_b = traces_a.get(stream, missing), traces_b.get(stream, missing)
        scan = (
            scan_offset(path_a, path_b, alignment.offset, steps)
            if alignment is not None
            else scan_pair(path_a, path_b, steps, start, resumed_at, partial, recording.every)
        )
        lengths[stream] = tuple(scan.counts)
        if scan.only is not None:
            one_sided[stream] = scan.only
        if scan.first is not None:
            record_a, record_b = scan.first
            found = first_divergence([record_a], [record_b], stream, scan.resumed, partial)
            # the state before the step is known equal: the step before it compared equal, or
            # step 0's starting parameters (params_before, first in causal order) were equal
            start_known = (found.step > 0 and scan.last_same == found.step - 1) or (
                found.step == 0 and "params_before" in found.recorded
            )
            divergences.append(
                replace(found, identical_before=scan.same_before, start_known=start_known)
            )
            skipped[stream] = (
                {record_a.step} if record_a.skipped else set(),
                {record_b.step} if record_b.skipped else set(),
            )
        compared += scan.common
    first = (
        min(divergences, key=lambda d: (d.step, d.stream != "main", d.stream))
        if divergences
        else None
    )
    statuses = (effective_status(manifest_a), effective_status(manifest_b))
    observed = manifest_a.observe or manifest_b.observe
    inputs_recorded = "inputs" in manifest_a.identity and "inputs" in manifest_b.identity
    env_a, env_b = manifest_a.env_digests, manifest_b.env_digests
    env_changed = (
        None
        if env_a is None or env_b is None
        else sorted(k for k in {*env_a, *env_b} if env_a.get(k) != env_b.get(k))
    )
    explanation = explain(
        diffs,
        first,
        observed=observed,
        inputs_recorded=inputs_recorded,
        env_changed=env_changed,
        seeding=seeding_difference(
            manifest_a.context.get("seeding"), manifest_b.context.get("seeding")
        ),
        inputs=inputs,
    )
    if alignment is not None and alignment.offset:
        # A resume that lost state shows at its first step, whatever else the command changed
        # (its resume flag, at least): say that first.
        later = "B" if alignment.offset > 0 else "A"
        explanation = explain_resumed(
            later, "", abs(alignment.offset), first, lead=alignment.phrase()
        ) + ("; the manifests differ too (below)" if diffs else "")
    if resumes and not (first is not None and _identity_cause(diffs)):
        label, resume = max(resumes.items(), key=lambda item: item[1].step)
        explanation = explain_resumed(label, resume.name, resume.step, first)
    faults = {label: first_fault(path) for label, path in (("A", Path(a)), ("B", Path(b)))}
    faults = {label: fault for label, fault in faults.items() if fault is not None}
    if faults:
        # A NaN is a numerical fault, which two runs can share or not; say so before blaming
        # nondeterminism.
        notes = [
            f"run {label} hit a numerical fault at step {fault['step']} ({fault['summary']}; see "
            f"`twice nan`)"
            for label, fault in faults.items()
        ]
        same = len(faults) == 2 and faults["A"]["step"] == faults["B"]["step"]
        explanation = "; ".join(notes) + (
            ": both runs fail alike, a numerical problem, not nondeterminism"
            if same
            else f"; {explanation}"
        )
    # where nothing was compared: the streams in which each run recorded any step at all (not
    # only within the compared span), read from the traces' first lines
    held = (
        [
            sorted(s for s, path in traces.items() if first_record(path) is not None)
            for traces in (traces_a, traces_b)
        ]
        if compared == 0
        else []
    )
    mismatch = length_mismatch(manifest_a, manifest_b, steps, bool(resumes or alignment))
    settings = recording.phrases()
    if first is not None:
        verdict = f"runs differ: {divergence_phrase(first)}; steps before it bit-identical"
        if mismatch or settings:
            verdict += "; also, " + "; ".join(mismatch + settings)
        if "loss" in first.fields:
            gap = loss_gap(first.loss_a, first.loss_b)
            if gap.get("abs") is not None:
                verdict += f"; loss differs by {gap['abs']:.3g}" + (
                    f" ({gap['ulps']} ulps)" if gap.get("ulps") is not None else ""
                )
        in_a, in_b = (first.step in steps_ for steps_ in skipped[first.stream])
        if in_a != in_b:
            verdict += (
                f"; GradScaler skipped the update at step {first.step} in {'A' if in_a else 'B'} "
                f"only "
                "(its scaled gradients were inf/NaN)"
            )
        identical = False
    elif compared == 0 and offset is not None:
        verdict = f"cannot judge: with --offset {offset} the runs have no step in common"
        explanation = "choose an offset within both runs' steps, or leave it out"
        identical = False
    elif compared == 0 and not all(held):
        empty = [label for label, found in zip("AB", held) if not found]
        verdict, explanation = _unjudged(manifest_a, manifest_b, empty, diffs)
        identical = False
    elif compared == 0 and not mismatch and not set(held[0]) & set(held[1]):
        verdict = (
            "cannot judge: the runs recorded their steps in different streams "
            f"(A: {', '.join(held[0])}; B: {', '.join(held[1])})"
        )
        identical = False
    elif mismatch or one_sided:
        verdict = "runs differ: " + "; ".join(
            mismatch + [_one_sided_phrase(one_sided, lengths, statuses)] if one_sided else mismatch
        )
        verdict += f"; the {compared} steps both recorded are bit-identical" if compared else ""
        verdict += "; " + "; ".join(settings) if settings else ""
        identical = False
    elif settings:  # a difference of recording alone: what both recorded decides
        verdict = f"runs are bit-identical at the {compared} steps both recorded; " + "; ".join(
            settings
        )
        identical = True
    else:
        verdict = f"runs are bit-identical: {compared} steps compared"
        identical = True
    if alignment is not None and alignment.offset:
        verdict += f"; {alignment.phrase()}, compared from there"
    if resumes and first is None and compared:
        verdict += (
            "; "
            + "; ".join(
                f"{label} resumed from {resume.name}" for label, resume in sorted(resumes.items())
            )
            + (f", so steps from {start} on" if start else "")
        )
    for label, path in (("A", Path(a)), ("B", Path(b))):
        stopped = read_capture_error(path)
        if (
            stopped is not None
        ):  # the training went on untraced: its trace is shorter for that reason alone
            verdict += (
                f"; {label}'s step capture stopped at step {stopped['step']} "
                f"({stopped['error']}): its trace ends there"
            )
    outputs = compare_outputs(manifest_a.outputs, manifest_b.outputs)
    if compared == 0 and first is None:
        explanation += "; " + outputs_phrase(outputs)
    return Comparison(
        outputs=outputs,
        judged=not verdict.startswith("cannot judge"),
        a=Path(a),
        b=Path(b),
        identical=identical,
        verdict=verdict,
        explanation=explanation,
        differences=diffs,
        divergence=first,
        steps=lengths,
        statuses=statuses,
        compared_steps=compared,
        diverged={d.stream: (d.step, d.first) for d in sorted(divergences, key=lambda d: d.stream)},
        whole=_whole(manifest_a, manifest_b, traces_a, traces_b),
        recording=recording.differences,
    )
