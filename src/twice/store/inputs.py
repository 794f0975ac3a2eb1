"""The files a run read, as the manifest records them: path, size, mtime and xxh3, hashed once
and cached by (path, size, mtime, inode), so a large dataset is not read again on every run.

A file larger than SAMPLE_ABOVE is hashed from SAMPLES evenly spaced blocks and its size (and
labelled `sampled`): a change outside those blocks that keeps the size and mtime goes unseen,
which the label says. A file whose size, mtime or inode changed between its first open and the
run's end (the run rewrote it) is listed as `changed`, without a digest: what was read is gone.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import xxhash
from filelock import FileLock, Timeout

from twice.core.errors import CorruptRecord
from twice.store import reader
from twice.store.files import write_json_atomic

__all__ = ["InputFile", "hash_inputs", "cache_path", "SAMPLE_ABOVE", "inputs_under"]

SAMPLE_ABOVE = 4 << 30  # 4 GiB: above it, sampled
SAMPLES, BLOCK = 64, 1 << 20
_CACHE_ENTRIES = 20_000
CACHE_LIMIT = 64 << 20  # the cache of digests: 20,000 entries of ~150 bytes


@dataclass(frozen=True)
class InputFile:
    """One file a run read."""

    path: str  # relative to the run's working folder where it lies under it
    size: int
    mtime_ns: int
    xxh3: str | None  # None: the run changed it (`changed`)
    sampled: bool = False
    changed: bool = False

    def to_json(self) -> dict:
        """As the manifest's context.inputs holds it."""
        data = {"path": self.path, "size": self.size, "mtime_ns": self.mtime_ns, "xxh3": self.xxh3}
        if self.sampled:
            data["sampled"] = True
        if self.changed:
            data["changed"] = True
        return data


def cache_path() -> Path:
    """Where digests of files read are cached for this user."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "twice" / "inputs.json"


def _digest(path: str, size: int) -> tuple[str, bool]:
    """(xxh3-128 hex, sampled) of a file's bytes."""
    hasher = xxhash.xxh3_128()
    with reader.open_input(Path(path)) as handle:
        if size <= SAMPLE_ABOVE:
            while chunk := handle.read(1 << 22):
                hasher.update(chunk)
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


def hash_inputs(reads: dict[str, list[int]], cwd: str) -> list[InputFile]:
    """The files in `reads` ({path: [size, mtime_ns, inode] when first opened}), each hashed or
    taken from the cache; paths under `cwd` relative to it. Files gone since are left out."""
    cache_file = cache_path()
    cache: dict[str, list] = {}
    try:
        loaded = reader.read_json(cache_file, CACHE_LIMIT)
        if isinstance(loaded, dict):
            cache = {k: v for k, v in loaded.items() if isinstance(v, list) and len(v) == 2}
    except (OSError, CorruptRecord):
        pass  # a damaged cache only costs a re-hash
    found, added = [], {}
    for path, (size, mtime_ns, inode) in sorted(reads.items()):
        try:
            info = os.stat(path)
        except OSError:
            continue
        shown = os.path.relpath(path, cwd) if path.startswith(os.path.join(cwd, "")) else path
        if (info.st_size, info.st_mtime_ns, info.st_ino) != (size, mtime_ns, inode):
            found.append(InputFile(shown, info.st_size, info.st_mtime_ns, None, changed=True))
            continue
        key = f"{os.path.realpath(path)}|{size}|{mtime_ns}|{inode}"
        hit = cache.get(key)
        if hit is not None and isinstance(hit[0], str) and isinstance(hit[1], bool):
            digest, sampled = hit
        else:
            try:
                digest, sampled = _digest(path, size)
            except (OSError, CorruptRecord):
                continue  # gone, or no longer a regular file: not an input to hash
            added[key] = [digest, sampled]
        found.append(InputFile(shown, size, mtime_ns, digest, sampled))
    if added:
        _save_cache(cache_file, added)
    return found


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
