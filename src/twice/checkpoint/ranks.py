"""Checkpoints of multi-process runs: one part per rank, complete when rank 0 has indexed them all.

Every rank writes its own part (a complete checkpoint folder of its entries); sharded models and
optimizers (DTensor parameters) are saved by every rank together through DCP into `dcp/`
(checkpoint/sharded.py). The ranks agree on each stage's success, so that all raise together
rather than hang in a barrier.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from twice.checkpoint.folder import (
    INDEX,
    RANKS_FORMAT,
    _digest_file,
    _fsync_dir,
    _move_into_place,
    _save_one,
    _sweep_stale_temporaries,
    _write_file,
)
from twice.checkpoint.index import DCP_FOLDER, index_bytes, part_name
from twice.checkpoint.sharded import is_sharded, save_sharded
from twice.core.errors import CheckpointError

__all__ = ["process_group", "save_ranks", "current_rank"]


def process_group():
    """torch.distributed when a process group of more than one process is up, else None."""
    import sys

    torch = sys.modules.get("torch")
    if torch is None:
        return None
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return dist
    return None


def _agree(dist, failure: str | None, what: str, value: Any = None) -> list:
    """Every rank learns whether any rank failed `what` (all raise together rather than hang in a
    barrier); otherwise every rank's `value`, by rank."""
    results: list = [None] * dist.get_world_size()
    dist.all_gather_object(results, (failure, value))
    bad = [(r, f) for r, (f, _) in enumerate(results) if f]
    if bad:
        rank, message = bad[0]
        raise CheckpointError(
            f"{what} failed on rank {rank}: {message}",
            "the previous checkpoint is intact; fix the cause (disk space, permissions) and save "
            "again",
        )
    return [v for _, v in results]


def save_ranks(directory: Path, dist, entries: dict) -> None:
    """Every rank writes its part; rank 0 indexes them all once every part is in place."""
    rank, world = dist.get_rank(), dist.get_world_size()
    staging = directory.parent / f".{directory.name}.ranks.tmp"
    failure = None
    if rank == 0:
        try:
            _sweep_stale_temporaries(directory.parent)
            shutil.rmtree(staging, ignore_errors=True)  # what an interrupted save of this step left
            staging.mkdir()
        except OSError as exc:
            failure = str(exc)
    _agree(dist, failure, "preparing the checkpoint")
    sharded = {name: obj for name, obj in entries.items() if is_sharded(obj)}
    if sharded:  # FSDP2 / tensor-parallel state: every rank its shards, through DCP
        try:
            save_sharded(staging / DCP_FOLDER, sharded)
        except (OSError, CheckpointError, RuntimeError, ValueError) as exc:
            failure = f"{type(exc).__name__}: {exc}"
        _agree(dist, failure, "saving the sharded state through DCP")
    mine = None
    try:
        plain = {name: obj for name, obj in entries.items() if name not in sharded}
        _save_one(staging / part_name(rank), plain)
        # Each part's own index already holds the digest of every file in it, taken as it was
        # written.
        mine = _digest_file(staging / part_name(rank) / INDEX)
    except (OSError, CheckpointError) as exc:
        failure = str(exc)
    indexes = _agree(dist, failure, "writing the rank's part", mine)
    if rank == 0:
        try:
            parts = {part_name(r): digest for r, digest in enumerate(indexes)}
            index = {"format": RANKS_FORMAT, "world_size": world, "parts": parts}
            if sharded:
                folder = staging / DCP_FOLDER
                index["sharded"] = {
                    "entries": sorted(sharded),
                    "files": {
                        path.name: {"size": path.stat().st_size, "digest": _digest_file(path)}
                        for path in sorted(folder.iterdir())
                    },
                }
                _fsync_dir(folder)
            _write_file(staging / INDEX, index_bytes(index))
            _fsync_dir(staging)
            _move_into_place(staging, directory)
        except (OSError, CheckpointError) as exc:
            failure = str(exc)
    # No rank goes on (and perhaps resumes from `latest`) before the checkpoint is in place.
    _agree(dist, failure, "completing the checkpoint")


def current_rank() -> tuple[int, int]:
    """(rank, world size) of this process: the process group's, else RANK/WORLD_SIZE."""
    group = process_group()
    if group is not None:
        return group.get_rank(), group.get_world_size()
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
