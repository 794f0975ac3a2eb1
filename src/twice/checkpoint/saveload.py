"""Saving and loading checkpoints, finding the latest good one, keeping the last N.

A checkpoint is a folder (checkpoint/folder.py): tensors in safetensors, everything else in JSON,
each file digested. Loading checks every file against its digest and refuses anything twice did
not write. Floats are kept exact (JSON floats round-trip in Python; NaN and infinities are stored
as float.hex).
"""

from __future__ import annotations

import errno
import json
import warnings
from pathlib import Path
from typing import Any

from twice.checkpoint.codec import decode
from twice.checkpoint.folder import (
    STATE,
    STEP_DIR,
    TENSORS,
    _save_one,
    _sweep_stale_temporaries,
    part_name,
    remove_checkpoint,
    verify,
)
from twice.checkpoint.index import CheckpointIndex, RanksIndex
from twice.checkpoint.ranks import current_rank, process_group, save_ranks
from twice.checkpoint.sharded import DCP_FOLDER, check_sharded, load_sharded
from twice.core.errors import CheckpointError
from twice.store.files import read_record

__all__ = ["save", "load", "latest", "list_checkpoints", "step_dir"]


def save(
    directory: str | Path, *, keep_last: int | None = None, collective: bool = False, **entries: Any
) -> Path:
    """Write `entries` (models, optimizers, schedulers, GradScalers, generators, plain values) to
    `directory`.

    The checkpoint appears complete or not at all. With `keep_last=N`, older `step-*` siblings
    beyond the newest N are removed afterwards.

    With `collective=True` under torch.distributed (world size > 1), every rank must call it: each
    writes its own part (`rank-00000/`, ... each a complete checkpoint of that rank's entries), and
    rank 0 writes the index that makes the whole complete only after every part is in.

    >>> twice.checkpoint.save("ckpt/step-00000100", model=model, optimizer=opt)  # doctest: +SKIP
    """
    directory = Path(directory)
    try:
        directory.parent.mkdir(parents=True, exist_ok=True)
        group = process_group() if collective else None
        if group is not None:
            save_ranks(directory, group, entries)
        else:
            _sweep_stale_temporaries(directory.parent)
            _save_one(directory, entries)
        if keep_last is not None and (group is None or group.get_rank() == 0):
            _retain(directory.parent, keep_last)
    except OSError as exc:  # nothing was put in place: the previous checkpoints are as they were
        raise CheckpointError(
            f"cannot write checkpoint {directory}: {exc.strerror or exc}"
            + (f" ({exc.filename})" if exc.filename else ""),
            _SAVE_HINTS.get(exc.errno, _SAVE_HINT),
        ) from exc
    return directory


_SAVE_HINT = "save into a folder you can write to"
_SAVE_HINTS = {
    errno.ENOSPC: "free some space on that disk, or save elsewhere",
    errno.EDQUOT: "your disk quota is used up: free some space, or save elsewhere",
    errno.EFBIG: "a file is larger than this process may write (ulimit -f) or the filesystem "
    "holds: raise the limit, or save elsewhere",
    errno.EROFS: "that filesystem is read-only: save elsewhere",
    errno.EEXIST: "a part of the path is a file, not a folder: choose another path",
    errno.ENOTDIR: "a part of the path is a file, not a folder: choose another path",
}


def _retain(parent: Path, keep_last: int) -> None:
    if keep_last < 1:
        raise ValueError("keep_last must be at least 1")
    for old in list_checkpoints(parent)[:-keep_last]:
        remove_checkpoint(old)  # only what twice wrote; a foreign step-N folder stays


def verify_loadable(directory: str | Path) -> CheckpointIndex | RanksIndex:
    """What `twice checkpoint verify` calls "valid": the folder's files match their digests
    (checkpoint.folder.verify) and everything in it decodes as load() decodes it, sparse tensors
    through PyTorch's invariant checks, in every rank's part. A crafted folder recomputes its
    digests; it cannot make a malformed entry decode."""
    directory = Path(directory)
    index = verify(directory)
    if isinstance(index, RanksIndex):
        for name in sorted(index.parts):
            verify_loadable(directory / name)
        if index.sharded_files is not None:
            check_sharded(directory / DCP_FOLDER, index.sharded_files)
    else:
        _read_state(directory, index.entries)
    return index


def load(
    directory: str | Path,
    *,
    strict: bool = True,
    rank: int | None = None,
    world_size_change: bool = False,
    **targets: Any,
) -> dict[str, Any]:
    """Verify `directory`, restore each entry into the object passed under its name, and return all
    entries.

    Entries without a target come back as plain values (tensors, numbers, dicts). In strict mode
    an entry in the checkpoint that is not asked for, or a target the checkpoint lacks, is an error
    naming it; `strict=False` restores what matches.

    A multi-rank checkpoint restores this process's rank's part (or `rank`'s). Resuming it at
    another world size is refused unless `world_size_change=True`; then rank r takes part r (rank
    0's
    where there is none), with a warning that the result cannot be bitwise equal to the original.
    """
    directory = Path(directory)
    index = verify(directory)
    if isinstance(index, RanksIndex):
        here, world = current_rank()
        rank = here if rank is None else rank
        saved = index.world_size
        if world != saved and not world_size_change:
            raise CheckpointError(
                f"checkpoint {directory.name} was written by {saved} processes; this run has "
                f"{world}",
                f"resume with the same world size ({saved}) for a bitwise continuation, or pass "
                "world_size_change=True (twice.Run(resume_world_size_change=True)) to accept a "
                "non-bitwise one",
            )
        if world != saved:
            warnings.warn(
                f"twice: resuming a {saved}-process checkpoint in {world} processes: data order, "
                f"RNG streams "
                "and reduction order change, so the run cannot match the original bit for bit",
                RuntimeWarning,
                stacklevel=2,
            )
        part = part_name(rank) if part_name(rank) in index.parts else part_name(0)
        sharded = {name: targets[name] for name in index.sharded_entries if name in targets}
        missing = sorted(set(index.sharded_entries) - set(sharded))
        if strict and missing:
            raise CheckpointError(
                f"checkpoint {directory.name} has sharded state for "
                f"{', '.join(map(repr, missing))} that nothing restores",
                "pass those objects too (run.track(name=obj) before run.resume()), or load "
                "with strict=False",
            )
        if sharded:  # every rank together, through DCP (which reshards to this mesh)
            load_sharded(directory / DCP_FOLDER, sharded)
        rest = {name: target for name, target in targets.items() if name not in sharded}
        return {**load(directory / part, strict=strict, **rest), **sharded}
    kinds = index.entries
    missing = sorted(set(targets) - set(kinds))
    if missing:
        raise CheckpointError(
            f"checkpoint {directory.name} has no state for {', '.join(map(repr, missing))}",
            "save it in the checkpoint before resuming, or load with strict=False",
        )
    stateful = {name for name, kind in kinds.items() if kind.name != "value"}
    unexpected = sorted(stateful - set(targets))
    if strict and unexpected:
        raise CheckpointError(
            f"checkpoint {directory.name} has state for {', '.join(map(repr, unexpected))} that "
            f"nothing restores",
            "pass those objects too (under twice.Run: run.track(name=obj) before run.resume()), "
            "or load with strict=False (run.resume(strict=False))",
        )
    state = _read_state(directory, kinds)
    restored = {}
    for name, kind in kinds.items():
        if name in targets:
            kind.restore(targets[name], state[name], name)
            restored[name] = targets[name]
        else:
            restored[name] = state[name]
    return restored


def _read_state(directory: Path, kinds: dict) -> dict:
    """The decoded entries of a verified folder. Its files match their digests, but a crafted
    folder has digests to match: whatever they hold that twice would not write is a
    CheckpointError, never another exception."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        tensors = load_file(str(directory / TENSORS))
        raw = json.loads(read_record(directory / STATE))
        if not isinstance(raw, dict) or not isinstance(raw.get("entries"), dict):
            raise ValueError("state.json holds no entries")
        state = decode(raw["entries"], tensors)
        if set(state) != set(kinds):
            raise ValueError(
                f"state.json holds entries {sorted(state)}, the index lists {sorted(kinds)}"
            )
    except CheckpointError:
        raise
    except (
        SafetensorError,
        ValueError,
        TypeError,
        KeyError,
        IndexError,
        AttributeError,
        RecursionError,
        OverflowError,
        MemoryError,
        RuntimeError,
    ) as exc:  # noqa: B014 - each names a way a crafted file fails
        raise CheckpointError(
            f"checkpoint {directory.name} cannot be read: {type(exc).__name__}: {str(exc)[:200]}",
            "the checkpoint is damaged or was not written by twice: restore an earlier one, "
            "or re-create it",
        ) from None
    return state


def list_checkpoints(parent: str | Path) -> list[Path]:
    """`step-<n>` folders under `parent`, oldest step first (complete or not)."""
    parent = Path(parent)
    if not parent.is_dir():
        return []
    found = [
        (int(m.group(1)), p)
        for p in parent.iterdir()
        if p.is_dir() and (m := STEP_DIR.match(p.name))
    ]
    return [p for _, p in sorted(found)]


def latest(parent: str | Path) -> Path | None:
    """The newest checkpoint under `parent` that verifies; damaged or incomplete ones are skipped
    with a warning."""
    for candidate in reversed(list_checkpoints(parent)):
        try:
            verify(candidate)
            return candidate
        except CheckpointError as exc:
            warnings.warn(
                f"twice: skipping checkpoint {candidate.name}: {exc.message}",
                RuntimeWarning,
                stacklevel=2,
            )
    return None


def step_dir(parent: str | Path, step: int) -> Path:
    """The folder of the checkpoint of `step` under `parent` (`step-00000400`)."""
    return Path(parent) / f"step-{step:08d}"
