"""Metrics a training script reports to twice (`twice.log_metric`), and metrics read from a run."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

from twice.core.errors import UsageError
from twice.core.protocol import ChildSettings
from twice.store.traces import read_trace

__all__ = ["log_metric", "metrics_path", "read_metric", "TRACE_METRICS"]

METRICS = "metrics.jsonl"
TRACE_METRICS = ("final_loss", "best_loss")


def metrics_path() -> Path | None:
    """Where this run's metrics go (a file a script may also write itself: metrics.json beside it)."""
    run_dir = ChildSettings.from_env(os.environ).run_dir
    return Path(run_dir) / METRICS if run_dir else None


def log_metric(name: str, value: float, step: int | None = None) -> None:
    """Record a metric of this run (the last value logged under a name is the run's value).

    Outside `twice run` this does nothing, so scripts can call it unconditionally.
    """
    path = metrics_path()
    if path is None:
        return
    record = {"name": str(name), "value": float(value), "step": step, "time": time.time()}
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(record, sort_keys=True) + "\n")
        handle.flush()


def _losses(run_dir: Path) -> list[float]:
    values = []
    for record in read_trace(Path(run_dir) / "trace.jsonl"):
        loss = record.loss[0] if isinstance(record.loss, list) else record.loss
        if loss is not None:
            values.append(float("nan") if str(loss).startswith("nan") else float.fromhex(loss))
    return values


def read_metric(run_dir: Path, name: str) -> float | None:
    """A run's value of metric `name`: logged by the script, in its metrics.json, or from its trace."""
    run_dir = Path(run_dir)
    logged = None
    if (run_dir / METRICS).is_file():
        for line in (run_dir / METRICS).read_text().splitlines():
            record = json.loads(line)
            if record["name"] == name:
                logged = record["value"]
    if logged is not None:
        return logged
    if (run_dir / "metrics.json").is_file():
        data = json.loads((run_dir / "metrics.json").read_text())
        if name in data:
            return float(data[name])
    if name in TRACE_METRICS:
        losses = [x for x in _losses(run_dir) if not math.isnan(x)]
        if not losses:
            return None
        return losses[-1] if name == "final_loss" else min(losses)
    return None


def available_metrics(run_dir: Path) -> set[str]:
    names = set(TRACE_METRICS)
    run_dir = Path(run_dir)
    if (run_dir / METRICS).is_file():
        names |= {
            json.loads(line)["name"]
            for line in (run_dir / METRICS).read_text().splitlines()
            if line
        }
    if (run_dir / "metrics.json").is_file():
        names |= set(json.loads((run_dir / "metrics.json").read_text()))
    return names


def require_metric(run_dirs: list[Path], name: str) -> None:
    known = (
        set().union(*(available_metrics(d) for d in run_dirs)) if run_dirs else set(TRACE_METRICS)
    )
    if name not in known:
        raise UsageError(
            f"unknown metric {name!r}", f"this sweep's runs have: {', '.join(sorted(known))}"
        )
