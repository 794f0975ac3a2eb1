"""Starting a recorded run's command again: the one way app/ re-runs a run folder, from the Rerun
the trust check admitted (app/trust.py).

verify, verify --segments, verify --resume-at, locate and bisect build their options here and start
here; none of them reads manifest.json to learn what to run (tests/e2e/test_rerun_door.py holds
it so).
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from twice.app.launch import portable_policy, run_command
from twice.app.options import RunOptions
from twice.app.trust import REPLAYED, Rerun
from twice.core.errors import UsageError
from twice.runtime.capture import numeric_env

__all__ = ["rerun_options", "start_rerun"]


def rerun_options(
    rerun: Rerun,
    *,
    name: str,
    steps: int | None = None,
    quiet: bool = False,
    record_ops: str | None = None,
) -> RunOptions:
    """The options that re-execute `rerun` as it was recorded, stopping after `steps` (or not)."""
    recorded_env = dict(rerun.env)
    # The re-run gets the recorded numerics-relevant variables and none that the original lacked.
    # Of the names a re-run replays, those the original lacked are removed; the rest of this
    # shell's environment (paths, caches, plugins: never replayed) is left as it is.
    unset = tuple(
        k for k in numeric_env(dict(os.environ)) if k in REPLAYED and k not in recorded_env
    )
    options = RunOptions(
        seed=rerun.seed,
        name=name[:100],
        runs_dir=rerun.run_dir.parent.resolve(),
        determinism=rerun.determinism if not rerun.observe else "strict",
        portable=portable_policy(rerun.determinism) if rerun.portable else None,
        observe=rerun.observe,
        trace_every=rerun.trace_every,
        params_every=rerun.params_every,
        full_every=rerun.full_every,
        stop_after=steps,
        env=recorded_env,
        unset_env=unset,
        cwd=Path(rerun.cwd),
        quiet=quiet,
        record_ops=record_ops,
        expected_steps=rerun.steps,
    )
    if not options.cwd.is_dir():
        raise UsageError(
            f"the run's folder {options.cwd} no longer exists",
            "re-run on the machine and checkout it was recorded in",
        )
    return options


def start_rerun(rerun: Rerun, options: RunOptions) -> tuple[int, Path]:
    """Run `rerun`'s command, in its folder, with `options` (from `rerun_options`, adjusted by
    the caller); (its exit code, the new run folder)."""
    if not isinstance(rerun, Rerun):  # a manifest or a command list: not admitted by the check
        raise TypeError(f"start_rerun takes a Rerun from app/trust.py, not {type(rerun).__name__}")
    return run_command(list(rerun.argv), replace(options, cwd=Path(rerun.cwd)))
