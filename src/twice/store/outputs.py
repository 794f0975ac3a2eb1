"""The files a run wrote in its working folder: found by modification time, named by digest.

A run's trace compares its training steps; what it leaves on disk (a saved model, predictions,
a metrics CSV) is its result too, and the only one a script without a recognisable step has.
After the command ends the launcher lists the files under the working folder modified since it
started, and the manifest's context keeps their sizes and xxh3 digests (never their contents), so
that `twice diff` can say which outputs are byte-identical. A Distributed Checkpoint's `.metadata`
also gets the digest of its state without the save's own id and folder (store/dcpmeta.py), so
that two saves of the same state are named as such, not as a difference.
"""

from __future__ import annotations

import os
from pathlib import Path

import xxhash

from twice.core.errors import CorruptRecord
from twice.store import dcpmeta, reader

__all__ = ["written_files", "compare_outputs", "outputs_phrase", "SKIPPED_FOLDERS"]

# Folders never walked: version control, environments, caches, and twice's own runs.
SKIPPED_FOLDERS = frozenset(
    {".git", ".hg", ".svn", ".venv", "venv", "node_modules", "__pycache__", ".mypy_cache",
     ".pytest_cache", ".ruff_cache", ".tox", ".cache", "wandb", "mlruns", "lightning_logs"}
)  # fmt: skip
MAX_FILES = 1000  # at most this many files are listed (the newest first)
MAX_ENTRIES = 200_000  # the walk stops after this many directory entries
MAX_DIGEST_BYTES = 1 << 30  # a file over this is listed by size only


def written_files(root: Path, since: float, exclude: list[Path]) -> dict[str, dict]:
    """{path relative to root: {"size", "xxh3"}} of the regular files under `root` modified at or
    after `since` (seconds since the epoch), outside `exclude` (the runs folder) and the folders
    in SKIPPED_FOLDERS. Bounded: MAX_FILES files, MAX_ENTRIES entries walked."""
    root = Path(root)
    excluded = {os.path.realpath(p) for p in exclude}
    since_ns = int(since * 1e9) - 50_000_000  # file times lag the clock by a tick: 50 ms slack
    found: list[tuple[int, str, int]] = []
    seen = 0
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(
            d
            for d in dirs
            if d not in SKIPPED_FOLDERS
            and os.path.realpath(os.path.join(folder, d)) not in excluded
        )
        seen += len(dirs) + len(files)
        for name in sorted(files):
            path = os.path.join(folder, name)
            try:
                info = os.stat(path, follow_symlinks=False)
            except OSError:
                continue
            if info.st_mtime_ns >= since_ns and os.path.isfile(path) and not os.path.islink(path):
                found.append((info.st_mtime_ns, path, info.st_size))
        if seen > MAX_ENTRIES:
            break
    found.sort(reverse=True)
    out: dict[str, dict] = {}
    for _, path, size in found[:MAX_FILES]:
        entry: dict = {"size": size}
        if size <= MAX_DIGEST_BYTES:
            entry["xxh3"] = _file_digest(path)
        if dcpmeta.is_dcp_metadata(Path(path)):  # DCP's record of a save: its state apart
            entry["dcp_state"] = dcpmeta.state_digest(Path(path))
        out[Path(path).relative_to(root).as_posix()] = entry
    return dict(sorted(out.items()))


def _file_digest(path: str) -> str | None:
    hasher = xxhash.xxh3_128()
    try:
        with reader.open_input(Path(path)) as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                hasher.update(block)
    except (OSError, CorruptRecord):
        return None
    return hasher.hexdigest()


def compare_outputs(a: dict | None, b: dict | None) -> dict[str, list[str]]:
    """{"identical", "dcp_save_id", "differ", "only_a", "only_b"}: the output files of two runs,
    by digest ("dcp_save_id": DCP metadata that differ only in what DCP records of the save)."""
    a, b = a or {}, b or {}
    both = sorted(set(a) & set(b))
    same = [
        p
        for p in both
        if a[p].get("xxh3") is not None
        and a[p].get("xxh3") == b[p].get("xxh3")
        and a[p].get("size") == b[p].get("size")
    ]
    # DCP metadata that differs only in what DCP records of the save (a random id, the folder)
    save_only = [
        p
        for p in both
        if p not in same
        and a[p].get("dcp_state") is not None
        and a[p].get("dcp_state") == b[p].get("dcp_state")
    ]
    return {
        "identical": same,
        "dcp_save_id": save_only,
        "differ": [p for p in both if p not in same and p not in save_only],
        "only_a": sorted(set(a) - set(b)),
        "only_b": sorted(set(b) - set(a)),
    }


def outputs_phrase(outputs: dict[str, list[str]]) -> str:
    """The files two runs wrote, in words: "files written: 2 byte-identical, 1 differs (x.pt)"."""
    parts = []
    if outputs.get("identical"):
        parts.append(f"{len(outputs['identical'])} byte-identical")
    if outputs.get("dcp_save_id"):
        parts.append(
            f"{len(outputs['dcp_save_id'])} DCP metadata differ only in the random save id and "
            f"folder DCP records at each save ({', '.join(outputs['dcp_save_id'][:5])})"
        )
    if outputs.get("differ"):
        parts.append(f"{len(outputs['differ'])} differ ({', '.join(outputs['differ'][:5])})")
    for side in ("a", "b"):
        only = outputs.get(f"only_{side}")
        if only:
            parts.append(f"{len(only)} written by {side.upper()} only ({', '.join(only[:5])})")
    return "files the runs wrote: " + (", ".join(parts) if parts else "none recorded")
