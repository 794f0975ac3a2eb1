"""The files a run read, as the manifest records them: path, size, mtime, inode and xxh3, hashed
once and cached by (path, device, inode, size, mtime, ctime), so a large dataset is not read
again on every run: `cp -p`, `rsync --inplace -t` and `touch -r` keep the inode, size and mtime
of a rewritten file, but no user can set its ctime.

Every file under the working folder and the `--inputs` folders is hashed, never taken from the
cache. Elsewhere (a dataset in
../data, weights in ~/.cache) files are hashed within a budget of HASH_BUDGET bytes and
HASH_SECONDS per run, smallest first; a digest found in the cache costs nothing against it. A file
left over is recorded by size and time only and labelled `not_hashed: "over the budget"`.

A file larger than SAMPLE_ABOVE is hashed from SAMPLES evenly spaced blocks and its size (and
labelled `sampled`): a change outside those blocks that keeps the size and mtime goes unseen,
which the label says. A file whose size, mtime or inode changed between its first open and the
run's end (the run rewrote it) is listed as `changed`, without a digest: what was read is gone. A
file read and gone by the run's end is listed as `gone` (the size, mtime and inode seen at its
open, no digest): not compared, and said so. A file last written while the run ran (a temporary
file, a cache the run filled) is the run's own product, not an input: listed as `made_by_run`,
without a digest; a file whose mtime lies after the run's end (clock skew, a tar from another
machine) is an input like any other.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import xxhash
from filelock import FileLock, Timeout

from twice.core.errors import CorruptRecord
from twice.store import reader
from twice.store.files import write_json_atomic

__all__ = [
    "InputFile",
    "hash_inputs",
    "cache_path",
    "coverage",
    "SAMPLE_ABOVE",
    "HASH_BUDGET",
    "inputs_under",
    "python_program",
]

SAMPLE_ABOVE = 4 << 30  # 4 GiB: above it, sampled
SAMPLES, BLOCK = 64, 1 << 20
HASH_BUDGET = 2 << 30
"""Bytes hashed per run outside the working and --inputs folders (cache hits are free)."""
"""Files at least this large are hashed from a memory mapping, in a child process."""
OVER_BUDGET = "over the budget"
_CHUNK = 1 << 20  # read into one buffer, hashed while it is in the CPU's cache
_CACHE_ENTRIES = 20_000
CACHE_LIMIT = 64 << 20  # the cache of digests: 20,000 entries of ~150 bytes


@dataclass(frozen=True)
class InputFile:
    """One file a run read."""

    path: str  # relative to the run's working folder where it lies under it, else absolute
    size: int
    mtime_ns: int
    xxh3: str | None  # None: the run changed or made it, or it was not hashed
    sampled: bool = False
    changed: bool = False
    inode: int = 0
    outside: bool = False  # outside the working and --inputs folders
    not_hashed: str | None = None  # why it was compared by size and time only
    made_by_run: bool = False  # last written after the run started: its product, not an input
    code: bool = False  # a Python source read as data (exec, runpy): part of the code
    gone: bool = False  # read, and gone by the run's end: not compared

    def to_json(self) -> dict:
        """As the manifest's context.inputs holds it."""
        data = {
            "path": self.path,
            "size": self.size,
            "mtime_ns": self.mtime_ns,
            "inode": self.inode,
            "xxh3": self.xxh3,
        }
        for flag in ("sampled", "changed", "outside", "made_by_run", "code", "gone"):
            if getattr(self, flag):
                data[flag] = True
        if self.not_hashed:
            data["not_hashed"] = self.not_hashed
        return data

    def identity(self) -> str:
        """What the manifest's identity compares: the digest, or what stands for it."""
        if self.xxh3 is not None:
            return self.xxh3
        if self.changed:
            return "changed during the run"
        if self.made_by_run:
            return "made by the run"
        if self.gone:
            return "read, and gone by the run's end"
        return f"not hashed: {self.size} bytes, mtime_ns {self.mtime_ns}"


def cache_path() -> Path:
    """Where digests of files read are cached for this user."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "twice" / "inputs.json"


MAP_ABOVE = 64 << 20  # from here a file is hashed from a mapping, in a process of its own
# What that process runs: each descriptor passed to it (opened, and checked a regular file, by
# the read door here) mapped and hashed; a digest per line, "<index> <xxh3-128 hex>".
_MAPPED_HASHER = """
import mmap, sys, xxhash
args = sys.argv[1:]
for index in range(0, len(args), 2):
    fd, size = int(args[index]), int(args[index + 1])
    try:
        with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as mapped:
            if len(mapped) != size:
                continue
            hasher, view = xxhash.xxh3_128(), memoryview(mapped)
            for start in range(0, size, 1 << 24):
                hasher.update(view[start : start + (1 << 24)])
            view.release()
        print(index // 2, hasher.hexdigest(), flush=True)
    except Exception:
        continue
"""


def _mapped_digests(files: list[tuple[str, int]]) -> dict[str, str]:
    """{path: xxh3-128 hex} of large files, hashed from a memory mapping, which spares the copy
    out of the page cache (about 0.9x the cost of reading the file once, against 1.2x for a
    read into a buffer and its hash: bench/bench_inputs.py). In a new process (started by exec,
    never a fork of this one, whose threads could hold a lock the child needs): a mapped file
    truncated meanwhile raises SIGBUS, which ends that process, not the run's. What it did not
    report the caller hashes by reading."""
    import subprocess
    import sys

    handles, argv = [], []
    try:
        for path, size in files:
            try:
                handle = reader.open_input(Path(path))
            except (OSError, CorruptRecord):
                handle = None
            handles.append(handle)
            if handle is not None:
                argv += [str(handle.fileno()), str(size)]
        if not argv:
            return {}
        done = subprocess.run(
            [sys.executable, "-I", "-c", _MAPPED_HASHER, *argv],
            pass_fds=[h.fileno() for h in handles if h is not None],
            capture_output=True,
            text=True,
            timeout=3600,
        )
    except (OSError, subprocess.SubprocessError):
        return {}
    finally:
        for handle in handles:
            if handle is not None:
                handle.close()
    opened = [path for (path, _), handle in zip(files, handles) if handle is not None]
    found = {}
    for line in done.stdout.splitlines():
        index, _, digest = line.partition(" ")
        if index.isdigit() and int(index) < len(opened) and len(digest) == 32:
            found[opened[int(index)]] = digest
    return found


def _digest(path: str, size: int) -> tuple[str, bool]:
    """(xxh3-128 hex, sampled) of a file's bytes."""
    hasher = xxhash.xxh3_128()
    with reader.open_input(Path(path)) as handle:
        if size <= SAMPLE_ABOVE:
            # one buffer, refilled: no allocation per chunk, and each chunk hashed while it is
            # still in the CPU's cache, so hashing costs about what reading the file once does
            buffer = bytearray(_CHUNK)
            view = memoryview(buffer)
            while count := handle.readinto(buffer):
                hasher.update(view[:count])
            return hasher.hexdigest(), False
        hasher.update(size.to_bytes(8, "little"))
        for index in range(SAMPLES):
            handle.seek((size - BLOCK) * index // (SAMPLES - 1))
            hasher.update(handle.read(BLOCK))
        return hasher.hexdigest(), True


def inputs_under(
    reads: dict[str, list[int]], roots: list[str], exclude: list[str]
) -> dict[str, list[int]]:
    """The reads under any of `roots` and under none of `exclude` (absolute folders)."""
    roots_ = tuple(os.path.join(os.path.realpath(r), "") for r in roots)
    exclude_ = tuple(os.path.join(os.path.realpath(e), "") for e in exclude)
    return {
        path: facts
        for path, facts in reads.items()
        if os.path.realpath(path).startswith(roots_)
        and not os.path.realpath(path).startswith(exclude_)
    }


def hash_inputs(
    reads: dict[str, list[int]],
    cwd: str,
    *,
    roots: list[str] | None = None,
    started: float | None = None,
    ended: float | None = None,
    budget: int = HASH_BUDGET,
) -> list[InputFile]:
    """The files in `reads` ({path: [size, mtime_ns, inode] when first opened}), each hashed or
    taken from the cache; paths under `cwd` relative to it. Files under `roots` (None: all of
    them) are always hashed, never taken from the cache; Python sources are always hashed; the
    others within `budget` bytes, smallest first. A file written between `started` and `ended`
    (seconds since 1970; `ended` None: now) is the run's own. A file gone since is listed as
    `gone`."""
    cache_file = cache_path()
    cache: dict[str, list] = {}
    try:
        loaded = reader.read_json(cache_file, CACHE_LIMIT)
        if isinstance(loaded, dict):
            cache = {k: v for k, v in loaded.items() if isinstance(v, list) and len(v) == 2}
    except (OSError, CorruptRecord):
        pass  # a damaged cache only costs a re-hash
    inside = tuple(os.path.join(os.path.realpath(r), "") for r in roots or ())
    # the run's own files were written while it ran: an mtime after its end is no sign of that
    since = None if started is None else int(started * 1e9)
    until = int((time.time() if ended is None else ended) * 1e9)
    found, added, files = [], {}, []
    for path, (size, mtime_ns, inode) in reads.items():
        try:
            info = os.stat(path)
        except OSError:
            info = None  # read, and gone by now
        outside = roots is not None and not os.path.realpath(path).startswith(inside)
        files.append((outside, size if outside else 0, path, size, mtime_ns, inode, info))
    spent, pending = 0, []
    for outside, _, path, size, mtime_ns, inode, info in sorted(files, key=lambda f: f[:3]):
        shown = os.path.relpath(path, cwd) if path.startswith(os.path.join(cwd, "")) else path
        facts = dict(inode=inode, outside=outside, code=path.endswith(".py"))
        if since is not None and since <= mtime_ns <= until:
            found.append(
                InputFile(shown, size, mtime_ns, None, made_by_run=True, gone=info is None, **facts)
            )
            continue
        if info is None:
            found.append(InputFile(shown, size, mtime_ns, None, gone=True, **facts))
            continue
        if (info.st_size, info.st_mtime_ns, info.st_ino) != (size, mtime_ns, inode):
            found.append(
                InputFile(shown, info.st_size, info.st_mtime_ns, None, changed=True, **facts)
            )
            continue
        key = f"{os.path.realpath(path)}|{info.st_dev}|{inode}|{size}|{mtime_ns}|{info.st_ctime_ns}"
        hit = cache.get(key) if outside else None  # under the folders: always hashed
        if hit is not None and isinstance(hit[0], str) and isinstance(hit[1], bool):
            found.append(InputFile(shown, size, mtime_ns, hit[0], hit[1], **facts))
            continue
        cost = size if size <= SAMPLE_ABOVE else SAMPLES * BLOCK
        if outside and not facts["code"]:
            if spent + cost > budget:
                found.append(
                    InputFile(shown, size, mtime_ns, None, not_hashed=OVER_BUDGET, **facts)
                )
                continue
            spent += cost
        pending.append((shown, path, size, mtime_ns, key if outside else None, facts))
    mapped = _mapped_digests([(p[1], p[2]) for p in pending if MAP_ABOVE <= p[2] <= SAMPLE_ABOVE])
    for shown, path, size, mtime_ns, key, facts in pending:
        try:
            digest, sampled = (mapped[path], False) if path in mapped else _digest(path, size)
        except (OSError, CorruptRecord):  # gone, or no longer a regular file: not compared
            found.append(InputFile(shown, size, mtime_ns, None, gone=True, **facts))
            continue
        if key is not None:
            added[key] = [digest, sampled]
        found.append(InputFile(shown, size, mtime_ns, digest, sampled, **facts))
    if added:
        _save_cache(cache_file, added)
    return sorted(found, key=lambda f: f.path)


def coverage(
    files: list[InputFile],
    unrecorded: bool = False,
    *,
    stdin_pipe: bool = False,
    not_python: list[str] | None = None,
    unwatched_python: list[str] | None = None,
) -> dict:
    """What the record of `files` covers, as the manifest's context.inputs_coverage holds it:
    `scope` "everywhere" (every file the run's processes read, but the interpreter's, installed
    packages' and the system's), counts of the files compared by content and of those that are
    not (not hashed, sampled, changed during the run, gone by its end), whether a process read
    more files than it records (`unrecorded`), and what no record can see: standard input that
    was a pipe (`stdin_pipe`), programs the script started that are not Python (`not_python`)
    or Python that twice did not watch (`unwatched_python`)."""
    data = [f for f in files if not f.code and not f.made_by_run]
    seen = {
        key: sorted(set(names))
        for key, names in (("not_python", not_python), ("unwatched_python", unwatched_python))
        if names
    }
    return {
        **({"stdin_pipe": True} if stdin_pipe else {}),
        **seen,
        "gone": sum(f.gone for f in data),
        "scope": "everywhere",
        "files": len(data),
        "outside": sum(f.outside for f in data),
        "not_hashed": sum(f.not_hashed is not None for f in data),
        "sampled": sum(f.sampled for f in data),
        "changed": sum(f.changed for f in data),
        "made_by_run": sum(f.made_by_run for f in files),
        "budget_bytes": HASH_BUDGET,
        "unrecorded": unrecorded,
    }


def python_program(program: str) -> bool:
    """Whether a program a process started is a Python interpreter, or a script it runs (by its
    `#!` line): twice's bootstrap records what it reads."""
    if os.path.basename(program).startswith("python"):
        return True
    try:
        with reader.open_input(Path(program)) as handle:
            first = handle.read(256).split(b"\n", 1)[0]
    except (OSError, CorruptRecord):
        return False
    return first.startswith(b"#!") and b"python" in first


def _save_cache(cache_file: Path, added: dict) -> None:
    """Merge `added` into the cache under a lock (runs finishing together lose nothing); a cache
    that cannot be written only costs a re-hash next time."""
    try:
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(cache_file) + ".lock", timeout=30):
            try:
                cache = reader.read_json(cache_file, CACHE_LIMIT)
                cache = cache if isinstance(cache, dict) else {}
            except (OSError, CorruptRecord):
                cache = {}
            cache.update(added)
            if len(cache) > _CACHE_ENTRIES:  # oldest first out (dicts keep insertion order)
                cache = dict(list(cache.items())[-_CACHE_ENTRIES:])
            write_json_atomic(cache_file, cache)
    except (OSError, Timeout):
        pass
