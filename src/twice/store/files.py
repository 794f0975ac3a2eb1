"""Atomic file writes: a crash leaves the old file or the new one, never half of either."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["write_bytes_atomic", "write_json_atomic", "dumps", "fsync_dir"]


def fsync_dir(path: Path) -> None:
    """Make a rename or new file in `path` durable (a no-op where folders cannot be synced)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Write `data` to `path` so that a crash leaves either the old file or the new one, never
    half."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    fsync_dir(path.parent)


def dumps(value: Any) -> str:
    """Canonical JSON: sorted keys, UTF-8, two-space indent, trailing newline."""
    return json.dumps(value, sort_keys=True, indent=2, ensure_ascii=False) + "\n"


def write_json_atomic(path: Path, value: Any) -> None:
    """Write `value` as sorted JSON to `path` atomically: the old file or the new, never half."""
    write_bytes_atomic(path, dumps(value).encode("utf-8"))
