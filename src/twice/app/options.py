"""`twice run`'s options as one record: what launch, verify, sweep and twice.Run start a run
with."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["RunOptions", "DEFAULT_SEED", "root_seed"]

# The documented default: two plain `twice run`s of a script compare equal.
DEFAULT_SEED = 0


def root_seed(seed: int | None) -> int:
    """The root seed of the runs a command starts: `--seed` where given, else DEFAULT_SEED (the
    command line's one `--seed` defaults to None, "not given")."""
    return DEFAULT_SEED if seed is None else seed


@dataclass
class RunOptions:
    """Everything `twice run` takes besides the command; each field is one command-line option."""

    seed: int = DEFAULT_SEED
    """The root seed given to every RNG (ignored with observe)."""
    name: str | None = None
    """A label appended to the run id."""
    runs_dir: Path = Path("runs")
    """Where run folders are created."""
    determinism: str = "strict"
    """strict: refuse what cannot be made deterministic; warn: warn instead; off: seed only."""
    observe: bool = False
    """Record only: no seeding, no deterministic mode, no environment changes."""
    trace_every: int = 1
    """Record every N-th step."""
    params_every: int | None = None
    """Per-tensor digests every N steps (None: auto, see record/stepdata.py AUTO_PARAMS_TENSORS)."""
    full_every: int | None = None
    """Placement-independent digests of the parameters every N steps (None: never)."""
    stop_after: int | None = None
    """Stop the command after this many steps (used by `twice verify --steps`)."""
    env: dict[str, str] = field(default_factory=dict)
    """Variables to set in the child besides the launcher's own (used by verify)."""
    unset_env: tuple[str, ...] = ()
    """Variables to remove from the child's environment (used by verify)."""
    cwd: Path | None = None
    """Where to run the command (default: here)."""
    quiet: bool = False
    """Save the command's output without also echoing it."""
    expected_steps: int | None = None
    """How many steps the run should take, for progress displays (a re-run: the original's)."""
    numerics: str | None = None
    """Full numerics watch in the command: "stop" at the first NaN/Inf, or "warn"."""
    portable: str | None = None
    """Portable mode and its policy for uncovered ops ("strict", "warn", "audit"), or None."""
    record_ops: str | None = None
    """Steps whose every operation is recorded into ops/ (e.g. "3,10-12")."""
    resume_from: Path | None = None
    """A checkpoint (or checkpoints folder) that twice.Run.resume() in the command starts from."""
    inputs: tuple[str, ...] = ()
    """Folders besides the working folder whose files the run reads are recorded."""
    inputs_exclude: tuple[str, ...] = ()
    """Folders whose files are not recorded as inputs."""
    live: Any = None
    """Something told of the run as it goes: live.start(run_dir) once the command started,
    live.finish(run_dir) after its manifest is final (twice run --mlflow)."""
