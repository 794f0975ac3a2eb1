"""The one door through which twice reads a file: regular files only, bounded, strict JSON.

Every record twice reads (a run or sweep folder's files, process records, op logs, numerics and
locate records, checkpoint indexes and parts, the user's cache) comes through here, and so do the
user's input files it hashes. A folder can be crafted by anyone, so each read is held to:

- a regular file: a FIFO would hang the read, a device (`/dev/zero`) would never end, a folder is
  no record. Files are opened non-blocking and checked with fstat before a byte is read;
- not a link (the file itself, `O_NOFOLLOW`), and, where the folder is known (`within=`), not
  reached through a linked subfolder that leads out of it;
- bounded: a whole record at most RECORD_LIMIT bytes, a line at most LINE_LIMIT;
- strict JSON: a duplicate key (`{"loss": a, "loss": b}` would let the second hide the first), a
  non-finite literal (`NaN`, `Infinity`: not JSON) or nesting deeper than MAX_DEPTH is damage.

Damage is a CorruptRecord (exit 2); a missing file is FileNotFoundError, for the caller to say
whether that is an error. tests/house/test_doors_read.py forbids reading a file anywhere else.
"""

from __future__ import annotations

import errno
import json
import math
import os
import stat
from pathlib import Path
from typing import Any, BinaryIO

from twice.core.errors import CorruptRecord

__all__ = [
    "RECORD_LIMIT",
    "LINE_LIMIT",
    "MAX_DEPTH",
    "open_record",
    "read_record",
    "read_json",
    "read_tail",
    "loads",
    "parse",
    "open_input",
    "read_input",
    "read_system",
    "read_tensors",
    "present",
]

RECORD_LIMIT = 256 << 20
"""The largest record file read whole (a manifest, a resume record, a checkpoint's index): far
above any twice writes, far below what would exhaust memory."""
LINE_LIMIT = 64 << 20
"""The longest line of a line-per-record file (a trace, an op log): a step record is ~1 KB per
hundred tensors."""
MAX_DEPTH = 64
"""The deepest nesting of a JSON record (twice writes at most ~8; a user's config rarely 10)."""

_HINT = "the run folder is damaged or was edited; re-record the run"
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)


def _open_regular(path: Path, flags: int, hint: str) -> BinaryIO:
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise
    except OSError as exc:
        reason = (
            "it is a link, not a regular file"
            if exc.errno == errno.ELOOP
            else exc.strerror or str(exc)
        )
        raise CorruptRecord(f"cannot read {path}: {reason}", hint) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = "a folder" if stat.S_ISDIR(mode) else "a FIFO, device or socket"
            raise CorruptRecord(f"cannot read {path}: it is {kind}, not a regular file", hint)
        # the non-blocking flag only kept a FIFO from hanging the open: a regular file reads as ever
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _check_within(path: Path, within: Path | None) -> None:
    if within is None:
        return
    root = os.path.realpath(within)
    parent = os.path.realpath(Path(path).parent)
    if parent != root and not parent.startswith(root.rstrip(os.sep) + os.sep):
        raise CorruptRecord(
            f"cannot read {path}: a link leads it out of {within}",
            "a run folder's files and subfolders must lie inside it; re-record the run",
        )


def open_record(path: Path, *, within: Path | None = None) -> BinaryIO:
    """Open a record file: a regular file, not a link, FIFO or device, inside `within` where given.
    A missing file raises FileNotFoundError; anything else unreadable, CorruptRecord."""
    _check_within(path, within)
    return _open_regular(Path(path), _FLAGS | _NOFOLLOW, _HINT)


def read_record(path: Path, limit: int = RECORD_LIMIT, *, within: Path | None = None) -> bytes:
    """A record file's bytes, read through open_record and refused above `limit` bytes."""
    with open_record(path, within=within) as handle:
        return _bounded(handle, path, limit)


def _bounded(handle: BinaryIO, path: Path, limit: int) -> bytes:
    try:  # a file known too large is refused before a byte of it is read
        if os.fstat(handle.fileno()).st_size > limit:
            raise CorruptRecord(
                f"cannot read {path}: larger than {_size(limit)}, far more than twice writes", _HINT
            )
        data = handle.read(limit + 1)
    except OSError as exc:
        raise CorruptRecord(f"cannot read {path}: {exc}", _HINT) from None
    if len(data) > limit:
        raise CorruptRecord(
            f"cannot read {path}: larger than {_size(limit)}, far more than twice writes", _HINT
        )
    return data


def _size(limit: int) -> str:
    return f"{limit >> 20} MiB" if limit >= 1 << 20 else f"{limit} bytes"


class _Damage(ValueError):
    pass


def _pairs(pairs: list) -> dict:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set = set()
        key = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise _Damage(f"duplicate key {key!r}")
    return out


def _constant(name: str) -> Any:
    raise _Damage(f"{name} is not JSON (a non-finite number must be written as a string)")


def _int(text: str) -> int:
    if len(text.lstrip("-")) > 20:  # no count, size, time or seed twice writes is longer
        raise _Damage(f"the number {text[:24]}... is too large for any record")
    return int(text)


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e400: a finite literal that is no double
        raise _Damage(f"the number {text[:24]} is too large for a float")
    return value


_DECODER = json.JSONDecoder(
    object_pairs_hook=_pairs, parse_constant=_constant, parse_int=_int, parse_float=_float
)


def _depth_ok(value: Any) -> bool:
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            item = item.values()
        elif not isinstance(item, list):
            continue
        if depth > MAX_DEPTH:
            return False
        stack.extend((child, depth + 1) for child in item if isinstance(child, (dict, list)))
    return True


def parse(data: bytes | str) -> Any:
    """`data` parsed as strict JSON (see the module's docstring); damage is a ValueError. For a
    caller that words the error itself (a trace line with its number); else use `loads`."""
    try:
        text = bytes(data).decode("utf-8") if not isinstance(data, str) else data
        value = _DECODER.decode(text)
    except RecursionError:
        raise ValueError("nested too deeply") from None
    if not _depth_ok(value):
        raise ValueError(f"nested deeper than {MAX_DEPTH}")
    return value


def loads(data: bytes | str, where: str, hint: str = _HINT) -> Any:
    """`data` parsed as strict JSON (see the module's docstring); damage is a CorruptRecord naming
    `where`. Every JSON twice reads, from a file or a string, is parsed here."""
    try:
        return parse(data)
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError and _Damage included
        raise CorruptRecord(f"cannot read {where}: {exc}", hint) from None


def read_json(path: Path, limit: int = RECORD_LIMIT, *, within: Path | None = None) -> Any:
    """A JSON record's value, read through read_record and parsed by `loads`."""
    return loads(read_record(path, limit, within=within), str(path))


def read_tail(path: Path, limit: int = 1 << 16, *, within: Path | None = None) -> bytes:
    """The last `limit` bytes of a record file (a log's last lines, a trace's last record):
    never more, however long the file."""
    with open_record(path, within=within) as handle:
        try:
            size = os.fstat(handle.fileno()).st_size
            handle.seek(max(0, size - limit))
            return handle.read(limit)
        except OSError as exc:
            raise CorruptRecord(f"cannot read {path}: {exc}", _HINT) from None


def open_input(path: Path) -> BinaryIO:
    """Open a file the run read (a data set, a script), to hash it: links followed, as the run
    followed them, but a regular file only: a FIFO or a device named by a crafted record must be
    refused, not read forever."""
    return _open_regular(
        Path(path), _FLAGS, "a file a run read must be a regular file; check the record"
    )


def present(path: Path) -> bool:
    """Whether anything is at `path`, a link or FIFO included: what a reader then refuses is an
    error, never taken for a file that is absent (`Path.is_file()` says False for a link to
    `/dev/zero`, which would hide a damaged record)."""
    return os.path.lexists(path)


def read_input(path: Path, limit: int = RECORD_LIMIT) -> bytes:
    """A file the run read (a source file, the script), through open_input, at most `limit`
    bytes: larger is a CorruptRecord, as a FIFO or device is."""
    with open_input(path) as handle:
        return _bounded(handle, Path(path), limit)


def read_tensors(path: Path, *, within: Path | None = None) -> dict:
    """The tensors of a safetensors file (a format without code), read from the regular file
    open_record opened: on Linux through its descriptor, mapped as safetensors maps a file, so
    a file swapped after the open is never the one read; elsewhere from its bytes."""
    from safetensors.torch import load, load_file

    with open_record(path, within=within) as handle:
        descriptor = f"/proc/self/fd/{handle.fileno()}"
        if os.path.exists(descriptor):
            return load_file(descriptor)
        return load(_bounded(handle, Path(path), 1 << 40))


def read_system(path: str, limit: int = 1 << 20) -> str:
    """A small system file (`/proc/cpuinfo`, `/proc/<pid>/stat`) as text, at most `limit` bytes."""
    with _open_regular(Path(path), _FLAGS, "this system's file could not be read") as handle:
        return _bounded(handle, Path(path), limit).decode("utf-8", errors="replace")
