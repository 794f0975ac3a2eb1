"""Atomic file writes: a crash leaves the old file or the new one, never half of either (reads go
through store/reader.py)."""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

__all__ = [
    "write_bytes_atomic",
    "write_json_atomic",
    "dumps",
    "finite_json",
    "fsync_dir",
    "current_umask",
    "check_output_path",
]


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


def current_umask() -> int:
    """The process's umask, read without changing it where Linux shows it (/proc), else by the
    usual swap."""
    from twice.core.errors import CorruptRecord
    from twice.store.reader import read_system

    try:
        for line in read_system("/proc/self/status").splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, CorruptRecord):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Write `data` to `path` so that a crash leaves either the old file or the new one, never
    half. The file gets the permissions any new file would (0666 less the umask), not
    mkstemp's 0600."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~current_umask())
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
    """Canonical JSON: sorted keys, UTF-8, two-space indent, trailing newline. A non-finite float
    (a config's `nan`) is written as the text "nan", "inf" or "-inf": NaN and Infinity are not
    JSON, and the reader refuses them."""
    return json.dumps(finite_json(value), sort_keys=True, indent=2, ensure_ascii=False) + "\n"


def finite_json(value: Any) -> Any:
    """`value` with every non-finite float as its text ("nan", "inf", "-inf"), for JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, dict):
        return {key: finite_json(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_json(item) for item in value]
    return value


def write_json_atomic(path: Path, value: Any) -> None:
    """Write `value` as sorted JSON to `path` atomically: the old file or the new, never half."""
    write_bytes_atomic(path, dumps(value).encode("utf-8"))


def check_output_path(path: Path, what: str) -> Path:
    """Refuse, before any work, an output file that cannot be written: a folder, a missing or
    unwritable parent, a file in the way of a parent."""
    from twice.core.errors import UsageError

    path = Path(path)
    if path.is_dir():
        raise UsageError(f"cannot write the {what} to {path}: it is a folder", "give a file name")
    parent = path.parent if str(path.parent) else Path(".")
    for ancestor in (parent, *parent.parents):
        if ancestor.exists():
            if not ancestor.is_dir():
                raise UsageError(
                    f"cannot write the {what} to {path}: {ancestor} is a file, not a folder",
                    "choose another path",
                )
            break
    if not parent.is_dir():
        raise UsageError(
            f"cannot write the {what} to {path}: folder {parent} does not exist",
            "create it first, or choose another path",
        )
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(
            f"cannot write the {what} to {path}: folder {parent} is not writable",
            "choose a folder you can write to",
        )
    return path
