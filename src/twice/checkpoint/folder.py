"""One checkpoint folder on disk: its files, how they are written atomically, and how they are
verified.

    step-00000400/
      tensors.safetensors     every tensor of every entry (code-free format: never unpickled)
      state.json              the structure around them: numbers, strings, RNG states, positions
      checkpoint.json         written last: format, entries, and size + xxh3 digest of each file

A folder is written into a hidden temporary folder, fsynced, and renamed into place, so a crash
leaves either the previous checkpoint or the new one. A multi-process checkpoint holds one such
folder per rank (`rank-00000/`, ...) under an index of their indexes (checkpoint/ranks.py).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path

import xxhash

from twice.checkpoint.codec import encode, safetensors_dtypes
from twice.checkpoint.index import (
    DCP_FOLDER,
    FILES,
    FORMAT,
    INDEX,
    PART_DIR,
    RANKS_FORMAT,
    STATE,
    TENSORS,
    CheckpointIndex,
    RanksIndex,
    index_bytes,
    part_name,
    read_index,
)
from twice.checkpoint.kinds import kind_of
from twice.core.errors import CheckpointError, CorruptRecord
from twice.store.files import current_umask
from twice.store.files import fsync_dir as _fsync_dir
from twice.store.reader import open_record

__all__ = [
    "FORMAT",
    "RANKS_FORMAT",
    "INDEX",
    "TENSORS",
    "STATE",
    "RNG_ENTRY",
    "verify",
    "part_name",
]

RNG_ENTRY = "__rng__"


def _digest_file(path: Path) -> str:
    """The xxh3 digest of a checkpoint file, streamed through the bounded reader (a regular file,
    not a link, FIFO or device); one it refuses is a CheckpointError."""
    hasher = xxhash.xxh3_128()
    try:
        with open_record(path) as handle:
            while chunk := handle.read(1 << 24):
                hasher.update(chunk)
    except CorruptRecord as exc:
        raise CheckpointError(exc.message, _RESTORE_HINT) from None
    return hasher.hexdigest()


def _write_file(path: Path, data: bytes) -> None:
    with open(path, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def _save_tensors(path: Path, tensors: dict) -> str:
    """Write `tensors` in the safetensors format and return the file's xxh3 digest.

    Written here rather than by safetensors.torch.save_file, which first builds the whole file in
    memory: writing each tensor's memory directly, and hashing it while it is hot, saves a copy
    and a re-read of the file. The output is a standard safetensors file (tested by loading it
    with the safetensors library).
    """
    from twice.core.digests import tensor_bytes_view

    names = safetensors_dtypes()
    ready = []
    for (
        key,
        tensor,
    ) in tensors.items():  # every dtype has a name here: _encode stored the others as bytes
        tensor = tensor.detach()
        if tensor.device.type != "cpu":
            tensor = tensor.cpu()
        ready.append((key, tensor))
    # Larger elements first keeps every tensor aligned to its element size, as safetensors does.
    ready.sort(key=lambda item: (-item[1].element_size(), item[0]))
    header, offset = {}, 0
    for key, tensor in ready:
        nbytes = tensor.numel() * tensor.element_size()
        header[key] = {
            "dtype": names[tensor.dtype],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + nbytes],
        }
        offset += nbytes
    header_bytes = json.dumps(header, separators=(",", ":")).encode("utf-8")
    header_bytes += b" " * ((-len(header_bytes)) % 8)
    hasher = xxhash.xxh3_128()
    with open(path, "wb") as handle:
        for chunk in (len(header_bytes).to_bytes(8, "little"), header_bytes):
            handle.write(chunk)
            hasher.update(chunk)
        for _, tensor in ready:
            data = tensor_bytes_view(tensor)
            buffer = data.buffer if hasattr(data, "buffer") else data
            handle.write(buffer)
            hasher.update(buffer)
        handle.flush()
        os.fsync(handle.fileno())
    return hasher.hexdigest()


def _save_one(directory: Path, entries: dict) -> None:
    import torch

    tensors: dict[str, torch.Tensor] = {}
    kinds, encoded = {}, {}
    for name, obj in entries.items():
        kind = kind_of(obj)
        kinds[name] = kind.name
        encoded[name] = encode(kind.state_of(obj), tensors, name)
    # The writer's pid in the name lets a later save remove what a killed writer left behind.
    tmp = _private_folder(directory, ".tmp")
    try:
        digests = {TENSORS: _save_tensors(tmp / TENSORS, tensors)}
        state_bytes = json.dumps({"entries": encoded}, sort_keys=True).encode("utf-8")
        _write_file(tmp / STATE, state_bytes)
        digests[STATE] = xxhash.xxh3_128_hexdigest(state_bytes)
        index = {
            "format": FORMAT,
            "entries": kinds,
            "files": {
                name: {"size": (tmp / name).stat().st_size, "digest": digests[name]}
                for name in FILES
            },
        }
        _write_file(tmp / INDEX, index_bytes(index))
        _fsync_dir(tmp)
        _move_into_place(tmp, directory)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _private_folder(directory: Path, suffix: str) -> Path:
    """A hidden sibling of `directory` for work in progress, named with this process's pid (so a
    later save can tell a dead writer's leftovers from a live one's) and given the permissions a
    new folder gets (mkdtemp's are 0700)."""
    path = Path(
        tempfile.mkdtemp(
            prefix=f".{directory.name}.{os.getpid()}.", suffix=suffix, dir=directory.parent
        )
    )
    os.chmod(path, 0o777 & ~current_umask())
    return path


def _move_into_place(tmp: Path, directory: Path) -> None:
    if directory.exists():
        # Replace an old checkpoint of the same name: move it aside first, so that a crash
        # leaves one of the two complete and "latest" never sees a half-written folder.
        trash = _private_folder(directory, ".old")
        os.replace(directory, trash / "old")
        os.replace(tmp, directory)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        os.replace(tmp, directory)
    _fsync_dir(directory.parent)


def remove_checkpoint(directory: Path) -> bool:
    """Delete a checkpoint twice wrote, crash-safely: renamed to a hidden `.deleting` folder first
    (one atomic step), then removed, so a kill leaves the checkpoint whole or a leftover the next
    save sweeps. A folder holding anything twice does not write is left alone; returns whether
    it was removed."""
    if not is_twice_folder(directory):
        return False
    trash = _private_folder(directory, ".deleting")
    os.replace(directory, trash / directory.name)
    _fsync_dir(directory.parent)
    shutil.rmtree(trash, ignore_errors=True)
    return True


def is_twice_folder(directory: Path) -> bool:
    """Whether `directory` holds only what twice writes into a checkpoint (its index, its files,
    rank parts of the same), complete or not: what retention may delete."""
    try:
        children = list(directory.iterdir())
    except OSError:
        return False
    for child in children:
        if child.is_symlink():
            return False
        if child.name in (INDEX, *FILES) and child.is_file():
            continue
        if PART_DIR.match(child.name) and child.is_dir() and is_twice_folder(child):
            continue
        return False
    return True


_LEFTOVER = re.compile(r"^\.(?P<name>.+)\.(?P<pid>\d+)\.[^.]*\.(tmp|old|deleting)$")


def _sweep_stale_temporaries(parent: Path) -> None:
    """Remove what writers that died mid-save or mid-delete left (temporary folders, checkpoints
    moved aside or half deleted): only those whose pid is gone."""
    try:
        leftovers = [p for p in parent.iterdir() if _LEFTOVER.match(p.name)]
    except OSError:
        return
    for path in leftovers:
        pid = int(_LEFTOVER.match(path.name).group("pid"))
        try:
            os.kill(pid, 0)
            continue  # still writing
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
        except (PermissionError, OverflowError):
            continue


def verify(directory: str | Path) -> CheckpointIndex | RanksIndex:
    """Check that `directory` is a complete, undamaged twice checkpoint; return its index.

    The index is checked first (its own digest, then every field), then the folder holds exactly
    the files it lists, each of the size and digest it records."""
    directory = Path(directory)
    if directory.is_file():
        raise CheckpointError(
            f"{directory} is a file, not a twice checkpoint folder",
            "twice checkpoints are folders written by twice.checkpoint.save; it never loads "
            "pickles",
        )
    if not directory.is_dir():
        raise CheckpointError(
            f"no checkpoint at {directory}", "check the path; `twice checkpoint ls RUN` lists them"
        )
    index = read_index(directory)
    expected = set(index.parts if isinstance(index, RanksIndex) else index.files) | {INDEX}
    if isinstance(index, RanksIndex) and index.sharded_files is not None:
        expected.add(DCP_FOLDER)
    foreign = sorted(p.name for p in directory.iterdir() if p.name not in expected)
    if foreign:
        raise CheckpointError(
            f"{directory} holds files twice did not write: {', '.join(foreign)}",
            "twice never loads them (a pickle can run code); remove them or use a clean copy",
        )
    if isinstance(index, RanksIndex):
        for name, digest in sorted(index.parts.items()):
            part = directory / name
            if part.is_symlink() or not part.is_dir():
                raise CheckpointError(f"rank part {part} is missing", _RESTORE_HINT)
            verify(part)
            if _digest_file(part / INDEX) != digest:
                raise CheckpointError(
                    f"rank part {part} is not the one this checkpoint was completed with",
                    _RESTORE_HINT,
                )
        if index.sharded_files is not None:
            _check_files(directory / DCP_FOLDER, index.sharded_files, exact=True)
        return index
    _check_files(directory, index.files)
    return index


def _check_files(directory: Path, files: dict, exact: bool = False) -> None:
    """Each file of `files` in `directory` has its recorded size and digest (and, `exact`, the
    folder holds no other)."""
    if exact:
        if directory.is_symlink() or not directory.is_dir():
            raise CheckpointError(f"checkpoint folder {directory} is missing", _RESTORE_HINT)
        foreign = sorted(p.name for p in directory.iterdir() if p.name not in files)
        if foreign:
            raise CheckpointError(
                f"{directory} holds files twice did not record: {', '.join(foreign)}",
                "remove them or use a clean copy",
            )
    for name, meta in files.items():
        path = directory / name
        if path.is_symlink() or not path.is_file():
            raise CheckpointError(f"checkpoint file {path} is missing", _RESTORE_HINT)
        size = path.stat().st_size
        if size != meta.size:
            raise CheckpointError(
                f"checkpoint file {path} is truncated or extended: {size} bytes, expected "
                f"{meta.size}",
                _RESTORE_HINT,
            )
        if _digest_file(path) != meta.digest:
            raise CheckpointError(
                f"checkpoint file {path} is corrupt: its digest does not match", _RESTORE_HINT
            )


_RESTORE_HINT = (
    "restore an earlier checkpoint (twice.checkpoint.latest skips damaged ones), or re-create it"
)
