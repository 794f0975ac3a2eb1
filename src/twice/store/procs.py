"""procs/<pid>.json: what one Python process of a run recorded at its exit (its sources, torch
facts, determinism settings, steps, distributed rank), with its one reader.

The launcher folds these into the manifest when the command ends; a record a process left
damaged (killed mid-write, edited) must not take the run's manifest down with it, so the reader
validates every field twice reads and the caller skips what it refuses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from twice.core.errors import CorruptRecord
from twice.store import reader
from twice.store.layout import RunFolder

__all__ = ["ProcessRecord", "read_process", "read_processes"]


def _count(value: Any) -> bool:
    return value is None or (type(value) is int and 0 <= value < 2**63)


def _time(value: Any) -> bool:
    return value is None or (type(value) in (int, float) and math.isfinite(value) and value >= 0)


def _distributed(value: Any) -> bool:
    return value is None or (
        isinstance(value, dict)
        and _count(value.get("rank"))
        and type(value.get("world_size", 1)) is int
        and value.get("world_size", 1) >= 1
        and (value.get("backend") is None or isinstance(value.get("backend"), str))
        and _sharding(value.get("sharding"))
    )


def _sharding(value: Any) -> bool:
    """None, or {"meshes": [text], "placements": {name: text}} (record/sharding.py)."""
    return value is None or (
        isinstance(value, dict)
        and isinstance(value.get("meshes"), list)
        and all(isinstance(m, str) for m in value["meshes"])
        and isinstance(value.get("placements"), dict)
        and all(isinstance(p, str) for p in value["placements"].values())
    )


_EVENTS = ("batches", "backward_calls", "optimizer_steps", "steps")


def _events(value: Any) -> bool:
    return value is None or (
        isinstance(value, dict) and all(_count(value.get(key, 0)) for key in _EVENTS)
    )


def _determinism(value: Any) -> bool:
    return value is None or (
        isinstance(value, dict)
        and isinstance(value.get("settings", {}), dict)
        and all(
            isinstance(setting, dict)
            and "in_effect" in setting
            and (setting.get("reason") is None or isinstance(setting["reason"], str))
            for setting in value.get("settings", {}).values()
        )
    )


def _portable(value: Any) -> bool:
    return value is None or (
        isinstance(value, dict)
        and isinstance(value.get("uncovered", []), list)
        and isinstance(value.get("compiled_eagerly", 0), int)
        and all(
            isinstance(entry, dict)
            and isinstance(entry.get("op"), str)
            and isinstance(entry.get("count", 0), int)
            for entry in value.get("uncovered", [])
        )
    )


def _seeding(value: Any) -> bool:
    """None, or {"calls": [{api, site, calls, values, entropy}], "watched": [api]}
    (runtime/seedcalls.py)."""
    return value is None or (
        isinstance(value, dict)
        and isinstance(value.get("watched"), list)
        and all(isinstance(api, str) for api in value["watched"])
        and isinstance(value.get("calls"), list)
        and all(
            isinstance(call, dict)
            and isinstance(call.get("api"), str)
            and isinstance(call.get("site"), str)
            and type(call.get("calls")) is int
            and call["calls"] >= 1
            and type(call.get("entropy")) is int
            and 0 <= call["entropy"] <= call["calls"]
            and (call.get("values") is None or isinstance(call.get("values"), str))
            for call in value["calls"]
        )
    )


_FIELDS = {
    "started": _time,
    "ended": _time,
    "sources": lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
    "steps": _count,
    "stopped_after": _count,
    "trace_cost_s": _time,
    "distributed": _distributed,
    "events": _events,
    "determinism": _determinism,
    "portable": _portable,
    "seeding": _seeding,
    "torch": lambda v: v is None or isinstance(v, dict),
    "torch_runtime": lambda v: v is None or isinstance(v, dict),
    "reads": lambda v: (
        v is None
        or (
            isinstance(v, dict)
            and all(
                isinstance(path, str)
                and isinstance(facts, list)
                and len(facts) == 3
                and all(_count(n) and n is not None for n in facts)
                for path, facts in v.items()
            )
        )
    ),
}


@dataclass(frozen=True)
class ProcessRecord:
    """One process's record, validated: the fields the manifest takes from it."""

    started: float | None
    ended: float | None
    sources: list[str]
    steps: int | None
    stopped_after: int | None
    trace_cost_s: float | None
    distributed: dict | None
    determinism: dict | None
    torch: dict | None
    torch_runtime: dict
    events: dict | None = None  # what the recorder's hooks saw (Recorder.events)
    portable: dict | None = None  # portable mode's policy and the ops it did not cover
    reads: dict | None = None  # runtime/reads.py: path -> [size, mtime_ns, inode] when opened
    seeding: dict | None = None  # runtime/seedcalls.py: the script's own seeding calls

    @classmethod
    def from_json(cls, data: Any, where: str) -> ProcessRecord:
        """The record from its file's JSON value; a field of the wrong shape is a CorruptRecord."""
        if not isinstance(data, dict):
            raise CorruptRecord(f"{where} is not a process record (not a JSON object)")
        for key, test in _FIELDS.items():
            if not test(data.get(key, [] if key == "sources" else None)):
                raise CorruptRecord(
                    f"{where} is not a process record: '{key}' has the wrong shape",
                    "the process was killed while writing it, or the file was edited",
                )
        return cls(
            data.get("started"),
            data.get("ended"),
            data.get("sources", []),
            data.get("steps"),
            data.get("stopped_after"),
            data.get("trace_cost_s"),
            data.get("distributed"),
            data.get("determinism"),
            data.get("torch"),
            data.get("torch_runtime") or {},
            data.get("events"),
            data.get("portable"),
            data.get("reads"),
            data.get("seeding"),
        )


def read_process(path: Path) -> ProcessRecord:
    """The validated record in `path`; unreadable or malformed is a CorruptRecord."""
    try:
        data = reader.read_json(Path(path), within=Path(path).parent.parent)
    except OSError as exc:
        raise CorruptRecord(f"cannot read {path}: {exc.strerror or exc}") from None
    return ProcessRecord.from_json(data, str(path))


def read_processes(run_dir: Path) -> tuple[list[ProcessRecord], list[str]]:
    """(the records of every process of the run, by start time; the names of those refused)."""
    records, refused = [], []
    for path in RunFolder(run_dir).proc_records():
        try:
            records.append(read_process(path))
        except CorruptRecord:
            refused.append(path.name)
    records.sort(key=lambda record: record.started or 0)
    return records, refused
