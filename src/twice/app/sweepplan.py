"""A sweep's plan: the grid of `--vary` values times `--seeds` seeds, as trials, each with its own
command and run name."""

from __future__ import annotations

import itertools
import re
import string
from dataclasses import dataclass

from twice.core.errors import UsageError
from twice.store.sweeps import SETTING_NAME

__all__ = ["parse_vary", "Trial", "plan_trials"]


def parse_vary(specs: list[str]) -> dict[str, list[str]]:
    """`["lr=0.1,0.01", "wd=0,1e-4"]` -> {"lr": ["0.1", "0.01"], "wd": ["0", "1e-4"]}."""
    grid: dict[str, list[str]] = {}
    for spec in specs:
        name, sep, values = spec.partition("=")
        parts = [v.strip() for v in values.split(",")]
        if not sep or not SETTING_NAME.match(name) or not values or any(not v for v in parts):
            raise UsageError(
                f"--vary {spec!r} is not NAME=VALUE[,VALUE...]", "e.g. --vary lr=0.1,0.01"
            )
        if name in grid or name == "seed":
            raise UsageError(
                f"--vary {name} given twice or reserved",
                "vary each name once; {seed} is set by --seeds",
            )
        if len(set(parts)) != len(parts):
            raise UsageError(f"--vary {name} repeats a value", "list each value once")
        grid[name] = parts
    if not grid:
        raise UsageError("nothing to vary", "add --vary NAME=VALUE[,VALUE...]")
    return grid


def _placeholders(command: list[str]) -> set[str]:
    found = set()
    for part in command:
        for _, field_name, _, _ in string.Formatter().parse(part):
            if field_name:
                found.add(field_name)
    return found


@dataclass(frozen=True)
class Trial:
    """One run of the sweep: an arm (a point of the grid) and a seed."""

    arm: tuple[tuple[str, str], ...]
    seed: int

    @property
    def arm_label(self) -> str:
        """The arm's settings as one label (`lr=0.1,wd=0`), the same for every seed."""
        return ",".join(f"{k}={v}" for k, v in self.arm)

    @property
    def name(self) -> str:
        """The trial's run name: its arm and seed, safe as a folder name."""
        safe = re.sub(r"[^A-Za-z0-9_.=-]", "_", "_".join(f"{k}={v}" for k, v in self.arm))
        return f"{safe}-seed{self.seed}"

    def command(self, template: list[str]) -> list[str]:
        """The command with the arm's values and the seed put in for its placeholders."""
        values = {**dict(self.arm), "seed": str(self.seed)}
        return [part.format(**values) for part in template]


def plan_trials(grid: dict[str, list[str]], seeds: int, command: list[str]) -> list[Trial]:
    """Every (arm, seed) of the grid as a Trial, in a fixed order; bad placeholders are usage
    errors."""
    if seeds < 1:
        raise UsageError(
            f"--seeds must be at least 1, not {seeds}", "give the number of seeds per arm"
        )
    if not command:
        raise UsageError(
            "no command to run",
            "put the command after --, with {name} where each varied value goes",
        )
    used = _placeholders(command)
    missing = [name for name in grid if name not in used]
    if missing:
        raise UsageError(
            f"the command has no placeholder for {', '.join('{' + m + '}' for m in missing)}",
            f"put {' '.join('{' + m + '}' for m in missing)} where the value goes, e.g. --lr "
            f"{{{missing[0]}}}",
        )
    unknown = sorted(used - set(grid) - {"seed"})
    if unknown:
        raise UsageError(
            f"the command uses {', '.join('{' + u + '}' for u in unknown)}, which nothing varies",
            "add --vary for it, or escape literal braces as {{ }}",
        )
    arms = [tuple(zip(grid, values)) for values in itertools.product(*grid.values())]
    # Seed-major order: with few jobs, every arm gets its first seeds early (a paired design).
    return [Trial(arm, seed) for seed in range(seeds) for arm in arms]
