"""`twice verify`: run a recorded command again with its recorded seed and settings, and compare."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from twice.app.compare import Comparison, compare_runs
from twice.app.launch import RunOptions, run_command
from twice.app.rerun import rerun_options, start_rerun
from twice.app.trust import Consent, Rerun, admit, trusted_rerun
from twice.core.divergence import divergence_phrase
from twice.core.errors import Exit, UsageError
from twice.core.protocol import ChildSettings
from twice.store.layout import RunFolder
from twice.store.runs import effective_status, read_manifest

__all__ = ["verify_run", "verify_resume", "ResumeCheck"]


def verify_run(
    run_dir: Path, steps: int | None = None, quiet: bool = False, yes: Consent = False
) -> tuple[Comparison, Path]:
    """Re-execute the run in `run_dir` into a new run beside it; compare the first `steps` steps
    (or all). A folder this user's twice did not sign needs `yes` (see app/trust.py)."""
    run_dir = Path(run_dir)
    if steps is not None and steps < 1:
        raise UsageError(
            f"--steps must be at least 1, not {steps}", "give the number of steps to verify"
        )
    rerun = trusted_rerun(run_dir, yes)
    options = rerun_options(rerun, name=f"verify-{run_dir.name[:26]}", steps=steps, quiet=quiet)
    _, new_dir = start_rerun(rerun, options)
    return compare_runs(run_dir, new_dir, steps=steps), new_dir


_MISSING_STATE = {
    "batch": "the data position or the sampler's RNG was not restored: the first resumed batch "
    "differs",
    "rng": "the RNG state was not restored",
    "loss": "the forward pass differs after resuming: RNG state (dropout) or model buffers were "
    "not restored",
    "grads": "the backward pass differs after resuming: state used by backward was not restored",
    "grad_norm": "the gradients differ after resuming",
    "lr": "the learning-rate scheduler's state was not restored",
    "params": "the optimizer's state was not restored (moments, step counts)",
}


@dataclass
class ResumeCheck:
    """The outcome of `verify_resume`: straight run A, interrupted run B, resumed run C."""

    identical: bool
    verdict: str
    cause: str
    at: int
    runs: dict[str, str]
    divergence: dict | None

    @property
    def exit_code(self) -> int:
        """The command's exit code: 0 when nothing differs or failed, 1 otherwise."""
        return Exit.SAME if self.identical else Exit.DIFFER

    def to_json(self) -> dict:
        """As plain JSON values (what `--json` prints and reports read)."""
        return {
            "identical": self.identical,
            "verdict": self.verdict,
            "cause": self.cause,
            "at": self.at,
            "runs": self.runs,
            "divergence": self.divergence,
        }


def verify_resume(
    command: list[str] | Rerun,
    options: RunOptions,
    at: int | None = None,
    straight: Path | None = None,
    at_flag: str = "--at",
    resume_command: list[str] | None = None,
) -> ResumeCheck:
    """Run `command` straight; again, stopped after `at` steps (default: half); then resumed in a
    new
    process from where it stopped. Compare the resumed steps and the final state with the straight
    run.

    A script using twice.Run resumes through `run.resume()`; a script that checkpoints by itself
    finds its checkpoints in twice.checkpoint_dir(), which the interrupted and resumed runs share.
    Given `straight` (a recorded run of `command`, as `twice verify RUN --resume-at`), that run is
    the uninterrupted one and is not run again. Given `resume_command`, the resumed run is that
    command instead (a script that resumes through its own flag, from its own checkpoint): where
    it starts is found by its parameters before its first update. Given a Rerun (a run folder's
    command, admitted by the trust check), it is started through app/rerun.py.
    """
    from dataclasses import replace

    import twice.checkpoint as checkpoints
    from twice.store.traces import read_trace, trace_files

    def start(what, chosen: RunOptions) -> tuple[int, Path]:
        return start_rerun(what, chosen) if isinstance(what, Rerun) else run_command(what, chosen)

    if straight is None:
        code, straight = start(command, replace(options, name="straight"))
    else:
        code = read_manifest(straight).exit_code or 0
    streams = {stream: read_trace(path) for stream, path in trace_files(straight).items()}
    full = next(
        (streams[s] for s in ("main", "rank0") if s in streams), next(iter(streams.values()), [])
    )
    if code != 0 or len(full) < 2:
        raise UsageError(
            f"the straight run "
            f"{'failed (exit ' + str(code) + ')' if code else 'recorded fewer than 2 steps'}",
            f"fix the command first; see {RunFolder(straight).stderr}",
        )
    at = len(full) // 2 if at is None else at
    if not 1 <= at < len(full):
        raise UsageError(
            f"{at_flag} {at} is outside the run's {len(full)} steps",
            f"give a step from 1 to {len(full) - 1}",
        )
    _, interrupted = start(command, replace(options, name=f"stopped-at-{at}", stop_after=at))
    saved = RunFolder(interrupted).checkpoints
    resume_from = checkpoints.latest(saved)
    env = {
        **options.env,
        **ChildSettings(checkpoint_dir=str(saved.resolve())).to_env(),
    }
    code, resumed = start(
        resume_command or command,
        replace(options, name=f"resumed-from-{at}", env=env, resume_from=resume_from),
    )
    if code != 0 and resume_command:
        raise UsageError(
            f"the resume command failed (exit {code})",
            f"run it by hand after the interrupted run to see why; its output: "
            f"{RunFolder(resumed).stderr}",
        )
    runs = {"straight": str(straight), "interrupted": str(interrupted), "resumed": str(resumed)}
    # Multi-process runs: every rank's trace must continue exactly; report the rank that parts
    # first.
    checks = []
    resumed_streams = trace_files(resumed)
    for stream, records in streams.items():
        after = read_trace(resumed_streams[stream]) if stream in resumed_streams else []
        check = compare_resumed(records, after, at, runs)
        if len(streams) > 1 and not check.identical:
            check.verdict = f"{stream}: {check.verdict}"
        checks.append(check)
    failed = [c for c in checks if not c.identical]
    if not failed:
        if len(checks) > 1:
            checks[0].verdict += f" on every one of the {len(checks)} ranks"
        return checks[0]
    return min(failed, key=lambda c: (c.divergence or {}).get("step", float("inf")))


def compare_resumed(full: list, after: list, at: int, runs: dict) -> ResumeCheck:
    """Compare one stream's resumed steps (from step `at` on) with the same steps of the straight
    run."""
    from twice.core.divergence import first_divergence

    # A script resuming by itself restarts twice's step count at 0: align it with the straight run,
    # where its parameters before its first update occur (its own checkpoint may be older than
    # the interruption), else at the interruption.
    offset = 0
    if after and after[0].step == 0 and at > 0:
        offset = next(
            (
                r.step + 1
                for r in full
                if r.params is not None and r.params == after[0].params_before
            ),
            at,
        )
        at = offset
    for record in after:
        record.step += offset
    tail = [r for r in full if r.step >= at]
    found = first_divergence(tail, after, resumed=True)
    before = next((r for r in full if r.step == at - 1), None)
    if (
        after
        and before is not None
        and after[0].params_before is not None
        and after[0].params_before != before.params
    ):
        cause = (
            f"the model's parameters were not restored: they differ from the straight run's "
            f"after step {at - 1}"
        )
        divergence = {"step": at, "fields": ["params_before"]}
        return ResumeCheck(
            False,
            f"resume differs: first divergence at step {at}, the first resumed step",
            cause,
            at,
            runs,
            divergence,
        )
    if found is None and len(after) == len(tail) and after:
        verdict = (
            f"resume is bit-exact: steps {at}-{tail[-1].step} and the final parameters "
            f"match the uninterrupted run"
        )
        return ResumeCheck(True, verdict, "", at, runs, None)
    if found is None:
        verdict = (
            f"resume differs: the resumed run recorded {len(after)} steps where the "
            f"straight run has {len(tail)} after step {at}"
        )
        return ResumeCheck(
            False,
            verdict,
            "the resumed run did not continue where the interrupted one stopped",
            at,
            runs,
            None,
        )
    cause = _MISSING_STATE[found.first]
    if found.first == "rng" and found.rng_sources:
        cause += f" ({', '.join(found.rng_sources)})"
    if found.step > at:
        cause = f"state that matters only later was not restored; at step {found.step}: {cause}"
    verdict = f"resume differs: {divergence_phrase(found, resumed_at=at)}"
    return ResumeCheck(False, verdict, cause, at, runs, found.to_json())


def verify_resume_of_run(run_dir: Path, at: int, yes: Consent = False) -> ResumeCheck:
    """`twice verify RUN --resume-at STEP`: verify-resume with RUN as the uninterrupted run."""
    manifest = read_manifest(run_dir)  # read once: its status checked, then admitted
    status, stopped = effective_status(manifest), manifest.stopped_after
    if status != "completed" or stopped:
        how = f"was stopped after {stopped} steps" if stopped else f"is {status}"
        raise UsageError(
            f"run {Path(run_dir).name} {how}: it is not the whole uninterrupted run to compare a "
            f"resume with",
            "record the run to its end, or use `twice verify-resume -- COMMAND`, which runs it "
            "straight first",
        )
    rerun = admit(Path(run_dir), manifest, yes)
    options = rerun_options(rerun, name=f"resume-{Path(run_dir).name[:26]}", quiet=True)
    return verify_resume(
        rerun, options, at=at, straight=Path(run_dir).resolve(), at_flag="--resume-at"
    )
