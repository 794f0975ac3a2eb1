"""Saving and loading checkpoints, finding the latest good one, keeping the last N.

A checkpoint is a folder (checkpoint/folder.py): tensors in safetensors, everything else in JSON,
each file digested. Loading checks every file against its digest and refuses anything twice did
not write. Floats are kept exact (JSON floats round-trip in Python; NaN and infinities are stored
as float.hex).
"""

from __future__ import annotations

import errno
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from twice.checkpoint.codec import decode
from twice.checkpoint.folder import (
    STATE,
    TENSORS,
    _save_one,
    _sweep_stale_temporaries,
    part_name,
    remove_checkpoint,
    verify,
)
from twice.checkpoint.index import (
    DCP_FOLDER,
    STEP_DIR,
    CheckpointIndex,
    RanksIndex,
    read_index,
    step_name,
)
from twice.checkpoint.ranks import current_rank, process_group, save_ranks
from twice.checkpoint.sharded import check_sharded, load_sharded
from twice.core.errors import CheckpointError, CorruptRecord
from twice.core.escaping import escape_controls
from twice.store import reader

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
    """What `twice checkpoint verify` calls "valid", and exactly what load() checks first: the
    folder's files match their digests (checkpoint.folder.verify) and everything in it decodes as
    load() decodes it, sparse tensors through PyTorch's invariant checks, in every rank's part,
    and DCP's metadata and every piece of sharded state through twice's own decoders. A crafted
    folder recomputes its digests; it cannot make a malformed entry decode, nor a pickle run."""
    return _open(Path(directory)).index


@dataclass(frozen=True)
class _Opened:
    """A checkpoint folder verified and decoded (see _open)."""

    index: CheckpointIndex | RanksIndex
    where: str  # the folder whose entries these are: the checkpoint's, or its kept rank part's
    kinds: dict
    state: dict
    metadata: Any = None  # DCP's record of the sharded state, decoded by store/dcpmeta.py


def _open(directory: Path, keep: int = 0) -> _Opened:
    """The one check behind both `twice checkpoint verify` and load(), so that "valid" and
    "loads" imply each other: every file against its digest, every entry of every rank part
    decoded (part `keep`'s, or rank 0's where there is none, kept), DCP's metadata and pieces
    decoded by check_sharded. Every rank checks the whole folder, so all of them refuse it
    together, before any collective. Anything wrong with the folder is a CheckpointError."""
    try:
        index = verify(directory)
        if isinstance(index, CheckpointIndex):
            return _Opened(
                index, directory.name, index.entries, _read_state(directory, index.entries)
            )
        kept = part_name(keep) if part_name(keep) in index.parts else part_name(0)
        opened = None
        for name in sorted(index.parts):
            part = read_index(directory / name)
            if not isinstance(part, CheckpointIndex):
                raise CheckpointError(
                    f"rank part {directory / name} is not a one-process checkpoint",
                    "the checkpoint is damaged or crafted: restore an earlier one",
                )
            state = _read_state(directory / name, part.entries)  # decoded, kept or dropped
            if name == kept:
                opened = _Opened(index, name, part.entries, state)
        metadata = None
        if index.sharded_files is not None:
            metadata = check_sharded(directory / DCP_FOLDER, index.sharded_files)
        return replace(opened, metadata=metadata)
    except (OSError, CorruptRecord) as exc:  # a file that cannot be read as a record
        raise CheckpointError(
            f"checkpoint {directory} cannot be read: {getattr(exc, 'message', None) or exc}",
            "the checkpoint is damaged or was not written by twice: restore an earlier one",
        ) from None


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

    The folder is checked exactly as `twice checkpoint verify` checks it (verify_loadable) before
    anything is restored, and no pickle from it is ever run (DCP's metadata is decoded by twice,
    its pieces by torch's weights-only unpickler). Whatever is wrong with the folder, or does
    not fit the objects, is a CheckpointError.

    A multi-rank checkpoint restores this process's rank's part (or `rank`'s). Resuming it at
    another world size is refused unless `world_size_change=True`; then rank r takes part r (rank
    0's where there is none), with a warning that the result cannot be bitwise equal to the
    original.
    """
    directory = Path(directory)
    here, world = current_rank()
    opened = _open(directory, keep=here if rank is None else rank)
    index = opened.index
    sharded: dict[str, Any] = {}
    if isinstance(index, RanksIndex):
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
                escape_controls(
                    f"twice: resuming a {saved}-process checkpoint in {world} processes: data "
                    "order, RNG streams and reduction order change, so the run cannot match the "
                    "original bit for bit"
                ),
                RuntimeWarning,
                stacklevel=2,
            )
        sharded = {name: targets[name] for name in index.sharded_entries if name in targets}
        missing = sorted(set(index.sharded_entries) - set(sharded))
        if strict and missing:
            raise CheckpointError(
                f"checkpoint {directory.name} has sharded state for "
                f"{', '.join(map(repr, missing))} that nothing restores",
                "pass those objects too (run.track(name=obj) before run.resume()), or load "
                "with strict=False",
            )
    rest = {name: target for name, target in targets.items() if name not in sharded}
    _check_targets(opened.where, opened.kinds, rest, strict)
    if sharded:  # every rank together, through DCP (which reshards to this mesh)
        load_sharded(directory / DCP_FOLDER, sharded, opened.metadata)
    return {**_restore(opened, rest), **sharded}


def _check_targets(where: str, kinds: dict, targets: dict, strict: bool) -> None:
    missing = sorted(set(targets) - set(kinds))
    if missing:
        raise CheckpointError(
            f"checkpoint {where} has no state for {', '.join(map(repr, missing))}",
            "save it in the checkpoint before resuming, or load with strict=False",
        )
    stateful = {name for name, kind in kinds.items() if kind.name != "value"}
    unexpected = sorted(stateful - set(targets))
    if strict and unexpected:
        raise CheckpointError(
            f"checkpoint {where} has state for {', '.join(map(repr, unexpected))} that "
            f"nothing restores",
            "pass those objects too (under twice.Run: run.track(name=obj) before run.resume()), "
            "or load with strict=False (run.resume(strict=False))",
        )


def _restore(opened: _Opened, targets: dict) -> dict:
    """Each decoded entry restored into its target, or returned as a plain value."""
    restored = {}
    for name, kind in opened.kinds.items():
        if name not in targets:
            restored[name] = opened.state[name]
            continue
        try:
            kind.restore(targets[name], opened.state[name], name)
        except CheckpointError:
            raise
        except (RuntimeError, TypeError, ValueError, KeyError, IndexError, AttributeError) as exc:
            raise CheckpointError(
                f"entry {name!r} of checkpoint {opened.where} does not restore into the "
                f"{type(targets[name]).__name__} given for it: {type(exc).__name__}: "
                f"{str(exc)[:200]}",
                "restore into the kind of object it was saved from",
            ) from exc
        restored[name] = targets[name]
    return restored


def _read_state(directory: Path, kinds: dict) -> dict:
    """The decoded entries of a verified folder. Its files match their digests, but a crafted
    folder has digests to match: whatever they hold that twice would not write is a
    CheckpointError, never another exception."""
    from safetensors import SafetensorError

    try:
        tensors = reader.read_tensors(directory / TENSORS)
        raw = reader.read_json(directory / STATE)
        if not isinstance(raw, dict) or not isinstance(raw.get("entries"), dict):
            raise ValueError("state.json holds no entries")
        state = decode(raw["entries"], tensors)
        if set(state) != set(kinds):
            raise ValueError(
                f"state.json holds entries {sorted(state)}, the index lists {sorted(kinds)}"
            )
    except CheckpointError:
        raise
    except (CorruptRecord, OSError) as exc:
        raise CheckpointError(
            f"checkpoint {directory.name} cannot be read: {getattr(exc, 'message', exc)}",
            "the checkpoint is damaged: restore an earlier one, or re-create it",
        ) from None
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
    """`step-<n>` folders under `parent`, oldest step first (complete or not). A link named like
    one is none: twice writes a checkpoint as a folder, renamed into place, never as a link (one
    would lead out of the run folder, to whatever it names)."""
    parent = Path(parent)
    if not parent.is_dir():
        return []
    found = [
        (int(m.group(1)), p)
        for p in parent.iterdir()
        if p.is_dir() and not p.is_symlink() and (m := STEP_DIR.match(p.name))
    ]
    return [p for _, p in sorted(found)]


def latest(parent: str | Path) -> Path | None:
    """The newest checkpoint under `parent` that is valid (verify_loadable: it loads); damaged,
    incomplete or crafted ones are skipped with a warning."""
    for candidate in reversed(list_checkpoints(parent)):
        try:
            verify_loadable(candidate)
            return candidate
        except CheckpointError as exc:
            warnings.warn(
                escape_controls(f"twice: skipping checkpoint {candidate.name}: {exc.message}"),
                RuntimeWarning,
                stacklevel=2,
            )
    return None


def step_dir(parent: str | Path, step: int) -> Path:
    """The folder of the checkpoint of `step` under `parent` (`step-00000400`)."""
    return Path(parent) / step_name(step)
