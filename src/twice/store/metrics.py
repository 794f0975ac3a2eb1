"""Metrics a training script reports to twice (`twice.log_metric`), and metrics read from a run."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

from twice.core.errors import UsageError
from twice.core.protocol import ChildSettings
from twice.store.layout import RunFolder
from twice.store.traces import read_trace

__all__ = ["log_metric", "metrics_path", "read_metric", "TRACE_METRICS"]

TRACE_METRICS = ("final_loss", "best_loss")


def metrics_path() -> Path | None:
    """Where this run's metrics go (a file a script may also write itself: metrics.json beside
    it)."""
    run_dir = ChildSettings.read(os.environ, "run_dir")
    return RunFolder(run_dir).metrics if run_dir else None


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
    for record in read_trace(RunFolder(run_dir).trace()):
        loss = record.loss[0] if isinstance(record.loss, list) else record.loss
        if loss is not None:
            values.append(float("nan") if str(loss).startswith("nan") else float.fromhex(loss))
    return values


def read_metric(run_dir: Path, name: str) -> float | None:
    """A run's value of metric `name`: logged by the script, in its metrics.json, or from its
    trace."""
    run_dir = Path(run_dir)
    logged = None
    if RunFolder(run_dir).metrics.is_file():
        for line in RunFolder(run_dir).metrics.read_text().splitlines():
            record = json.loads(line)
            if record["name"] == name:
                logged = record["value"]
    if logged is not None:
        return logged
    if RunFolder(run_dir).final_metrics.is_file():
        data = json.loads(RunFolder(run_dir).final_metrics.read_text())
        if name in data:
            return float(data[name])
    if name in TRACE_METRICS:
        losses = [x for x in _losses(run_dir) if not math.isnan(x)]
        if not losses:
            return None
        return losses[-1] if name == "final_loss" else min(losses)
    return None


def available_metrics(run_dir: Path) -> set[str]:
    """The metrics a run can be compared on: from its trace, and what it logged."""
    names = set(TRACE_METRICS)
    run_dir = Path(run_dir)
    if RunFolder(run_dir).metrics.is_file():
        names |= {
            json.loads(line)["name"]
            for line in RunFolder(run_dir).metrics.read_text().splitlines()
            if line
        }
    if RunFolder(run_dir).final_metrics.is_file():
        names |= set(json.loads(RunFolder(run_dir).final_metrics.read_text()))
    return names


def require_metric(run_dirs: list[Path], name: str) -> None:
    """The metric's value in each run; a run without it is a usage error naming the run."""
    known = (
        set().union(*(available_metrics(d) for d in run_dirs)) if run_dirs else set(TRACE_METRICS)
    )
    if name not in known:
        raise UsageError(
            f"unknown metric {name!r}", f"this sweep's runs have: {', '.join(sorted(known))}"
        )
