"""`twice sweep`: a grid of settings times seeds, each trial a full recorded run, paired by seed."""

from __future__ import annotations

import math
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

from filelock import FileLock, Timeout

from twice.app.launch import RunOptions, run_command
from twice.app.sweepplan import Trial, parse_vary, plan_trials
from twice.core.errors import Exit, TwiceError, UsageError
from twice.store.layout import RunFolder
from twice.store.runs import effective_status, read_manifest, write_json_atomic
from twice.store.sweeps import SWEEP_FILE, SweepSpec, read_sweep

__all__ = [
    "parse_vary",
    "Trial",
    "plan_trials",
    "run_sweep",
    "sweep_results",
    "read_sweep",
    "SweepSpec",
    "SWEEP_FILE",
]


def _claim(trials_dir: Path, trial: Trial) -> FileLock | None:
    """Claim `trial` for this process: an OS lock (released if the process dies), taken without
    waiting; None when another sweep holds it or the trial completed meanwhile."""
    locks = trials_dir.parent / ".claims"
    locks.mkdir(parents=True, exist_ok=True)
    claim = FileLock(locks / f"{trial.name}.lock")
    try:
        claim.acquire(timeout=0)
    except Timeout:
        return None
    if trial.name in _completed(trials_dir):
        claim.release()
        return None
    return claim


def _completed(trials_dir: Path) -> dict[str, Path]:
    done: dict[str, Path] = {}
    if not trials_dir.is_dir():
        return done
    for run_dir in sorted(trials_dir.iterdir()):
        manifest = RunFolder(run_dir).manifest
        if manifest.is_file() and effective_status(read_manifest(run_dir)) == "completed":
            name = run_dir.name.split("-", 4)[-1]  # drop the time-and-random id prefix
            done[name] = run_dir
    return done


@dataclass
class SweepOutcome:
    """What a sweep did: trials completed (and of those, skipped as done before), failed,
    interrupted."""

    folder: Path
    completed: int
    failed: list[str] = field(default_factory=list)
    skipped: int = 0
    interrupted: bool = False
    elsewhere: int = 0  # trials another `twice sweep` on the same folder ran

    @property
    def exit_code(self) -> int:
        """The command's exit code: 0 when nothing differs or failed, 1 otherwise."""
        return Exit.INTERRUPTED if self.interrupted else (Exit.DIFFER if self.failed else Exit.SAME)

    def to_json(self) -> dict:
        """As plain JSON values (what `--json` prints)."""
        return {
            "folder": str(self.folder),
            "completed": self.completed,
            "skipped": self.skipped,
            "failed": self.failed,
            "elsewhere": self.elsewhere,
            "interrupted": self.interrupted,
        }

    def record(self, trial: Trial, code: int | None) -> None:
        """Count one trial's outcome (None: another sweep on the folder claimed it)."""
        if code is None:
            self.elsewhere += 1
        elif code == 0:
            self.completed += 1
        else:
            self.failed.append(
                f"{trial.arm_label} seed {trial.seed} (exit {code})"
                + _failure_tail(self.folder / "trials", trial.name)
            )


def _failure_tail(trials_dir: Path, name: str, lines: int = 5) -> str:
    """The last lines of a failed trial's stderr and the path of its log, indented under it."""
    from twice.store.runs import run_name

    tried = sorted(p for p in trials_dir.glob(f"*-{name}") if run_name(p) == name)
    if not tried:
        return ""
    log = RunFolder(tried[-1]).stderr
    from twice.core.errors import CorruptRecord
    from twice.store.reader import read_tail

    try:  # the log's end only: a trial may have written gigabytes
        tail = read_tail(log, 1 << 16).decode("utf-8", errors="replace").splitlines()[-lines:]
    except (OSError, CorruptRecord):
        tail = []
    shown = "".join(f"\n      | {line}" for line in tail)
    return f"{shown}\n      log: {log}"


def _ray_trial(command: list[str], options: dict) -> int:
    """One trial inside a Ray worker: a full `twice run` (the sweep folder must be on a shared
    filesystem)."""
    from twice.app.launch import RunOptions, run_command

    options = {**options, "runs_dir": Path(options["runs_dir"]), "cwd": Path(options["cwd"])}
    code, _ = run_command(command, RunOptions(**options))
    return code


def _run_on_ray(
    trials: list[Trial],
    base: RunOptions,
    trials_dir: Path,
    command: list[str],
    address: str | None,
    jobs: int,
    outcome: SweepOutcome,
    report,
) -> None:
    """Run `trials` as Ray tasks, `jobs` at a time, each with `base`'s options."""
    import os
    from dataclasses import asdict, replace

    def submit_options(trial: Trial) -> dict:
        chosen = replace(
            base,
            seed=trial.seed,
            name=trial.name,
            runs_dir=trials_dir.resolve(),
            quiet=True,
            cwd=Path(base.cwd or os.getcwd()).resolve(),
        )
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(chosen).items()}

    try:
        import ray
    except ImportError as exc:  # the `ray` extra
        raise UsageError("--executor ray needs Ray", "pip install 'twice[ray]'") from exc
    if not ray.is_initialized():
        ray.init(
            address=address, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True
        )
    remote = ray.remote(num_cpus=1)(_ray_trial)
    pending: dict = {}
    queue = list(trials)
    try:
        while queue or pending:
            while queue and len(pending) < jobs:
                trial = queue.pop(0)
                pending[remote.remote(trial.command(command), submit_options(trial))] = trial
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=0.5)
            for ref in ready:
                outcome.record(pending.pop(ref), ray.get(ref))
            report()
    except KeyboardInterrupt:
        outcome.interrupted = True
        for ref in pending:
            ray.cancel(ref, force=True)


def run_sweep(
    folder: Path,
    grid: dict[str, list[str]],
    seeds: int,
    command: list[str],
    *,
    jobs: int = 1,
    options: RunOptions | None = None,
    metric: str = "final_loss",
    progress=None,
    executor: str = "local",
    ray_address: str | None = None,
) -> SweepOutcome:
    """Run every trial not completed yet into `folder`/trials; re-running retries failures and
    skips successes."""
    trials = plan_trials(grid, seeds, command)
    folder = Path(folder)
    _write_spec(folder, SweepSpec(grid, seeds, list(command), metric))
    trials_dir = folder / "trials"
    done = _completed(trials_dir)
    todo = [t for t in trials if t.name not in done]
    outcome = SweepOutcome(
        folder, completed=len(trials) - len(todo), skipped=len(trials) - len(todo)
    )
    base = options or RunOptions(quiet=True)
    state = {"running": 0, "durations": []}
    lock = threading.Lock()

    def one(trial: Trial) -> tuple[Trial, int]:
        from dataclasses import replace

        claim = _claim(trials_dir, trial)
        if claim is None:  # another `twice sweep` on this folder runs it, or has completed it
            return trial, None
        with lock:
            state["running"] += 1
        start = time.time()
        try:
            code, _ = run_command(
                trial.command(command),
                replace(
                    base,
                    seed=trial.seed,
                    name=trial.name,
                    runs_dir=trials_dir.resolve(),
                ),
            )
        finally:
            claim.release()
            with lock:
                state["running"] -= 1
                state["durations"].append(time.time() - start)
        return trial, code

    def report():
        if progress is not None:
            durations = state["durations"]
            remaining = len(trials) - outcome.completed - len(outcome.failed)
            eta = (
                (sum(durations) / len(durations)) * remaining / max(jobs, 1) if durations else None
            )
            progress(
                done=outcome.completed,
                total=len(trials),
                running=state["running"],
                failed=len(outcome.failed),
                eta=eta,
            )

    if executor == "ray":
        report()
        _run_on_ray(todo, base, trials_dir, command, ray_address, max(1, jobs), outcome, report)
        return outcome
    if executor != "local":
        raise UsageError(f"unknown executor {executor!r}", "use local or ray")
    _run_here(todo, one, jobs, outcome, report)
    return outcome


def _write_spec(folder: Path, spec: SweepSpec) -> None:
    """Write the sweep's spec into `folder`, or refuse a folder that holds another sweep's."""
    folder.mkdir(parents=True, exist_ok=True)
    # One sweep spec per folder: a second `twice sweep` on it checks the spec under the lock.
    with FileLock(folder / ".sweep.lock"):
        if (folder / SWEEP_FILE).is_file():
            recorded = read_sweep(folder)
            ours = (spec.grid, spec.seeds, spec.command)
            if (recorded.grid, recorded.seeds, recorded.command) != ours:
                raise UsageError(
                    f"{folder} holds a different sweep",
                    "use another --name, or the same --vary/--seeds/command",
                )
        write_json_atomic(folder / SWEEP_FILE, spec.to_json())


def _run_here(trials: list[Trial], one, jobs: int, outcome: SweepOutcome, report) -> None:
    """Run `trials` in this process's threads, `jobs` at a time, each through `one`."""
    pool = ThreadPoolExecutor(max_workers=max(1, jobs))
    pending: set[Future] = set()
    queue = list(trials)
    try:
        report()
        while queue or pending:
            while queue and len(pending) < jobs:
                pending.add(pool.submit(one, queue.pop(0)))
            finished, pending = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
            for future in finished:
                outcome.record(*future.result())
            report()
    except KeyboardInterrupt:
        # The terminal's Ctrl-C reached the running trials too; completed trials stay as they are.
        outcome.interrupted = True
        for future in pending:
            future.cancel()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def sweep_results(
    folder: Path, metric: str | None = None
) -> tuple[dict, dict[str, dict[int, float]]]:
    """(the sweep spec, {arm label: {seed: metric value}}) from completed trials."""
    from twice.store.metrics import read_metric, require_metric

    folder = Path(folder)
    spec = read_sweep(folder)
    metric = metric or spec.metric
    trials = plan_trials(spec.grid, spec.seeds, spec.command)
    done = _completed(folder / "trials")
    require_metric(list(done.values()), metric)
    values: dict[str, dict[int, float]] = {}
    for trial in (t for t in trials if t.name in done):
        value = read_metric(done[trial.name], metric)
        if value is not None and not math.isfinite(value):
            raise TwiceError(
                f"trial {trial.name}'s {metric} is {value}: an effect against seed noise cannot "
                "be judged from a non-finite value",
                f"see `twice nan {done[trial.name]}`; fix the run, or compare another metric",
            )
        if value is not None:
            values.setdefault(trial.arm_label, {})[trial.seed] = value
    return {**spec.to_json(), "metric": metric}, values
