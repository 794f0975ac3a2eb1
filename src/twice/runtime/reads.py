"""The files a process opens for reading, seen through Python's audit hooks (`open` from
builtins.open, io.open, os.open and io.open_code: what np.load, np.memmap, torch.load and most
loaders call), each with its size, mtime and inode when first opened, wherever it lies.

The launcher records every one of them (store/inputs.py hashes them, within a budget outside the
working and `--inputs` folders), so that a changed data file is named as the cause of a
difference instead of nondeterminism. Left out here: the interpreter, installed packages, system
files, compilers' caches, twice and its run folder; a Python source opened by the import system
(the code record holds imported modules), though one read as data (`exec(open(...).read())`,
runpy) is kept. The hook's cost is a few hundred nanoseconds per audit event, and one stat per
new file.

Every process of the run watches: the bootstrap starts it in each one. A forked child (a
DataLoader worker, a multiprocessing fork) inherits the hook but never reaches the bootstrap's
exit, and a worker may be terminated: such a process writes its own record of what it read as it
reads (the first few files at once, then at most every REWRITE_S), and once more as
multiprocessing ends it.

A program the script starts (subprocess, os.exec*, os.posix_spawn, os.system) is recorded too,
under a STARTED key: one that is not Python, or Python started without twice's settings, reads
files no hook sees, and the launcher counts it as a gap. A program started by an installed
package or the standard library (a compiler, `ldconfig` for ctypes) is left out: it reads what
its package gave it, not the run's data.
"""

from __future__ import annotations

import _thread
import atexit
import os
import stat
import sys
import sysconfig
import time

__all__ = ["watch_reads", "files_read", "MAX_FILES", "OVERFLOW", "STARTED", "SYSTEM_FOLDERS"]

MAX_FILES = 100_000  # a process that opens more records the first ones (and says so)
OVERFLOW = "<more files than recorded>"
"""The key files_read() adds when the process read more than MAX_FILES files (every other key
is an absolute path, so it cannot be taken for a file)."""
STARTED = "<started> "
"""The prefix of a key files_read() holds for a program the process started: STARTED + its
path, with [1 if it inherits twice's settings else 0, 0, 0]."""
# audit event -> (index of the program's path, index of its environment) in the event's args
_STARTS = {
    "subprocess.Popen": (0, 3),
    "os.posix_spawn": (0, 2),
    "os.exec": (0, 2),
    "os.spawn": (1, 3),
    "os.system": (None, None),
}
_BOOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_boot")
SYSTEM_FOLDERS = (
    *("/usr", "/lib", "/lib32", "/lib64", "/libx32", "/bin", "/sbin", "/boot"),
    *("/etc", "/proc", "/sys", "/dev", "/run"),
)
"""The system's files: not the run's inputs."""
# Installed packages wherever an interpreter keeps them, and compilers' caches (torch.compile's,
# Triton's): files derived from code, cold in one run and warm in the next, never an input.
_SKIP_PARTS = ("/site-packages/", "/dist-packages/", "/torchinductor_", "/.triton/")
_SKIP_SUFFIXES = (".pyc", ".pyi", ".pth", ".so", ".pyd", ".dylib", ".dll")
EAGER_FILES = 8
"""A child process writes its record at once for its first EAGER_FILES files..."""
REWRITE_S = 0.25
"""... and then at most every REWRITE_S seconds (a terminated worker loses at most that)."""

_seen: dict[str, list[int]] = {}
_ignored: set[str] = set()  # opened and left out: not examined again
_child: dict[str, list[int]] = {}  # in a forked child: what it read itself
_state: dict = {"installed": False, "skip": (), "full": False, "forked": False, "final": False}
_lock = _thread.RLock()


class _Token:
    """What multiprocessing's after-fork registry holds a weak reference to."""


_TOKEN = _Token()


def _skipped_prefixes(run_dir: str | None) -> tuple[str, ...]:
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, *SYSTEM_FOLDERS}
    paths.update(p for p in sysconfig.get_paths().values() if p)
    paths.add(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # twice itself
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    paths.add(os.path.join(cache, "twice"))  # twice's own cache of digests and keys
    if run_dir:
        paths.add(run_dir)
    found = {os.path.join(os.path.abspath(p), "") for p in paths}
    found.update(os.path.join(os.path.realpath(p), "") for p in paths)
    return tuple(sorted(found))


def _on_event(event: str, args: tuple) -> None:
    if _state["full"] or (event != "open" and event not in _STARTS):
        return
    try:  # an audit hook that raises would fail the user's open(): never
        if event == "open":
            _record_open(*args)
        else:
            _record_start(event, args)
    except Exception:  # noqa: BLE001 - a file twice cannot examine is a file it does not list
        return


def _record_start(event: str, args: tuple) -> None:
    """A program this process starts, unless an installed package or the standard library
    (not the script) starts it."""
    frame = sys._getframe(2)
    while frame is not None and os.path.basename(frame.f_code.co_filename) in (
        "subprocess.py", "os.py", "pty.py",
    ):  # fmt: skip
        frame = frame.f_back
    if frame is None or _left_out(os.path.realpath(frame.f_code.co_filename)):
        return
    at, env_at = _STARTS[event]
    program = "/bin/sh" if at is None else os.fsdecode(args[at])
    if os.sep not in program:
        import shutil

        program = shutil.which(program) or program
    env = None if env_at is None else args[env_at]
    watched = env is None or _BOOT in str(_env_value(env, "PYTHONPATH")).split(os.pathsep)
    _note(STARTED + os.path.abspath(program), [int(watched), 0, 0])
    if _state["forked"] or _in_child() or event == "os.exec":
        _write_own_record()  # an exec replaces this process before its exit could write it


def _env_value(env, name: str):
    """A variable of an environment given as str or bytes keys."""
    found = env.get(name)
    if found is None:
        found = env.get(name.encode())
    return os.fsdecode(found) if found is not None else ""


def _note(name: str, facts: list[int]) -> None:
    if len(_seen) >= MAX_FILES:
        _state["full"] = True
        return
    _seen[name] = facts
    if _state["forked"]:
        _child[name] = facts


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
    if name in _seen or name in _ignored or name.endswith(_SKIP_SUFFIXES):
        return
    if name.endswith(".py") and _opened_for_code():
        return  # an import (its module is in the code record), or a traceback's source line
    if _left_out(name) or _left_out(real := os.path.realpath(name)):
        _ignore(name)
        return
    info = os.stat(real)
    if not stat.S_ISREG(info.st_mode):  # a FIFO, a device, a socket: no content to compare
        _ignore(name)
        return
    _note(name, [info.st_size, info.st_mtime_ns, info.st_ino])
    if not _state["full"] and (_state["forked"] or _in_child()):
        mine = len(_child) if _state["forked"] else len(_seen)
        if mine <= EAGER_FILES or time.monotonic() - _state["written"] >= REWRITE_S:
            _write_own_record()


def _left_out(path: str) -> bool:
    return path.startswith(_state["skip"]) or any(part in path for part in _SKIP_PARTS)


def _ignore(name: str) -> None:
    if len(_ignored) < MAX_FILES:  # bounded: past it, such a file is only examined again
        _ignored.add(name)


def _opened_for_code() -> bool:
    """Whether a Python source is being opened by the import system or by linecache (a
    traceback, a warning, inspect.getsource) rather than read as data."""
    frame = sys._getframe(2)
    for _ in range(16):
        if frame is None:
            return False
        code = frame.f_code
        if code.co_name == "get_data" and "importlib" in code.co_filename:
            return True
        if code.co_filename.endswith("linecache.py"):
            return True
        frame = frame.f_back
    return False


def _in_child() -> bool:
    """A process multiprocessing started (spawn, forkserver): it may be terminated before its
    exit writes its record."""
    process = sys.modules.get("multiprocessing.process")
    return process is not None and process.parent_process() is not None


def _write_own_record() -> None:
    """This process's record of the files it read (procs/<pid>.json): a forked child's only
    record; in a spawned one, replaced by the bootstrap's at its exit. Not synced to disk: it
    only has to outlive the process, not the machine."""
    with _lock:
        if _state["final"] or _state.get("writing"):
            return
        _state["writing"] = True
        try:
            import json

            from twice.store.layout import RunFolder

            folder = RunFolder(_state["run_dir"])
            target = folder.proc_record(os.getpid())
            record = {
                "pid": os.getpid(),
                "ppid": os.getppid(),
                "started": _state["started"],
                "reads": dict(_child if _state["forked"] else _seen),
            }
            if _state["forked"]:  # a forked worker's own seeding (a worker_init_fn's) is its own
                from twice.runtime import seedcalls

                record["seeding"] = seedcalls.recorded()
            os.makedirs(folder.procs, exist_ok=True)
            temporary = target.with_name(f".{target.name}.{_thread.get_ident()}.tmp")
            with open(temporary, "w", encoding="utf-8") as handle:
                handle.write(json.dumps(record, sort_keys=True))
            os.replace(temporary, target)
        except (OSError, ValueError, TypeError):
            pass  # an unwritable record costs the record, never the user's open()
        finally:
            _state["written"] = time.monotonic()
            _state["writing"] = False


def _after_fork_in_child() -> None:
    global _lock
    _lock = _thread.RLock()  # another thread may have held it at the fork
    _child.clear()
    _state.update(forked=True, final=False, writing=False, written=0.0, started=time.time())
    util = sys.modules.get("multiprocessing.util")
    if util is not None:  # a multiprocessing child ends with os._exit: write as it shuts down
        util.register_after_fork(_TOKEN, _at_multiprocessing_exit)


def _at_multiprocessing_exit(_token: _Token) -> None:
    # registered after the child's finalizers were cleared, so that this one stays
    util = sys.modules["multiprocessing.util"]
    util.Finalize(None, _flush, exitpriority=0)


def _flush() -> None:
    """A child's last write of its record, for the files read since the one before."""
    if (_state["forked"] and (_child or _seeded())) or (
        not _state["forked"] and _in_child() and _seen
    ):
        _write_own_record()


def _seeded() -> bool:
    """Whether this (forked) process made seeding calls of its own."""
    seedcalls = sys.modules.get("twice.runtime.seedcalls")
    return seedcalls is not None and bool(seedcalls.recorded()["calls"])


def watch_reads(run_dir: str | None) -> None:
    """Start recording the files this process opens for reading (once per process; an audit
    hook cannot be removed, so it stays for the process's life)."""
    if _state["installed"]:
        return
    _state.update(
        skip=_skipped_prefixes(run_dir), run_dir=run_dir, started=time.time(), written=0.0
    )
    _state["installed"] = True
    sys.addaudithook(_on_event)
    if run_dir:
        os.register_at_fork(after_in_child=_after_fork_in_child)
        atexit.register(_flush)  # a forked child that exits as a process does


def files_read() -> dict[str, list[int]]:
    """{absolute path: [size, mtime_ns, inode] when first opened} of the files read so far, with
    OVERFLOW when there were more than MAX_FILES. Called for the process's own record at its
    exit: the child's interim records stop here, so that none replaces it."""
    with _lock:
        _state["final"] = True
    found = dict(_seen)
    if _state["full"]:
        found[OVERFLOW] = [0, 0, 0]
    return found
