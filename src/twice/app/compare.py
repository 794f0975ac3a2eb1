"""Compare two recorded runs: manifests, traces stream by stream, and a verdict that comes first."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from twice.app.recordings import Recorded, length_mismatch, recorded
from twice.app.tracecompare import align_streams, compare_streams, compare_whole
from twice.app.verdict import phrase_verdict, verdict_notes
from twice.core.causes import explain
from twice.core.coverage import InputPremise, judge_inputs
from twice.core.divergence import Divergence
from twice.core.errors import Exit
from twice.core.manifest import MISSING, Difference, Manifest, compare_identity
from twice.core.resumed import explain_resumed
from twice.core.seedcalls import seeding_difference
from twice.store.faults import first_fault
from twice.store.outputs import compare_outputs, outputs_phrase
from twice.store.resumes import read_resume
from twice.store.runs import config_not_default, effective_status, read_manifest
from twice.store.tracealign import Alignment, first_record
from twice.store.traces import trace_files

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


def _identity_cause(diffs: list[Difference]) -> bool:
    """Whether the manifests differ in something that changes results by itself (then that, not
    the resume, is the explanation)."""
    return any(d.group != "environment" for d in diffs)


def _identity_differences(
    a: Path, b: Path, manifest_a: Manifest, manifest_b: Manifest, steps: int | None
) -> tuple[Recorded, list[Difference], InputPremise]:
    """What both runs recorded (within the caller's `steps`), the manifests' identity differences
    that bear on results (settings chosen away from their defaults first), and the premise "same
    input files"."""
    diffs = [
        d
        for d in compare_identity(manifest_a.identity, manifest_b.identity)
        if not (d.key.startswith(_IGNORED) and MISSING in (d.a, d.b))
    ]
    # What was recorded is not what was trained: fields and steps one run's settings left
    # unrecorded are compared nowhere, and a run stopped at --max-steps is compared up to there.
    recording = recorded(manifest_a, manifest_b, diffs, steps)
    # "same input files" from what both records cover (core/coverage.py)
    diffs, inputs = judge_inputs(manifest_a, manifest_b, recording.identity)
    # Settings chosen away from their defaults (where the runs know them) first: those both runs
    # chose, then those one did, then the rest.
    chosen = config_not_default(a, manifest_a.identity.get("config")) + config_not_default(
        b, manifest_b.identity.get("config")
    )
    if chosen:
        diffs.sort(key=lambda d: -chosen.count(d.key[7:]) if d.key.startswith("config.") else 0)
    return recording, diffs, inputs


def _explanation(
    manifest_a: Manifest,
    manifest_b: Manifest,
    diffs: list[Difference],
    first: Divergence | None,
    inputs: InputPremise,
) -> str:
    """The cause of the first divergence (or its absence), in words, from what the manifests
    say (core/causes.py)."""
    inputs_recorded = "inputs" in manifest_a.identity and "inputs" in manifest_b.identity
    env_a, env_b = manifest_a.env_digests, manifest_b.env_digests
    env_changed = (
        None
        if env_a is None or env_b is None
        else sorted(k for k in {*env_a, *env_b} if env_a.get(k) != env_b.get(k))
    )
    return explain(
        diffs,
        first,
        observed=manifest_a.observe or manifest_b.observe,
        inputs_recorded=inputs_recorded,
        env_changed=env_changed,
        seeding=seeding_difference(
            manifest_a.context.get("seeding"),
            manifest_b.context.get("seeding"),
            (_script_path(manifest_a), _script_path(manifest_b)),
        ),
        inputs=inputs,
    )


def _script_path(manifest) -> str | None:
    """The run's script as its seeding call sites name it (runtime/seedcalls.py): relative to
    the working folder where it is under it, else absolute."""
    script = (manifest.identity.get("code") or {}).get("script")
    path = script.get("path") if isinstance(script, dict) else None
    cwd = manifest.context.get("cwd")
    if not isinstance(path, str) or not isinstance(cwd, str):
        return path if isinstance(path, str) else None
    full = os.path.normpath(os.path.join(cwd, path))
    return os.path.relpath(full, cwd) if full.startswith(cwd.rstrip(os.sep) + os.sep) else full


def _resumed_explanation(
    explanation: str,
    diffs: list[Difference],
    first: Divergence | None,
    alignment: Alignment | None,
    resumes: dict,
) -> str:
    """The explanation where one run resumed (by itself, lined up by `alignment`, or through
    twice, `resumes`): the resume, unless the manifests differ in a cause of their own."""
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
    return explanation


def _with_faults(a: Path, b: Path, explanation: str) -> str:
    """The explanation, after each run's first numerical fault where one hit one."""
    faults = {label: first_fault(path) for label, path in (("A", Path(a)), ("B", Path(b)))}
    faults = {label: fault for label, fault in faults.items() if fault is not None}
    if not faults:
        return explanation
    # A NaN is a numerical fault, which two runs can share or not; say so before blaming
    # nondeterminism.
    notes = [
        f"run {label} hit a numerical fault at step {fault['step']} ({fault['summary']}; see "
        f"`twice nan`)"
        for label, fault in faults.items()
    ]
    same = len(faults) == 2 and faults["A"]["step"] == faults["B"]["step"]
    return "; ".join(notes) + (
        ": both runs fail alike, a numerical problem, not nondeterminism"
        if same
        else f"; {explanation}"
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
    recording, diffs, inputs = _identity_differences(a, b, manifest_a, manifest_b, steps)
    steps = recording.steps
    traces_a, traces_b = trace_files(a, manifest_a), trace_files(b, manifest_b)
    # A resumed run never ran the steps before its checkpoint: compare from where both ran.
    resumes = {label: read_resume(path) for label, path in (("A", a), ("B", b))}
    resumes = {label: resume for label, resume in resumes.items() if resume is not None}
    start = max((resume.step for resume in resumes.values()), default=0)
    resumed_at = tuple(resumes[label].step if label in resumes else 0 for label in "AB")
    alignment = align_streams(traces_a, traces_b, offset, bool(resumes))
    found = compare_streams(a, (traces_a, traces_b), alignment, recording, start, resumed_at)
    first, compared = found.first, found.compared
    statuses = (effective_status(manifest_a), effective_status(manifest_b))
    explanation = _explanation(manifest_a, manifest_b, diffs, first, inputs)
    explanation = _resumed_explanation(explanation, diffs, first, alignment, resumes)
    explanation = _with_faults(a, b, explanation)
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
    verdict, explanation, identical = phrase_verdict(
        (manifest_a, manifest_b),
        diffs,
        found,
        held,
        offset,
        statuses,
        mismatch,
        recording.phrases(),
        explanation,
    )
    verdict += verdict_notes(a, b, alignment, resumes, first, compared, start)
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
        steps=found.lengths,
        statuses=statuses,
        compared_steps=compared,
        diverged={
            d.stream: (d.step, d.first) for d in sorted(found.divergences, key=lambda d: d.stream)
        },
        whole=compare_whole(manifest_a, manifest_b, traces_a, traces_b),
        recording=recording.differences,
    )
