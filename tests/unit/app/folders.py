"""Run folders written by hand for the app tests: a manifest and a trace, in the forms twice
writes them, without running a command."""

from __future__ import annotations

from pathlib import Path

from twice.core.digests import digest, float_bits
from twice.core.records import StepRecord, record_line
from twice.store.files import write_json_atomic


def steps(losses: list[float], batch: str = "data", first: int = 0, every: int = 1) -> list:
    """One StepRecord per loss: its loss, a batch digest from `batch` and the step, and the
    parameters' digest from the loss (so a changed loss changes the parameters after it)."""
    return [
        StepRecord(
            step=first + i * every,
            loss=float_bits(loss),
            batch=digest((batch, first + i * every)),
            params=digest(("params", loss)),
            lr=[float_bits(0.1)],
        )
        for i, loss in enumerate(losses)
    ]


def write_run(
    folder: Path,
    records: list,
    *,
    every: int = 1,
    status: str = "completed",
    identity: dict | None = None,
    context: dict | None = None,
) -> Path:
    """A run folder at `folder` holding `records` as its main trace."""
    folder.mkdir(parents=True)
    manifest = {
        "identity": {"argv": ["python", "train.py"], "seed": 0, **(identity or {})},
        "context": {"status": status, "trace_every": every, "steps": len(records)}
        | (context or {}),
    }
    write_json_atomic(folder / "manifest.json", manifest)
    (folder / "trace.jsonl").write_bytes(b"".join(record_line(r) for r in records))
    return folder
