"""The files a process opens for reading, seen through Python's audit hooks (`open` from
builtins.open, io.open, os.open and io.open_code: what np.load, np.memmap, torch.load and most
loaders call), each with its size, mtime and inode when first opened.

The launcher keeps those under the working folder and the folders named with `--inputs`, hashes
them (store/inputs.py) and records them in the manifest, so that a changed data file is named as
the cause of a difference instead of nondeterminism. Interpreter, library and system files, the
run folder and Python sources (recorded as code) are left out here; the hook's cost is a few
hundred nanoseconds per audit event, and one stat per new file.
"""

from __future__ import annotations

import os
import stat
import sys
import sysconfig

__all__ = ["watch_reads", "files_read", "MAX_FILES"]

MAX_FILES = 100_000  # a process that opens more records the first ones (and says so)
_SKIP_SUFFIXES = (".py", ".pyc", ".pyi", ".pth", ".so", ".pyd", ".dylib", ".dll")

_seen: dict[str, list[int]] = {}
_state = {"installed": False, "skip": (), "full": False}


def _skipped_prefixes(run_dir: str | None) -> tuple[str, ...]:
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, "/proc", "/sys", "/dev", "/etc"}
    paths.update(p for p in sysconfig.get_paths().values() if p)
    paths.add(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # twice itself
    if run_dir:
        paths.add(run_dir)
    return tuple(os.path.join(os.path.realpath(p), "") for p in paths)


def _on_event(event: str, args: tuple) -> None:
    if event != "open" or _state["full"]:
        return
    try:  # an audit hook that raises would fail the user's open(): never
        _record_open(*args)
    except Exception:  # noqa: BLE001 - a file twice cannot examine is a file it does not list
        return


def _record_open(path, mode, flags) -> None:
    if isinstance(mode, str):
        if "r" not in mode:
            return
    elif isinstance(flags, int) and (
        flags & os.O_ACCMODE == os.O_WRONLY or flags & (os.O_CREAT | os.O_TRUNC)
    ):
        return
    if path is None or isinstance(path, int):
        return
    name = os.path.abspath(os.fsdecode(path))
    if name in _seen or name.endswith(_SKIP_SUFFIXES):
        return
    real = os.path.realpath(name)
    info = os.stat(real)
    if not stat.S_ISREG(info.st_mode) or real.startswith(_state["skip"]):
        return
    _seen[name] = [info.st_size, info.st_mtime_ns, info.st_ino]
    if len(_seen) >= MAX_FILES:
        _state["full"] = True


def watch_reads(run_dir: str | None) -> None:
    """Start recording the files this process opens for reading (once per process; an audit
    hook cannot be removed, so it stays for the process's life)."""
    if _state["installed"]:
        return
    _state["skip"] = _skipped_prefixes(run_dir)
    _state["installed"] = True
    sys.addaudithook(_on_event)


def files_read() -> dict[str, list[int]]:
    """{absolute path: [size, mtime_ns, inode] when first opened} of the files read so far."""
    return dict(_seen)
