"""The run folder on disk: atomic JSON, time-sorted unique ids, listing, and liveness of running
runs."""

from __future__ import annotations

import os
import secrets
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from twice.core.errors import CorruptRecord, RunNotFound, UsageError
from twice.core.manifest import Manifest
from twice.store import reader
from twice.store.files import (  # noqa: F401 (re-exported)
    dumps,
    fsync_dir,
    write_bytes_atomic,
    write_json_atomic,
)

CONFIG_LIMIT = 16 << 20  # a config or its defaults: hyperparameters, never megabytes

__all__ = [
    "write_json_atomic",
    "read_manifest",
    "summarize_run",
    "summarize_runs",
    "new_run_dir",
    "check_run_name",
    "find_run",
    "run_name",
    "list_runs",
    "effective_status",
    "process_start_time",
    "MANIFEST",
]

# MANIFEST is re-exported: the name every reader uses
from twice.store.layout import MANIFEST, RunFolder  # noqa: E402


def new_run_id(name: str | None = None, now: float | None = None) -> str:
    """`20261202-141503-123-3fa9c2[-name]`: sorts by start time; the random part keeps it unique."""
    now = time.time() if now is None else now
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(now)) + f"-{int(now * 1000) % 1000:03d}"
    run_id = f"{stamp}-{secrets.token_hex(3)}"
    return f"{run_id}-{name}" if name else run_id


def check_run_name(name: str) -> None:
    """Refuse a run or sweep name that is not one plain folder name (no path, no dot first)."""
    _check_name(name)


def _check_name(name: str) -> None:
    if not name or any(c in name for c in "/\\\0") or name.startswith(".") or len(name) > 100:
        raise UsageError(
            f"invalid run name {name!r}",
            "use letters, digits, '-', '_' or '.', not starting with '.'",
        )


def new_run_dir(runs_dir: Path, name: str | None = None) -> Path:
    """Create and return a fresh run folder under `runs_dir` (exclusive mkdir, so never shared)."""
    if name is not None:
        _check_name(name)
    runs_dir = Path(runs_dir)
    try:
        runs_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(
            f"cannot create runs folder {runs_dir}: {exc.strerror}",
            "pass a writable folder with --runs-dir",
        ) from exc
    if not os.access(runs_dir, os.W_OK | os.X_OK):
        raise UsageError(
            f"runs folder {runs_dir} is not writable", "pass a writable folder with --runs-dir"
        )
    for _ in range(100):
        path = runs_dir / new_run_id(name)
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
    raise UsageError(f"could not create a unique run folder in {runs_dir}")


def is_run(path: Path) -> bool:
    """Whether `path` is a run folder (it has a manifest)."""
    return reader.present(Path(path) / MANIFEST)


def run_name(folder: Path) -> str | None:
    """The `--name` a run folder was given: what follows its id's time and random parts
    (`20261204-162038-444-120047-lr01` -> "lr01"), or None."""
    parts = Path(folder).name.split("-", 4)
    return parts[4] if len(parts) == 5 and parts[0].isdigit() and parts[4] else None


def find_run(ref: str | Path, runs_dir: Path | None = None) -> Path:
    """Resolve a run given as a path, an id, `latest` (the newest run), a run's `--name` (unique,
    else the candidates are listed), or a unique id prefix under `runs_dir`."""
    path = Path(ref)
    if is_run(path):
        return path
    base = Path(runs_dir) if runs_dir is not None else Path("runs")
    if base.is_dir():
        candidate = base / str(ref)
        if is_run(candidate):
            return candidate
        every = list(list_runs(base))
        if str(ref) == "latest" and every:
            return every[-1]
        named = [p for p in every if run_name(p) == str(ref)]
        if len(named) == 1:
            return named[0]
        if len(named) > 1:
            listed = ", ".join(p.name for p in named[-5:])
            raise RunNotFound(
                f"{len(named)} runs are named {str(ref)!r}: {listed}"
                + (" (the last 5)" if len(named) > 5 else ""),
                "give the run's id (or a unique prefix of it) instead",
            )
        matches = sorted(p for p in every if p.name.startswith(str(ref)))
        if len(matches) == 1:
            return matches[0]
        if len(matches) > 1:
            raise RunNotFound(
                f"run {str(ref)!r} is ambiguous: {len(matches)} runs start with it",
                "give more of the id, or the run's path",
            )
    if path.is_dir():
        raise RunNotFound(
            f"{path} is not a run folder (it has no {MANIFEST})",
            "pass a folder made by `twice run`",
        )
    raise RunNotFound(f"no run {str(ref)!r}", "list runs with `twice ls`, or pass the run's path")


def list_runs(runs_dir: Path) -> Iterator[Path]:
    """Run folders directly under `runs_dir`, oldest first."""
    runs_dir = Path(runs_dir)
    if not runs_dir.is_dir():
        return iter(())
    return iter(sorted(p for p in runs_dir.iterdir() if is_run(p)))


def process_start_time(pid: int) -> int | None:
    """The kernel's start time of `pid` (clock ticks since boot), to tell a live process from a
    reused pid."""
    try:
        stat = reader.read_system(f"/proc/{pid}/stat")
    except (OSError, CorruptRecord):
        return None
    # The command name (field 2) may contain spaces; fields after the last ')' are safe to split.
    return int(stat.rsplit(")", 1)[1].split()[19])


def _alive(pid: int, start_time: int | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    if start_time is not None:
        now = process_start_time(pid)
        if now is not None and now != start_time:
            return False
    return True


def read_manifest(run_dir: Path) -> Manifest:
    """The one reader of a run's manifest.json: parsed and validated (CorruptRecord, exit 2, when
    damaged; RunNotFound when absent)."""
    path = Path(run_dir) / MANIFEST
    try:
        data = reader.read_json(path)
    except FileNotFoundError:
        raise RunNotFound(
            f"{run_dir} has no {MANIFEST}", "pass a folder made by `twice run`"
        ) from None
    return Manifest.from_json(data, str(path))


def effective_status(manifest: Manifest) -> str:
    """The recorded status, except that a run still marked running whose launcher died is
    `crashed`."""
    status = manifest.status
    if status != "running":
        return status
    launcher = manifest.launcher
    if launcher.get("host") != socket.gethostname():
        return status  # cannot check a process on another machine
    pid = launcher.get("pid")
    if isinstance(pid, int) and not _alive(pid, launcher.get("start_time")):
        return "crashed"
    return status


def summarize_run(run_dir: Path) -> dict:
    """The facts `twice ls` and `twice show` print for a run, from its validated manifest."""
    from twice.store.traceseries import last_loss

    manifest = read_manifest(run_dir)
    name = run_name(run_dir)
    ended = manifest.context.get("ended")
    final = last_loss(RunFolder(run_dir).trace(None))
    return {
        "id": Path(run_dir).name,
        "name": name,
        "path": str(run_dir),
        "status": effective_status(manifest),
        "exit_code": manifest.exit_code,
        "steps": manifest.steps,
        "seed": manifest.seed,
        "started": manifest.started,
        "duration": round(ended - manifest.started, 3)
        if isinstance(ended, (int, float)) and manifest.started
        else None,
        "final_loss": final[1] if final else None,
        "command": " ".join(manifest.argv),
        "loss_fault": manifest.loss_fault,
        "capture_error": reader.present(RunFolder(run_dir).capture_error),
        "rerun_of": rerun_of(name),
        "config_not_default": config_not_default(run_dir, manifest.identity.get("config")),
    }


def summarize_runs(runs_dir: Path) -> list[dict]:
    """summarize_run of every run under `runs_dir`; a damaged run is one row saying so (with
    what is wrong), so one crafted folder does not hide the others."""
    rows = []
    for path in list_runs(runs_dir):
        try:
            rows.append(summarize_run(path))
        except (CorruptRecord, RunNotFound) as exc:
            rows.append({"id": path.name, "name": run_name(path), "path": str(path),
                         "status": "damaged", "error": exc.message, "command": ""})  # fmt: skip
    return rows


def config_not_default(run_dir: Path, config: Any) -> list[str]:
    """The config keys whose values differ from their defaults, where the run recorded them
    (config_defaults.json, written by the Hugging Face callback); [] otherwise. A damaged
    defaults file is an error, as any damaged record is."""

    path = RunFolder(run_dir).config_defaults
    if not isinstance(config, dict):
        return []
    try:
        defaults = reader.read_json(path, CONFIG_LIMIT)
    except FileNotFoundError:
        return []
    if not isinstance(defaults, dict):
        raise CorruptRecord(
            f"cannot read {path}: not a JSON object of defaults",
            "the run folder is damaged or was edited; remove the file or re-record the run",
        )
    return sorted(k for k, v in config.items() if k in defaults and defaults[k] != v)


# Runs that twice's own commands make, by the name they give them.
_RERUNS = ("verify-", "resume-", "locate-dump-", "locate-", "bisect-")


def rerun_of(name: str | None) -> str | None:
    """What made a run that a twice command started ("verify of 20261204-162038-444-120047"),
    from its name; None for a run of the user's."""
    for prefix in _RERUNS:
        if name and name.startswith(prefix):
            of = name[len(prefix) :]
            if prefix not in ("verify-", "resume-") and of[:2] in ("a-", "b-"):
                of = of[2:]  # locate's and bisect's side of the pair
            return f"{prefix.rstrip('-').replace('-', ' ')} of {of}"
    return None
