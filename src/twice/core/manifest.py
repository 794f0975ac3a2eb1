"""The run's manifest: an identity (what decides the result, compared) and a context (never compared)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Difference", "compare_identity", "GROUPS", "group_of"]

# The order in which difference groups are reported, and which identity keys fall in each.
GROUPS = (
    "code",
    "arguments",
    "packages",
    "hardware",
    "threads",
    "environment",
    "determinism",
    "seeds",
)
_GROUP_OF_TOP = {
    "code": "code",
    "argv": "arguments",
    "config": "arguments",
    "command": "arguments",
    "packages": "packages",
    "python": "packages",
    "torch": "packages",
    "cpu": "hardware",
    "gpus": "hardware",
    "os": "hardware",
    "cuda_devices": "hardware",
    "threads": "threads",
    "env": "environment",
    "determinism": "determinism",
    "seed": "seeds",
    "observe": "determinism",
    "distributed": "hardware",
}
_THREAD_ENV = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
)


@dataclass(frozen=True)
class Difference:
    """One identity value that differs between two runs (`missing` where a side lacks it)."""

    group: str
    key: str
    a: Any
    b: Any

    def to_json(self) -> dict:
        return {"group": self.group, "key": self.key, "a": self.a, "b": self.b}


def _flatten(value: Any, prefix: str, out: dict[str, Any]) -> None:
    if isinstance(value, dict):
        for key, item in value.items():  # an empty dict adds nothing: {} and a missing key agree
            _flatten(item, f"{prefix}.{key}" if prefix else str(key), out)
    else:
        out[prefix] = value


def group_of(key: str) -> str:
    top = key.split(".", 1)[0]
    if top == "env" and key.split(".", 1)[-1] in _THREAD_ENV:
        return "threads"
    return _GROUP_OF_TOP.get(top, "environment")


_MISSING = "<missing>"


def compare_identity(a: dict, b: dict) -> list[Difference]:
    """Every identity value that differs, grouped (GROUPS order) and sorted by key within a group."""
    flat_a: dict[str, Any] = {}
    flat_b: dict[str, Any] = {}
    _flatten(a, "", flat_a)
    _flatten(b, "", flat_b)
    diffs = []
    for key in sorted(set(flat_a) | set(flat_b)):
        va, vb = flat_a.get(key, _MISSING), flat_b.get(key, _MISSING)
        if va != vb:
            diffs.append(Difference(group_of(key), key, va, vb))
    order = {g: i for i, g in enumerate(GROUPS)}
    return sorted(diffs, key=lambda d: (order.get(d.group, len(GROUPS)), d.key))
