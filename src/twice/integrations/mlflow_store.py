"""Opening an MLflow tracking store: a URI it cannot open is a UsageError before anything is
written or run, never a traceback, a minutes-long retry, or folders made where none were asked
for."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from twice.core.errors import TwiceError, UsageError

__all__ = ["check_tracking_uri", "open_store", "mlflow_failure"]


def _client(tracking_uri: str | None):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=tracking_uri)


_SCHEMES = ("file", "sqlite", "http", "https", "postgresql", "mysql", "mssql", "databricks")
_URI_HINT = "pass --tracking-uri sqlite:///mlflow.db (a file here) or http://HOST:PORT (a server)"


def _check_sqlite(uri: str) -> None:
    """An SQLite store must be a database file, or a new file, in a folder that exists: MLflow
    itself would create missing folders, or retry for minutes on a path it cannot open."""
    if not uri.startswith("sqlite:///"):
        raise UsageError(f"{uri} is not an SQLite URI MLflow can open", _URI_HINT)
    path = Path(uri[len("sqlite:///") :])
    if str(path) in ("", ".", ":memory:"):
        return
    if path.is_dir():
        raise UsageError(
            f"the SQLite tracking store {path} is a folder, not a database file", _URI_HINT
        )
    folder = path.parent
    if not folder.is_dir():
        raise UsageError(
            f"cannot open the SQLite tracking store {path}: its folder {folder} does not exist",
            "create the folder first, or name a database file in a folder that exists",
        )
    if not os.access(folder, os.W_OK | os.X_OK) or (
        path.exists() and not os.access(path, os.R_OK | os.W_OK)
    ):
        raise UsageError(
            f"cannot open the SQLite tracking store {path}: permission denied",
            "name a database file you can write",
        )
    if path.exists() and path.stat().st_size:
        from twice.core.errors import CorruptRecord
        from twice.store.reader import open_input

        try:
            with open_input(path) as handle:
                head = handle.read(16)
        except CorruptRecord:  # a FIFO or device in its place
            head = b""
        if head != b"SQLite format 3\x00":
            raise UsageError(
                f"the SQLite tracking store {path} is not an SQLite database", _URI_HINT
            )


def check_tracking_uri(tracking_uri: str | None) -> None:
    """Refuse a tracking URI MLflow cannot open, before anything is written or run."""
    if tracking_uri is None:
        return
    scheme = tracking_uri.split(":", 1)[0].lower() if "://" in tracking_uri else ""
    if scheme and scheme not in _SCHEMES and not scheme.startswith(_SCHEMES):
        raise UsageError(f"MLflow cannot use the tracking URI {tracking_uri!r}", _URI_HINT)
    if scheme == "sqlite":
        _check_sqlite(tracking_uri)


def mlflow_failure(exc: BaseException) -> bool:
    """An error raised by MLflow or the database and HTTP libraries under it (not twice's)."""
    return not isinstance(exc, TwiceError) and (
        isinstance(exc, OSError)
        or type(exc).__module__.split(".")[0] in ("mlflow", "sqlalchemy", "requests", "urllib3")
    )


def open_store(tracking_uri: str | None, experiment: str) -> tuple[Any, str]:
    """(client, experiment id) for a tracking store that answers, found out with one quick request
    (no retries): a store that cannot be opened is a UsageError, never a traceback or a wait."""
    check_tracking_uri(tracking_uri)
    quick = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}
    saved = {name: os.environ.get(name) for name in quick}
    os.environ.update({k: v for k, v in quick.items() if saved[k] is None})
    try:
        client = _client(tracking_uri)
        return client, _experiment(client, experiment)
    except Exception as exc:
        if not mlflow_failure(exc):
            raise
        message = str(exc).strip().split("\n")[0][:300]
        raise UsageError(
            f"cannot open the MLflow tracking store {tracking_uri or '(the default)'}: {message}",
            _URI_HINT,
        ) from None
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)


def _experiment(client: Any, name: str) -> str:
    found = client.get_experiment_by_name(name)
    return found.experiment_id if found is not None else client.create_experiment(name)
