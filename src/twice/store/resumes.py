"""Where a run resumed: `resumed.json` in its run folder, written when a checkpoint is restored.

A verdict on a resumed run must say that it resumed, and from what: the steps before the
resumed one were never run in it, and a difference at the first resumed step points at what the
checkpoint failed to restore, not at nondeterminism.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from twice.core.errors import CorruptRecord
from twice.store import reader
from twice.store.files import write_json_atomic
from twice.store.layout import RunFolder

__all__ = ["Resume", "write_resume", "read_resume"]

_MAX_STEP = 2**63 - 1


@dataclass(frozen=True)
class Resume:
    """A restore of a checkpoint: its folder, and the step the run went on from."""

    checkpoint: str
    step: int

    @property
    def name(self) -> str:
        """The checkpoint's folder name (`step-00000004`), as verdicts print it."""
        return Path(self.checkpoint).name or self.checkpoint

    @classmethod
    def from_json(cls, data: Any, where: str) -> Resume:
        """The record from its file's JSON value; anything else is a CorruptRecord."""
        ok = (
            isinstance(data, dict)
            and set(data) == {"checkpoint", "step"}
            and isinstance(data["checkpoint"], str)
            and type(data["step"]) is int
            and 0 <= data["step"] <= _MAX_STEP
        )
        if not ok:
            raise CorruptRecord(
                f"{where} is not a resume record: expected an object with 'checkpoint' (a path) "
                "and 'step' (a whole number from 0)",
                "the run folder is damaged or was edited; re-record the run",
            )
        return cls(data["checkpoint"], data["step"])


def write_resume(run_dir: Path, checkpoint: str | Path, step: int) -> None:
    """Record that the run in `run_dir` restored `checkpoint` and goes on from `step`."""
    write_json_atomic(RunFolder(run_dir).resumed, {"checkpoint": str(checkpoint), "step": step})


def read_resume(run_dir: Path) -> Resume | None:
    """The run's resume record, validated; None for a run that did not resume."""
    path = RunFolder(run_dir).resumed
    try:
        data = reader.read_json(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise CorruptRecord(
            f"cannot read {path}: {type(exc).__name__}",
            "the run folder is damaged; re-record the run",
        ) from None
    return Resume.from_json(data, str(path))
