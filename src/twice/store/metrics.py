"""Metrics a training script reports to twice (`twice.log_metric`), and metrics read from a run."""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from twice.core.errors import CorruptRecord, UsageError
from twice.core.protocol import ChildSettings
from twice.store import reader
from twice.store.files import finite_json
from twice.store.layout import RunFolder
from twice.store.traces import read_trace

__all__ = [
    "log_metric",
    "metrics_path",
    "read_metric",
    "read_logged",
    "read_final",
    "LoggedMetric",
    "TRACE_METRICS",
]

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
    # a non-finite value as text (finite_json): NaN and Infinity are not JSON
    record = finite_json(
        {"name": str(name), "value": float(value), "step": step, "time": time.time()}
    )
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


@dataclass(frozen=True)
class LoggedMetric:
    """One value a script logged with `twice.log_metric`."""

    name: str
    value: float
    step: int | None = None
    time: float | None = None  # seconds since the epoch, when logged


_NON_FINITE_TEXT = ("nan", "inf", "-inf")  # how finite_json writes them


def _number(value: Any) -> bool:
    return type(value) in (int, float) or (isinstance(value, str) and value in _NON_FINITE_TEXT)


def read_logged(run_dir: Path) -> list[LoggedMetric]:
    """metrics.jsonl, validated line by line (a last line cut short by a kill is dropped)."""
    path = RunFolder(run_dir).metrics
    text = _text(path)
    if text is None:
        return []
    lines = text.split("\n")
    if lines[-1] != "":
        lines = lines[:-1]
    out = []
    for number, line in enumerate(lines, start=1):
        if not line:
            continue
        record = reader.loads(line, f"{path} line {number}")
        ok = (
            isinstance(record, dict)
            and isinstance(record.get("name"), str)
            and _number(record.get("value"))
            and (record.get("step") is None or type(record.get("step")) is int)
            and (record.get("time") is None or _number(record.get("time")))
        )
        if not ok:
            raise CorruptRecord(
                f"{path} line {number} is not a metric record: expected an object with 'name' "
                "(a string), 'value' (a number) and 'step' (a whole number or null)",
                "the file is damaged or was edited; log metrics with twice.log_metric",
            )
        when = record.get("time")
        out.append(
            LoggedMetric(
                record["name"],
                float(record["value"]),
                record.get("step"),
                float(when) if when is not None and math.isfinite(when) else None,
            )
        )
    return out


def read_final(run_dir: Path) -> dict[str, float]:
    """metrics.json (final values a script wrote itself), validated: names to numbers."""
    path = RunFolder(run_dir).final_metrics
    text = _text(path)
    if text is None:
        return {}
    data = reader.loads(text, str(path))
    if not isinstance(data, dict) or not all(_number(v) for v in data.values()):
        raise CorruptRecord(
            f"{path} is not a metrics file: expected an object of metric names to numbers",
            'write it as {"name": value, ...}, or log metrics with twice.log_metric',
        )
    return {name: float(value) for name, value in data.items()}


def _text(path: Path) -> str | None:
    try:
        return reader.read_record(path).decode("utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise CorruptRecord(
            f"cannot read {path}: {type(exc).__name__}", "the run folder is damaged"
        ) from None


def read_metric(run_dir: Path, name: str) -> float | None:
    """A run's value of metric `name`: logged by the script, in its metrics.json, or from its
    trace."""
    run_dir = Path(run_dir)
    logged = [m.value for m in read_logged(run_dir) if m.name == name]
    if logged:
        return logged[-1]
    final = read_final(run_dir)
    if name in final:
        return final[name]
    if name in TRACE_METRICS:
        losses = [x for x in _losses(run_dir) if not math.isnan(x)]
        if not losses:
            return None
        return losses[-1] if name == "final_loss" else min(losses)
    return None


def available_metrics(run_dir: Path) -> set[str]:
    """The metrics a run can be compared on: from its trace, and what it logged."""
    names = set(TRACE_METRICS) | {m.name for m in read_logged(run_dir)}
    return names | set(read_final(run_dir))


def require_metric(run_dirs: list[Path], name: str) -> None:
    """The metric's value in each run; a run without it is a usage error naming the run."""
    known = (
        set().union(*(available_metrics(d) for d in run_dirs)) if run_dirs else set(TRACE_METRICS)
    )
    if name not in known:
        raise UsageError(
            f"unknown metric {name!r}", f"this sweep's runs have: {', '.join(sorted(known))}"
        )
