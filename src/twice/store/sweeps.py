"""sweep.json, a sweep folder's spec: its one reader and its writer's record, and where a sweep's
trials go."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from twice.core.errors import CorruptRecord, UsageError
from twice.store import reader
from twice.store.runs import check_run_name

__all__ = ["SWEEP_FILE", "SweepSpec", "read_sweep", "sweep_folder", "SETTING_NAME"]

SWEEP_FILE = "sweep.json"
SETTING_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def sweep_folder(
    runs_dir: Path,
    grid: dict[str, list[str]],
    name: str | None = None,
    seeds: int = 1,
    command: list[str] | None = None,
) -> Path:
    """Where a sweep's trials go: `name` under runs_dir (one plain folder name: never a path out
    of it), else a name made from the varied settings and a digest of the whole sweep (grid,
    seeds, command): the same sweep run again continues in its folder, and another sweep over
    the same settings never lands in it (`sweep-lr-3f2a9c1e`)."""
    if name is not None:
        check_run_name(name)
        return Path(runs_dir) / name

    import xxhash

    spec = json.dumps([grid, seeds, command or []], sort_keys=True)
    label = re.sub(r"[^A-Za-z0-9_.=-]", "_", "sweep-" + "-".join(grid))
    return Path(runs_dir) / f"{label}-{xxhash.xxh32_hexdigest(spec.encode())}"


@dataclass(frozen=True)
class SweepSpec:
    """sweep.json: the grid, the number of seeds, the command and the metric of a sweep."""

    grid: dict[str, list[str]]
    seeds: int
    command: list[str]
    metric: str = "final_loss"

    def to_json(self) -> dict:
        """As written to sweep.json."""
        return {
            "grid": self.grid,
            "seeds": self.seeds,
            "command": self.command,
            "metric": self.metric,
        }

    @classmethod
    def from_json(cls, data: object, where: Path) -> SweepSpec:
        """The spec from sweep.json's value; anything else is a CorruptRecord."""
        ok = (
            isinstance(data, dict)
            and isinstance(data.get("grid"), dict)
            and all(
                isinstance(k, str)
                and SETTING_NAME.match(k)
                and isinstance(v, list)
                and v
                and all(isinstance(x, str) for x in v)
                for k, v in data["grid"].items()
            )
            and type(data.get("seeds")) is int
            and 1 <= data["seeds"] <= 100_000
            and isinstance(data.get("command"), list)
            and data["command"]
            and all(isinstance(x, str) for x in data["command"])
            and isinstance(data.get("metric", "final_loss"), str)
        )
        if not ok:
            raise CorruptRecord(
                f"{where} is not a sweep spec: expected grid (names to lists of values), seeds "
                "(a count), command (a list of strings) and metric (a name)",
                "the sweep folder is damaged or was edited; run the sweep again into a new folder",
            )
        return cls(data["grid"], data["seeds"], data["command"], data.get("metric", "final_loss"))


def read_sweep(folder: Path) -> SweepSpec:
    """The validated spec of the sweep in `folder`."""
    path = Path(folder) / SWEEP_FILE
    try:
        data = reader.read_json(path)
    except FileNotFoundError:
        raise UsageError(
            f"{folder} is not a sweep folder (it has no {SWEEP_FILE})",
            "pass the folder `twice sweep` printed",
        ) from None
    except OSError as exc:
        raise CorruptRecord(
            f"cannot read {path}: {exc.strerror or exc}", "the sweep folder is damaged"
        ) from None
    return SweepSpec.from_json(data, path)
