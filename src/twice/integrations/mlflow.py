"""MLflow: a twice run in an MLflow tracking store, after the fact or while it runs.

- params: the run's hyperparameters (config.json) as they are, and its identity (seed,
  determinism, code, hardware, environment) flattened under `twice.`
- tags: the twice run's name and status, the git commit (MLflow's own tag for it), the trace's
  final parameter digest, so that runs with the same bits can be found
- metrics: per step from the trace (loss, gradient norm, learning rate; per rank for multi-process
  runs), and whatever the script logged with `twice.log_metric`
- artifacts: the run folder (manifest, trace, logs, config; checkpoints too unless left out)

`twice export mlflow RUN` does it once for a finished run; `twice run --mlflow URI -- ...` logs
the trace's metrics every few seconds while the command runs, and the rest when it ends.
"""

from __future__ import annotations

import json
import math
import threading
from pathlib import Path
from typing import Any

from twice.core.manifest import Manifest
from twice.integrations import require
from twice.integrations.mlflow_store import mlflow_failure, open_store
from twice.store import reader
from twice.store.layout import RunFolder

_TRACE_BLOCK = 64 << 20  # what one poll reads of a trace at most; the rest comes next poll

mlflow = require("mlflow", "mlflow")

__all__ = ["export_run", "LiveExport"]

RUN_TAG = "twice.run"
MAX_VALUE = 6000  # MLflow's limit on a parameter's value
_SKIPPED_IDENTITY = (
    "packages",
    "env",
)  # hundreds of entries: they travel in manifest.json as an artifact


def _flatten(value: Any, prefix: str, out: dict) -> None:
    if isinstance(value, dict):
        for key, inner in value.items():
            _flatten(inner, f"{prefix}.{key}" if prefix else str(key), out)
        return
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    out[prefix] = text[:MAX_VALUE]


def argv_params(argv: list[str]) -> dict[str, str]:
    """The `--key value`, `--key=value` and `--flag` options of a command line (an argparse
    script's hyperparameters), as {"key": "value"} ("true" for a flag); dashes in names become
    underscores, as argparse makes them."""
    out: dict[str, str] = {}
    index = 0
    while index < len(argv):
        token = argv[index]
        index += 1
        if not token.startswith("--") or token == "--" or len(token) == 2:
            continue
        name, equals, value = token[2:].partition("=")
        if not equals:
            if index < len(argv) and not argv[index].startswith("--"):
                value, index = argv[index], index + 1
            else:
                value = "true"
        out[name.replace("-", "_")] = value[:MAX_VALUE]
    return out


def _params(run_dir: Path, manifest: Manifest, options: bool = True) -> dict[str, str]:
    """The params to log: the config, the command line's options where the config does not name
    them (`options`: not before the run ended, when the config is known: MLflow params cannot
    change once logged), and the identity."""
    out: dict[str, str] = {}
    config = RunFolder(run_dir).config
    if reader.present(config):
        _flatten(reader.read_json(config), "", out)
    if options:  # a script configured by its command line
        for key, value in argv_params(manifest.argv[1:]).items():
            out.setdefault(key, value)
    identity = {k: v for k, v in manifest.identity.items() if k not in _SKIPPED_IDENTITY}
    packages = manifest.identity.get("packages", {})
    identity["packages"] = {
        name: packages[name] for name in ("torch", "numpy", "twice") if name in packages
    }
    _flatten(identity, "twice", out)
    return out


def _tags(run_dir: Path, manifest: Manifest) -> dict[str, str]:
    tags = {
        RUN_TAG: run_dir.name,
        "mlflow.runName": run_dir.name,
        "twice.status": manifest.status,
        "twice.run_dir": str(run_dir.resolve()),
    }
    git = (manifest.identity.get("code") or {}).get("git") or {}
    if git.get("commit"):
        tags["mlflow.source.git.commit"] = git["commit"]
    return tags


def _as_float(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, list):
        value = value[-1] if value else None
        if value is None:
            return None
    text = str(value)
    if text in ("nan", "inf", "-inf"):
        return float(text)
    try:
        return float.fromhex(text)
    except ValueError:
        return None


def _step_metrics(record: Any, suffix: str, timestamp: int, recorded: int | None = None) -> list:
    """The record's loss, gradient norm and learning rates as MLflow metrics, stamped `timestamp`
    or, given `recorded` (the run's start, ms), the start plus the record's own time."""
    from mlflow.entities import Metric

    if recorded is not None and record.time is not None:
        timestamp = recorded + int(record.time * 1000)
    values = {"loss": _as_float(record.loss), "grad_norm": _as_float(record.grad_norm)}
    for group, lr in enumerate(record.lr or []):
        values["lr" if group == 0 else f"lr.{group}"] = _as_float(lr)
    return [
        Metric(key + suffix, value, timestamp, record.step)
        for key, value in values.items()
        if value is not None and not math.isnan(value)
    ]


class _TraceTail:
    """Reads the complete lines that trace files gained since the last call."""

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir
        self.offsets: dict[str, int] = {}

    def new_metrics(self, timestamp: int, recorded: int | None = None) -> list:
        from twice.core.records import StepRecord
        from twice.store.traces import trace_files

        metrics = []
        for stream, path in trace_files(self.run_dir).items():
            suffix = "" if stream in ("main", "rank0") else f"/{stream}"
            with reader.open_record(path) as handle:  # what was added since, at most a block
                handle.seek(self.offsets.get(stream, 0))
                data = handle.read(_TRACE_BLOCK)
            complete = data[: data.rfind(b"\n") + 1]
            self.offsets[stream] = self.offsets.get(stream, 0) + len(complete)
            for line in complete.splitlines():
                try:
                    record = StepRecord.from_json(reader.parse(line))
                except (ValueError, TypeError, KeyError):
                    continue
                metrics.extend(_step_metrics(record, suffix, timestamp, recorded))
        return metrics


def _logged_metrics(run_dir: Path, timestamp: int) -> list:
    from mlflow.entities import Metric

    from twice.store.metrics import read_logged

    return [
        Metric(
            metric.name,
            metric.value,
            int(metric.time * 1000) if metric.time else timestamp,
            index if metric.step is None else metric.step,
        )
        for index, metric in enumerate(read_logged(run_dir))
    ]


def _log(
    client: Any,
    run_id: str,
    *,
    params: dict | None = None,
    metrics: list | None = None,
    tags: dict | None = None,
) -> None:
    from mlflow.entities import Param, RunTag

    params_list = [Param(k, v) for k, v in (params or {}).items()]
    tags_list = [RunTag(k, v) for k, v in (tags or {}).items()]
    metrics = metrics or []
    for i in range(0, len(params_list), 100):
        client.log_batch(run_id, params=params_list[i : i + 100])
    for i in range(0, len(tags_list), 100):
        client.log_batch(run_id, tags=tags_list[i : i + 100])
    for i in range(0, len(metrics), 1000):
        client.log_batch(run_id, metrics=metrics[i : i + 1000])


def existing_export(client: Any, experiment_id: str, run_dir: Path) -> str | None:
    """The MLflow run id this twice run was exported to already, if any."""
    found = client.search_runs(
        [experiment_id], filter_string=f"tags.`{RUN_TAG}` = '{run_dir.name}'", max_results=1
    )
    return found[0].info.run_id if found else None


def _finish(
    client: Any,
    run_id: str,
    run_dir: Path,
    manifest: Manifest,
    checkpoints: bool,
    recorded_end: bool = False,
) -> None:
    client.set_tag(run_id, "twice.status", manifest.status)
    for item in sorted(run_dir.iterdir()):
        if item == RunFolder(run_dir).checkpoints and not checkpoints:
            continue
        if item.is_dir():
            client.log_artifacts(run_id, str(item), artifact_path=item.name)
        else:
            client.log_artifact(run_id, str(item))
    ended = manifest.context.get("ended")
    client.set_terminated(
        run_id,
        "FINISHED" if manifest.status in ("completed", "stopped") else "FAILED",
        # An export after the fact ends the MLflow run when the run ended, not now.
        end_time=int(ended * 1000) if recorded_end and isinstance(ended, (int, float)) else None,
    )


def export_run(
    run_dir: str | Path,
    *,
    tracking_uri: str | None = None,
    experiment: str = "twice",
    checkpoints: bool = True,
) -> tuple[str, bool]:
    """Put a finished twice run into MLflow; returns (the MLflow run id, whether it was created
    now).

    A run exported before is found by its tag and not exported twice."""
    import time

    from twice.store.runs import read_manifest

    run_dir = Path(run_dir)
    manifest = read_manifest(run_dir)
    client, experiment_id = open_store(tracking_uri, experiment)
    found = existing_export(client, experiment_id, run_dir)
    if found is not None:
        return found, False
    started = int((manifest.started or time.time()) * 1000)
    run_id = client.create_run(
        experiment_id, start_time=started, tags=_tags(run_dir, manifest)
    ).info.run_id
    metrics = _TraceTail(run_dir).new_metrics(started, started) + _logged_metrics(run_dir, started)
    _log(client, run_id, params=_params(run_dir, manifest), metrics=metrics)
    _finish(client, run_id, run_dir, manifest, checkpoints, recorded_end=True)
    return run_id, True


def _warn(message: str) -> None:
    import sys

    from twice.core.escaping import escape_controls

    sys.stderr.write(escape_controls(f"twice: warning: {message}\n"))
    sys.stderr.flush()


class LiveExport:
    """Logs a run to MLflow while it runs: `twice run --mlflow URI` starts it with the command."""

    def __init__(self, tracking_uri: str | None, experiment: str = "twice", every: float = 5.0):
        self.tracking_uri, self.experiment, self.every = tracking_uri, experiment, every
        self.client: Any = None
        self.experiment_id: str | None = None
        self.run_id: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._tail: _TraceTail | None = None

    def open(self) -> None:
        """Open the tracking store and its experiment: a UsageError, before the command starts,
        if it cannot be opened."""
        self.client, self.experiment_id = open_store(self.tracking_uri, self.experiment)

    def start(self, run_dir: Path) -> None:
        """Create the MLflow run and start following the trace as the command runs."""
        import time

        from twice.store.runs import read_manifest

        manifest = read_manifest(run_dir)
        if self.client is None:
            self.open()
        try:
            self.run_id = self.client.create_run(
                self.experiment_id,
                start_time=int(time.time() * 1000),
                tags=_tags(run_dir, manifest),
            ).info.run_id
            # Identity facts the training process adds later (torch's) come with the final params,
            # and so do the command line's options (the config the script writes names some).
            _log(self.client, self.run_id, params=_params(run_dir, manifest, options=False))
        except Exception as exc:  # the store went away since open(): the run goes on without it
            if not mlflow_failure(exc):
                raise
            _warn(
                f"logging to MLflow failed ({exc}); "
                f"`twice export mlflow {run_dir}` puts the run there later"
            )
            self.run_id = None
            return
        self._tail = _TraceTail(run_dir)
        self._thread = threading.Thread(target=self._follow, daemon=True, name="twice-mlflow")
        self._thread.start()

    def _follow(self) -> None:
        import time

        while not self._stop.wait(self.every):
            try:
                _log(
                    self.client,
                    self.run_id,
                    metrics=self._tail.new_metrics(int(time.time() * 1000)),
                )
            except Exception as exc:  # a store that went away must not touch the training run
                _warn(f"logging to MLflow failed ({exc}); the rest is logged when the command ends")
                return

    def finish(self, run_dir: Path) -> None:
        """Log what is left and close the MLflow run (a failure is a warning, never the run's)."""
        try:
            self._close(run_dir)
        except Exception as exc:  # the run itself is complete and recorded: say so, do not fail it
            _warn(
                f"logging to MLflow failed ({exc}); the run is recorded in {run_dir}: "
                f"`twice export mlflow {run_dir}` puts it there later"
            )

    def _close(self, run_dir: Path) -> None:
        import time

        from twice.store.runs import read_manifest

        if self.run_id is None:
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        manifest = read_manifest(run_dir)
        logged = self.client.get_run(self.run_id).data.params
        params = {k: v for k, v in _params(run_dir, manifest).items() if k not in logged}
        now = int(time.time() * 1000)
        _log(
            self.client,
            self.run_id,
            params=params,
            metrics=self._tail.new_metrics(now) + _logged_metrics(run_dir, now),
        )
        _finish(self.client, self.run_id, run_dir, manifest, checkpoints=True)
