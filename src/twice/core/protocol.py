"""The launcher <-> child contract: every TWICE_* variable, those `twice run` sets for its command
and the few a user sets.

The launcher builds a `ChildSettings` and writes it with `to_env()`; each process of the command
(the bootstrap, twice.Run, the data loader, twice.log_metric) reads it back with `from_env()`, or
one setting with `read()` (the device fold's TWICE_NO_TRITON, portable mode's TWICE_NO_FUSED_RNN).
Nothing else in twice spells a TWICE_* name. Pure: both directions work on plain mappings.

    >>> env = ChildSettings(run_dir="/runs/a", seed=3, trace_every=2).to_env()
    >>> ChildSettings.from_env(env).seed
    3
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field

from twice.core.errors import UsageError

__all__ = ["ChildSettings", "parse_steps", "PER_RUN", "PREFIX"]

PREFIX = "TWICE_"


@dataclass(frozen=True)
class ChildSettings:
    """What one recorded command's processes are told; each field is one TWICE_* variable."""

    run_dir: str | None = field(default=None, metadata={"env": "TWICE_RUN_DIR"})
    """The run folder the processes record into (none: not under `twice run`)."""
    seed: int | None = field(default=None, metadata={"env": "TWICE_SEED"})
    """The root seed of every RNG (none under --observe)."""
    determinism: str | None = field(default=None, metadata={"env": "TWICE_DETERMINISM"})
    """strict, warn or off: the deterministic mode the bootstrap switches on (none: strict)."""
    observe: bool = field(default=False, metadata={"env": "TWICE_OBSERVE"})
    """Record only: no seeding, no deterministic mode."""
    trace: bool = field(default=True, metadata={"env": "TWICE_TRACE"})
    """Install the step recorder (off for `twice audit`'s own passes)."""
    trace_every: int = field(default=1, metadata={"env": "TWICE_TRACE_EVERY"})
    """Record every N-th step."""
    params_every: int | None = field(default=None, metadata={"env": "TWICE_PARAMS_EVERY"})
    """Per-tensor digests every N steps (none: automatic)."""
    full_every: int | None = field(default=None, metadata={"env": "TWICE_FULL_EVERY"})
    """Digests of the parameters as whole tensors (DTensors gathered) every N steps (none: no)."""
    stop_after: int | None = field(default=None, metadata={"env": "TWICE_STOP_AFTER"})
    """End the command after this many steps."""
    record_ops: str | None = field(default=None, metadata={"env": "TWICE_RECORD_OPS"})
    """Steps whose every operation is logged ("3,10-12")."""
    numerics: str | None = field(default=None, metadata={"env": "TWICE_NUMERICS"})
    """The full numerics watch: "stop" or "warn"."""
    portable: str | None = field(default=None, metadata={"env": "TWICE_PORTABLE"})
    """Portable mode (twice.portable) and its policy for uncovered ops: "strict", "warn" or
    "audit" (list them silently)."""
    checkpoint_dir: str | None = field(default=None, metadata={"env": "TWICE_CHECKPOINT_DIR"})
    """Where twice.checkpoint_dir() points: the run's checkpoints/ by default."""
    resume_from: str | None = field(default=None, metadata={"env": "TWICE_RESUME_FROM"})
    """The checkpoint twice.Run.resume() starts from."""
    trace_steps: str | None = field(default=None, metadata={"env": "TWICE_TRACE_STEPS"})
    """Record only these steps ("4,7"): bisection's replays fingerprint one step each."""
    dump_op: str | None = field(default=None, metadata={"env": "TWICE_DUMP_OP"})
    """"STEP:INDEX": save that op's outputs (twice locate)."""
    replica_every: int = field(default=20, metadata={"env": "TWICE_REPLICA_EVERY", "user": True})
    """Compare data-parallel replicas' parameters every N steps (the user may set it)."""
    replica_mode: str = field(default="stop", metadata={"env": "TWICE_REPLICA_MODE", "user": True})
    """On a replica desync: "stop" or "warn" (the user may set it)."""
    no_triton: bool = field(default=False, metadata={"env": "TWICE_NO_TRITON", "user": True})
    """Digest CUDA tensors with torch's operations, not the Triton fold kernel (the user's)."""
    no_fused_rnn: bool = field(default=False, metadata={"env": "TWICE_NO_FUSED_RNN", "user": True})
    """Portable mode runs nn.LSTM op by op, not as one operation per layer (the user's)."""

    def to_env(self) -> dict[str, str]:
        """The variables to set: each field that differs from its default."""
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value == f.default:
                continue
            out[f.metadata["env"]] = (
                ("1" if value else "0") if isinstance(value, bool) else str(value)
            )
        return out

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> ChildSettings:
        """Read the settings back; a malformed value is a UsageError naming the variable."""
        values = {}
        for name in _fields():
            value = cls.read(environ, name)
            if value is not None:
                values[name] = value
        return cls(**values)

    @classmethod
    def read(cls, environ: Mapping[str, str], name: str):
        """One setting by field name, None where its variable is unset: for code that needs one
        value often (twice.stream, twice.log_metric), without reading every variable."""
        env, kind = _fields()[name]
        raw = environ.get(env)
        if raw is None or raw == "" or (raw == "auto" and name == "params_every"):
            return None
        if kind == "bool":
            return raw == "1"
        if kind == "int":
            try:
                return int(raw)
            except ValueError:
                raise UsageError(
                    f"{env}={raw!r} is not an integer", f"unset {env}, or set it to a whole number"
                ) from None
        return raw

    @classmethod
    def variables(cls, *, launcher_only: bool = False) -> tuple[str, ...]:
        """Every variable of the contract (with launcher_only, those the user may not set)."""
        return tuple(
            f.metadata["env"]
            for f in dataclasses.fields(cls)
            if not (launcher_only and f.metadata.get("user"))
        )

    @property
    def only_steps(self) -> set[int] | None:
        """The steps to record (bisection's replays), or None for every step."""
        return parse_steps(self.trace_steps) if self.trace_steps else None

    @property
    def dump_ops(self) -> dict[int, int]:
        """{STEP: INDEX}: the op whose outputs `twice locate` asked to save."""
        if not self.dump_op:
            return {}
        step, _, index = self.dump_op.partition(":")
        return {int(step): int(index)}


_FIELDS: dict[str, tuple[str, str]] = {}


def _fields() -> dict[str, tuple[str, str]]:
    """field name -> (variable, "bool" | "int" | "str"), from the annotations, made once."""
    if not _FIELDS:
        for f in dataclasses.fields(ChildSettings):
            kind = str(f.type).split(" ")[0]
            _FIELDS[f.name] = (f.metadata["env"], kind if kind in ("bool", "int") else "str")
    return _FIELDS


# Variables that describe one run and must not leak from an outer `twice run` into a new one.
PER_RUN = (
    "TWICE_CHECKPOINT_DIR",
    "TWICE_RESUME_FROM",
    "TWICE_STOP_AFTER",
    "TWICE_RECORD_OPS",
    "TWICE_DUMP_OP",
    "TWICE_NUMERICS",
    "TWICE_TRACE_STEPS",
)


def parse_steps(value: str) -> set[int]:
    """Step numbers from "3,10-12" (the --record-ops form)."""
    steps: set[int] = set()
    for part in filter(None, value.split(",")):
        if "-" in part:
            first, last = part.split("-")
            steps.update(range(int(first), int(last) + 1))
        else:
            steps.add(int(part))
    return steps
