"""`twice verify`: run a recorded command again with its recorded seed and settings, and compare."""

from __future__ import annotations

from pathlib import Path

from .capture import numeric_env
from .compare import Comparison, compare_runs
from .errors import UsageError
from .launch import RunOptions, run_command
from .store import MANIFEST, read_json

__all__ = ["verify_run"]


def verify_run(run_dir: Path, steps: int | None = None, quiet: bool = False) -> tuple[Comparison, Path]:
    """Re-execute the run in `run_dir` into a new run beside it; compare the first `steps` steps (or all)."""
    run_dir = Path(run_dir)
    manifest = read_json(run_dir / MANIFEST)
    identity, context = manifest["identity"], manifest["context"]
    if steps is not None and steps < 1:
        raise UsageError(f"--steps must be at least 1, not {steps}", "give the number of steps to verify")
    recorded_env = identity.get("env", {})
    import os

    # The re-run gets the recorded numerics-relevant variables and none that the original lacked.
    unset = tuple(k for k in numeric_env(dict(os.environ)) if k not in recorded_env)
    options = RunOptions(
        seed=identity.get("seed") if identity.get("seed") is not None else 0,
        name=f"verify-{run_dir.name[:26]}"[:100],
        runs_dir=run_dir.parent.resolve(),
        determinism=identity.get("determinism", {}).get("mode", "strict") if not identity.get("observe") else "strict",
        observe=bool(identity.get("observe")),
        trace_every=context.get("trace_every") or 1,
        params_every=context.get("params_every"),
        stop_after=steps,
        env=dict(recorded_env),
        unset_env=unset,
        cwd=Path(context.get("cwd", ".")),
        quiet=quiet,
    )
    if not options.cwd.is_dir():
        raise UsageError(f"the run's folder {options.cwd} no longer exists", "verify on the machine and checkout it was recorded in")
    _, new_dir = run_command(list(identity["argv"]), options)
    return compare_runs(run_dir, new_dir, steps=steps), new_dir
