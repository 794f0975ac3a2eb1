"""`twice verify RUN --segments K`: verify a long run by re-running sampled spans between its
checkpoints instead of all of it.

The run's checkpoints cut it into segments (step 0 to the first checkpoint, checkpoint to
checkpoint, the last checkpoint to the run's end). K of them are re-run, the first and the last
always and the rest drawn with a seed that is printed and recorded; each from its starting
checkpoint (a fresh start for the first) to its end, in its own process with the run's recorded
command, seed and environment, `--jobs N` at a time or as Ray tasks. A segment reproduces when its
re-run's trace is bit-identical to the recorded one over its steps and, where it ends at a
checkpoint, the re-run's checkpoint there has the same index (every file's digest) as the
recorded one.
"""

from __future__ import annotations

import os
import random
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

from twice.app.compare import compare_runs
from twice.app.rerun import rerun_options, start_rerun
from twice.app.trust import Consent, Rerun, admit
from twice.core.errors import CheckpointError, Exit, UsageError
from twice.store.files import write_json_atomic
from twice.store.layout import RunFolder
from twice.store.runs import effective_status, read_manifest

__all__ = ["Segment", "SegmentsCheck", "plan_segments", "verify_segments"]


@dataclass
class Segment:
    """Steps [start, end) of a run: resumed from the checkpoint at `start` (None: from the
    beginning), with the checkpoint at `end` where there is one."""

    start: int
    end: int
    checkpoint: Path | None
    end_checkpoint: Path | None
    identical: bool | None = None
    verdict: str = ""
    rerun: str | None = None

    def to_json(self) -> dict:
        """As plain JSON values."""
        return {
            "steps": [self.start, self.end],
            "identical": self.identical,
            "verdict": self.verdict,
            "rerun": self.rerun,
        }


@dataclass
class SegmentsCheck:
    """What `verify_segments` found: the segments re-run, out of how many, and the verdict."""

    run: str
    seed: int
    total: int
    run_steps: int
    checked: list[Segment] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        """Whether every segment re-run reproduced."""
        return all(s.identical for s in self.checked)

    @property
    def exit_code(self) -> int:
        """0 when every segment re-run reproduced, 1 otherwise."""
        return Exit.SAME if self.identical else Exit.DIFFER

    @property
    def cost(self) -> float:
        """The segments' steps as a share of the run's."""
        return sum(s.end - s.start for s in self.checked) / max(self.run_steps, 1)

    def verdict(self) -> str:
        """One sentence: what was shown, what it is worth, and what it cost."""
        k, n = len(self.checked), self.total
        spans = ", ".join(f"{s.start}-{s.end}" for s in self.checked)
        failed = [s for s in self.checked if not s.identical]
        if failed:
            head = (
                f"NOT reproducible: {len(failed)} of {k} segments re-run differ "
                f"(steps {', '.join(f'{s.start}-{s.end}' for s in failed)})"
            )
        else:
            head = f"{k} of {n} segments re-run bit-identical (steps {spans})"
        if k >= n:
            worth = "every segment was re-run"
        else:
            caught = 1 - (1 - 0.1) ** k
            worth = (
                f"a run in which a fraction p of segments do not reproduce is caught with "
                f"probability 1-(1-p)^{k} ({caught:.0%} for p = 10%)"
            )
        return f"{head}; {worth}; cost {self.cost:.0%} of the run's steps (seed {self.seed})"

    def to_json(self) -> dict:
        """As plain JSON values (what `--json` prints, and what the run folder records)."""
        return {
            "run": self.run,
            "seed": self.seed,
            "segments": self.total,
            "run_steps": self.run_steps,
            "identical": self.identical,
            "cost": round(self.cost, 4),
            "verdict": self.verdict(),
            "checked": [s.to_json() for s in self.checked],
        }


def _checkpoints(run_dir: Path) -> dict[int, Path]:
    """The run's complete checkpoints by step (damaged or half-written ones left out)."""
    from twice.checkpoint.folder import is_twice_folder
    from twice.checkpoint.index import STEP_DIR

    folder = RunFolder(run_dir).checkpoints
    found = {}
    for path in sorted(folder.iterdir()) if folder.is_dir() else []:
        match = STEP_DIR.match(path.name)
        if match and len(match.group(1)) >= 8 and is_twice_folder(path):  # twice.Run's names
            found[int(match.group(1))] = path
    return found


def plan_segments(
    run_dir: Path, count: int | None, seed: int, steps: int | None
) -> tuple[list[Segment], int, int]:
    """(the segments to re-run, the number of segments, the run's `steps`); `count` None is
    all."""
    checkpoints = _checkpoints(run_dir)
    if not checkpoints:
        raise UsageError(
            f"run {Path(run_dir).name} has no checkpoints to start segments from",
            "checkpoint as the run goes (with twice.Run: `if run.step_index % N == 0: "
            "run.checkpoint()`), or verify the whole run with `twice verify RUN`",
        )
    if not steps:
        raise UsageError(f"run {Path(run_dir).name} recorded no steps", "verify a run that trained")
    bounds = sorted({0, steps, *(s for s in checkpoints if 0 < s < steps)})
    segments = [
        Segment(start, end, checkpoints.get(start), checkpoints.get(end))
        for start, end in zip(bounds, bounds[1:])
    ]
    total = len(segments)
    if count is None or count >= total:
        return segments, total, steps
    if count < 2:
        raise UsageError(
            f"--segments must be at least 2 (the first and the last), not {count}",
            "give the number of segments to re-run",
        )
    middle = random.Random(seed).sample(range(1, total - 1), count - 2)
    return [segments[i] for i in sorted({0, total - 1, *middle})], total, steps


def _index_of(checkpoint: Path):
    from twice.checkpoint.index import read_index

    try:
        return read_index(checkpoint)
    except CheckpointError as exc:
        return f"damaged ({exc.message})"


def _check(rerun: Rerun, segment: Segment, quiet: bool) -> Segment:
    """Re-run one segment of the admitted run and judge it."""
    run_dir = rerun.run_dir
    name = f"verify-{segment.start}-{segment.end}-{run_dir.name[:20]}"
    options = rerun_options(rerun, name=name, steps=segment.end, quiet=quiet)
    code, new_dir = start_rerun(rerun, replace(options, resume_from=segment.checkpoint))
    segment.rerun = str(new_dir)
    status = effective_status(read_manifest(new_dir))
    if status not in ("completed", "stopped"):
        segment.identical = False
        segment.verdict = f"the re-run {status} (exit {code}) before the segment's end"
        return segment
    comparison = compare_runs(run_dir, new_dir, steps=segment.end)
    segment.identical, segment.verdict = comparison.identical, comparison.verdict
    if comparison.identical and segment.end_checkpoint is not None:
        mine = RunFolder(new_dir).checkpoints / segment.end_checkpoint.name
        if not mine.is_dir():
            segment.identical = False
            segment.verdict += f"; the re-run wrote no checkpoint {mine.name} to compare"
        elif _index_of(mine) != _index_of(segment.end_checkpoint):
            segment.identical = False
            segment.verdict += (
                f"; but the state saved at step {segment.end} differs from the recorded "
                f"checkpoint {segment.end_checkpoint.name} (a file's digest differs)"
            )
    if not segment.identical:
        segment.verdict += f"; `twice locate {run_dir} {new_dir}` names the operation"
    return segment


def verify_segments(
    run_dir: Path,
    count: int | None,
    seed: int | None = None,
    jobs: int = 1,
    executor: str = "local",
    quiet: bool = True,
    yes: Consent = False,
) -> SegmentsCheck:
    """Re-run `count` segments of the run (all when None) and judge each; the outcome is written
    to the run folder's verify-segments.json. A folder this user's twice did not sign needs `yes`
    (see app/trust.py)."""
    run_dir = Path(run_dir)
    seed = int.from_bytes(os.urandom(4), "little") if seed is None else seed
    manifest = read_manifest(run_dir)  # read once: its segments planned, then admitted
    chosen, total, steps = plan_segments(run_dir, count, seed, manifest.steps)
    rerun = admit(run_dir, manifest, yes)  # a foreign folder: refused before any run
    check = SegmentsCheck(str(run_dir), seed, total, steps)
    if executor == "ray":
        check.checked = _on_ray(rerun, chosen)
    elif executor == "local":
        with ThreadPoolExecutor(max(1, jobs)) as pool:
            check.checked = list(pool.map(lambda s: _check(rerun, s, quiet), chosen))
    else:
        raise UsageError(f"unknown executor {executor!r}", "use --executor local or ray")
    write_json_atomic(RunFolder(run_dir).segments_check, check.to_json())
    return check


def _on_ray(rerun: Rerun, chosen: list[Segment]) -> list[Segment]:
    """Each segment as a Ray task (the sweep's executor): ray.init() joins the cluster in
    RAY_ADDRESS, or starts a local one. The task gets the admitted Rerun, not the folder's
    manifest to read again."""
    try:
        import ray
    except ImportError:
        raise UsageError("--executor ray needs Ray", "pip install 'twice[ray]'") from None
    if not ray.is_initialized():
        ray.init(include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
    remote = ray.remote(num_cpus=1)(_check_remote)
    results = ray.get([remote.remote(rerun, s.start, s.end) for s in chosen])
    for segment, (identical, verdict, new_dir) in zip(chosen, results):
        segment.identical, segment.verdict, segment.rerun = identical, verdict, new_dir
    return chosen


def _check_remote(rerun: Rerun, start: int, end: int) -> tuple:
    checkpoints = _checkpoints(rerun.run_dir)
    segment = _check(
        rerun, Segment(start, end, checkpoints.get(start), checkpoints.get(end)), quiet=True
    )
    return segment.identical, segment.verdict, segment.rerun
