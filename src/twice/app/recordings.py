"""What two runs recorded differently (core/manifest.py RECORDING: --trace-every, --params-every,
--full-every, --max-steps, ...), and what of their records that leaves to compare: a field or a
step one run's settings did not record is unrecorded, not different; a run stopped at --max-steps
is compared up to there; an input file only one run's --inputs covered is no difference."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from twice.core.manifest import MISSING, Difference, Manifest, recording_differences

__all__ = ["Recorded", "recorded", "length_mismatch"]


@dataclass(frozen=True)
class Recorded:
    """How two runs' recording settings bear on comparing them."""

    differences: list[Difference]  # the recording settings they differ in (group "recording")
    identity: list[Difference]  # the identity differences left once unrecorded inputs are out
    partial: frozenset[str]  # trace fields compared only where both records hold them
    every: tuple[int, int]  # each run's --trace-every: a step not due in the other is no gap
    steps: int | None  # the steps to compare (a --max-steps stop, or the caller's limit)
    stopped_early: str | None  # why later steps are not compared, in words

    def phrases(self) -> list[str]:
        """The recording differences in words, for a verdict (never a verdict by themselves)."""
        found = [_recorded_differently(self.differences)] if self.differences else []
        return found + ([self.stopped_early] if self.stopped_early else [])


def recorded(a: Manifest, b: Manifest, diffs: list[Difference], steps: int | None) -> Recorded:
    """How runs `a` and `b` were recorded differently, with their identity differences `diffs`,
    compared over the first `steps` steps (None: all)."""
    found = recording_differences(a, b)
    options = {d.key for d in found}
    if options & {"--inputs", "--inputs-exclude"}:
        unrecorded = _recorded_inputs_only(diffs, a, b)
        diffs = [d for d in diffs if d not in unrecorded]
    steps, stopped_early = _stop_limit(a, b, steps)
    return Recorded(
        differences=found,
        identity=diffs,
        partial=frozenset(f for option in options & set(_PARTIAL) for f in _PARTIAL[option]),
        every=(a.recording["trace_every"], b.recording["trace_every"]),
        steps=steps,
        stopped_early=stopped_early,
    )


# A recording setting left unset, in words.
_UNSET = {
    "--params-every": "auto",
    "--full-every": "never",
    "--max-steps": "none",
    "--record-ops": "none",
    "--numerics": "off",
}
# The trace fields a recording setting decides, step by step: where the runs' settings differ, a
# field one run holds and the other lacks is unrecorded, not different (records.differing_fields).
_PARTIAL = {
    "--params-every": ("param_digests", "grad_digests"),
    "--full-every": ("params_full",),
}


def _setting(option: str, value) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, list):
        return ",".join(value) if value else "none"
    return _UNSET.get(option, "none") if value is None else str(value)


def _recorded_differently(recording: list[Difference]) -> str:
    """The recording settings the runs differ in, in words (what was recorded, not trained)."""
    return "recorded differently: " + ", ".join(
        f"{d.key} {_setting(d.key, d.a)} vs {_setting(d.key, d.b)}" for d in recording
    )


def _stop_limit(a: Manifest, b: Manifest, steps: int | None) -> tuple[int | None, str | None]:
    """(the steps to compare, and why, in words) where a run stopped at its --max-steps before
    the other ended: that run's training was cut short by the recording's limit, not changed,
    so the steps both ran are compared and the other's later steps are no difference."""
    stopped = [
        (m.stopped_after, label)
        for label, m in (("A", a), ("B", b))
        if m.stopped_after and m.status == "stopped"
    ]
    if not stopped:
        return steps, None
    limit, label = min(stopped)
    other = b if label == "A" else a
    if steps is not None and steps <= limit:
        return steps, None
    if other.steps is not None and other.steps <= limit:
        return limit, None  # the other run ended first on its own: lengths are compared as ever
    return (
        limit,
        f"{label} stopped at --max-steps {limit}, so steps from {limit} on are not compared",
    )


def length_mismatch(a: Manifest, b: Manifest, steps: int | None, resumed: bool) -> list[str]:
    """Runs that trained for another number of steps (within `steps`): a training difference."""
    if resumed or a.steps is None or b.steps is None:
        return []
    ran_a, ran_b = (
        (a.steps, b.steps) if steps is None else (min(a.steps, steps), min(b.steps, steps))
    )
    return [f"A ran {a.steps} steps and B {b.steps}"] if ran_a != ran_b else []


def _recorded_inputs_only(diffs: list[Difference], a: Manifest, b: Manifest) -> list[Difference]:
    """The input files one run recorded only because its --inputs or --inputs-exclude said so
    (a folder the other run did not record): unrecorded in the other, not different."""

    def recorded_by(manifest: Manifest, path: Path) -> bool:
        exclude = manifest.context.get("inputs_exclude") or []
        if any(path.is_relative_to(e) for e in exclude):
            return False
        # a run that recorded every file its processes read would have recorded this one
        if (manifest.context.get("inputs_coverage") or {}).get("scope") == "everywhere":
            return True
        roots = manifest.context.get("inputs_roots") or [manifest.cwd]
        return any(path.is_relative_to(r) for r in roots)

    found = []
    for d in diffs:
        if d.group == "data" and MISSING in (d.a, d.b):
            having, lacking = (a, b) if d.b == MISSING else (b, a)
            path = Path(having.cwd) / d.key.removeprefix("inputs.")
            if not recorded_by(lacking, path):
                found.append(d)
    return found
