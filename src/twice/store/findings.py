"""locate-<run>.json: what `twice locate` found comparing two runs, kept in the first run's folder
for `twice report`, with its one reader."""

from __future__ import annotations

from pathlib import Path

from twice.core.errors import CorruptRecord
from twice.store import reader

__all__ = ["read_location"]


def read_location(path: Path) -> dict:
    """The validated finding in `path`: an object with the `sentence` locate printed, its `step`
    (a count or null) and its op `finding` (an object or null)."""
    value = reader.read_json(path, within=Path(path).parent)
    step = value.get("step") if isinstance(value, dict) else None
    if (
        not isinstance(value, dict)
        or not isinstance(value.get("sentence"), str)
        or not (step is None or (type(step) is int and step >= 0))
        or not (value.get("finding") is None or isinstance(value["finding"], dict))
    ):
        raise CorruptRecord(
            f"{path} is not a locate record (a sentence, a step, a finding)",
            "remove it, or run `twice locate` again",
        )
    return value
