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
from twice.checkpoint.kinds import kind_named, kind_of
from twice.core.errors import CheckpointError
from twice.store.files import fsync_dir as _fsync_dir

__all__ = ["FORMAT", "RANKS_FORMAT", "INDEX", "TENSORS", "STATE", "RNG_ENTRY", "verify"]

FORMAT = "twice-checkpoint/1"
RANKS_FORMAT = "twice-checkpoint-ranks/1"
INDEX = "checkpoint.json"
TENSORS = "tensors.safetensors"
STATE = "state.json"
FILES = (TENSORS, STATE)
RNG_ENTRY = "__rng__"
STEP_DIR = re.compile(r"^step-(\d+)$")


def part_name(rank: int) -> str:
    """The folder of one rank's part in a multi-process checkpoint."""
    return f"rank-{rank:05d}"


def _digest_file(path: Path) -> str:
    hasher = xxhash.xxh3_128()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 24):
            hasher.update(chunk)
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
    tmp = Path(
        tempfile.mkdtemp(
            prefix=f".{directory.name}.{os.getpid()}.", suffix=".tmp", dir=directory.parent
        )
    )
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
        _write_file(tmp / INDEX, json.dumps(index, sort_keys=True, indent=2).encode("utf-8"))
        _fsync_dir(tmp)
        _move_into_place(tmp, directory)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _move_into_place(tmp: Path, directory: Path) -> None:
    if directory.exists():
        # Replace an old checkpoint of the same name: move it aside first, so that a crash
        # leaves one of the two complete and "latest" never sees a half-written folder.
        trash = Path(
            tempfile.mkdtemp(prefix=f".{directory.name}.", suffix=".old", dir=directory.parent)
        )
        os.replace(directory, trash / "old")
        os.replace(tmp, directory)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        os.replace(tmp, directory)
    _fsync_dir(directory.parent)


def _sweep_stale_temporaries(parent: Path) -> None:
    """Remove temporary folders of writers that died mid-save (their pid is gone)."""
    for path in parent.glob(".*.tmp"):
        parts = path.name.split(".")
        if len(parts) >= 4 and parts[-3].isdigit():
            pid = int(parts[-3])
            try:
                os.kill(pid, 0)
                continue  # still writing
            except ProcessLookupError:
                shutil.rmtree(path, ignore_errors=True)
            except PermissionError:
                continue


def verify(directory: str | Path) -> dict:
    """Check that `directory` is a complete, undamaged twice checkpoint; return its index."""
    directory = Path(directory)
    hint_restore = (
        "restore an earlier checkpoint (twice.checkpoint.latest skips damaged ones), "
        "or re-create it"
    )
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
    index_path = directory / INDEX
    if not index_path.is_file():
        raise CheckpointError(
            f"{directory} is incomplete or not a twice checkpoint: it has no {INDEX}", hint_restore
        )
    try:
        index = json.loads(index_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{index_path} is damaged: {exc}", hint_restore) from exc
    if isinstance(index, dict) and index.get("format") == RANKS_FORMAT:
        return _verify_ranks(directory, index, hint_restore)
    if not isinstance(index, dict) or index.get("format") != FORMAT:
        raise CheckpointError(
            f"{directory} has an unknown format "
            f"{index.get('format') if isinstance(index, dict) else None!r}",
            f"this twice reads {FORMAT}",
        )
    entries = index.get("entries")
    if not isinstance(entries, dict):
        raise CheckpointError(f"{index_path} lists no entries", hint_restore)
    for entry, kind in entries.items():
        kind_named(kind, entry, directory.name)
    expected = set(index.get("files", {})) | {INDEX}
    foreign = sorted(p.name for p in directory.iterdir() if p.name not in expected)
    if foreign:
        raise CheckpointError(
            f"{directory} holds files twice did not write: {', '.join(foreign)}",
            "twice never loads them (a pickle can run code); remove them or use a clean copy",
        )
    for name, meta in index["files"].items():
        path = directory / name
        if not path.is_file():
            raise CheckpointError(f"checkpoint file {path} is missing", hint_restore)
        size = path.stat().st_size
        if size != meta["size"]:
            raise CheckpointError(
                f"checkpoint file {path} is truncated or extended: {size} bytes, expected "
                f"{meta['size']}",
                hint_restore,
            )
        if _digest_file(path) != meta["digest"]:
            raise CheckpointError(
                f"checkpoint file {path} is corrupt: its digest does not match", hint_restore
            )
    return index


def _verify_ranks(directory: Path, index: dict, hint_restore: str) -> dict:
    parts = index.get("parts", {})
    if len(parts) != index.get("world_size"):
        raise CheckpointError(
            f"{directory} indexes {len(parts)} rank parts for world size {index.get('world_size')}",
            hint_restore,
        )
    foreign = sorted(p.name for p in directory.iterdir() if p.name not in set(parts) | {INDEX})
    if foreign:
        raise CheckpointError(
            f"{directory} holds files twice did not write: {', '.join(foreign)}",
            "twice never loads them (a pickle can run code); remove them or use a clean copy",
        )
    for name, digest in sorted(parts.items()):
        verify(directory / name)
        if _digest_file(directory / name / INDEX) != digest:
            raise CheckpointError(
                f"rank part {directory / name} is not the one this checkpoint was completed with",
                hint_restore,
            )
    return index
