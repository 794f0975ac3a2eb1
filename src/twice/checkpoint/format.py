"""Complete, verified, pickle-free checkpoints: tensors in safetensors, everything else in JSON.

A checkpoint is a folder:

    step-00000400/
      tensors.safetensors     every tensor of every entry (code-free format: never unpickled)
      state.json              the structure around them: numbers, strings, RNG states, positions
      checkpoint.json         written last: format, entries, and size + xxh3 digest of each file

It is written into a hidden temporary folder, fsynced, and renamed into place, so a crash leaves
either the previous checkpoint or the new one. Loading checks every file against its digest and
refuses anything it did not write. Floats are kept exact (JSON floats round-trip in Python; NaN
and infinities are stored as float.hex).
"""

from __future__ import annotations

import base64
import errno
import functools
import json
import os
import re
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from twice.core.errors import TwiceError
from twice.store.files import fsync_dir as _fsync_dir

__all__ = ["save", "load", "verify", "latest", "list_checkpoints", "CheckpointError", "RNG_ENTRY"]

FORMAT = "twice-checkpoint/1"
RANKS_FORMAT = "twice-checkpoint-ranks/1"
INDEX = "checkpoint.json"
TENSORS = "tensors.safetensors"
STATE = "state.json"
FILES = (TENSORS, STATE)
RNG_ENTRY = "__rng__"
_STEP_DIR = re.compile(r"^step-(\d+)$")


class CheckpointError(TwiceError):
    """A checkpoint that is incomplete, damaged, foreign, or does not match what is being restored."""


# -- encoding: nested Python values with tensors <-> JSON + a flat tensor table ---------------------


def _encode(value: Any, tensors: dict, path: str) -> Any:
    import torch

    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return value if -(2**53) <= value <= 2**53 else {"__int__": str(value)}
    if isinstance(value, float):
        return (
            value
            if value == value and abs(value) != float("inf")
            else {"__float__": float.hex(value)}
        )
    if isinstance(value, torch.Tensor):
        if value.layout != torch.strided:
            return _encode_sparse(value, tensors, path)
        if value.is_quantized:
            raise CheckpointError(
                f"cannot save {path}: a quantized tensor",
                "save its int_repr(), q_scale() and q_zero_point(), or the float model before quantization",
            )
        key = f"t{len(tensors)}"
        if value.dtype in _safetensors_dtypes():
            tensors[key] = value
            return {"__tensor__": key}
        # A dtype safetensors has no name for (complex128, complex32, newer float8 and float4
        # kinds): its bytes as a uint8 tensor, the dtype and shape beside them in the JSON.
        name = str(value.dtype).removeprefix("torch.")
        try:
            raw = value.detach().reshape(-1).contiguous().view(torch.uint8)
        except RuntimeError as exc:
            raise CheckpointError(
                f"cannot save {path}: its dtype {name} cannot be stored as bytes ({exc})",
                "convert it to a standard dtype first",
            ) from exc
        tensors[key] = raw
        return {"__bytes_tensor__": {"key": key, "dtype": name, "shape": list(value.shape)}}
    if isinstance(value, np.ndarray):
        if value.dtype.hasobject:
            raise CheckpointError(
                f"cannot save {path}: a NumPy array of Python objects", "store plain numeric arrays"
            )
        data = np.ascontiguousarray(value)
        return {
            "__ndarray__": {
                "dtype": data.dtype.str,
                "shape": list(data.shape),
                "data": base64.b64encode(data.tobytes()).decode("ascii"),
            }
        }
    if isinstance(value, np.generic):
        return _encode(value.item(), tensors, path)
    if isinstance(value, tuple):
        return {"__tuple__": [_encode(v, tensors, f"{path}[{i}]") for i, v in enumerate(value)]}
    if isinstance(value, list):
        return [_encode(v, tensors, f"{path}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict):
        if all(isinstance(k, str) for k in value) and not any(
            k.startswith("__") and k.endswith("__") for k in value
        ):
            return {k: _encode(v, tensors, f"{path}.{k}") for k, v in value.items()}
        return {
            "__items__": [
                [_encode(k, tensors, path), _encode(v, tensors, f"{path}[{k!r}]")]
                for k, v in value.items()
            ]
        }
    if isinstance(value, torch.dtype):
        return {"__dtype__": str(value).removeprefix("torch.")}
    raise CheckpointError(
        f"cannot save {path}: a {type(value).__module__}.{type(value).__qualname__} is neither "
        "a tensor, a number, a string nor a list/tuple/dict of those",
        "give it a state_dict()/load_state_dict() pair, or store it as plain data",
    )


def _encode_sparse(value: Any, tensors: dict, path: str) -> dict:
    """A sparse tensor (SGD's momentum buffer for sparse gradients) as its index and value tensors."""
    from twice.core.digests import sparse_parts

    parts = sparse_parts(value)
    if parts is None:
        raise CheckpointError(
            f"cannot save {path}: a {value.layout} tensor", "convert it with .to_dense() first"
        )
    layout = str(value.layout).removeprefix("torch.")
    names = ("indices", "values") if layout == "sparse_coo" else ("compressed", "plain", "values")
    body = {
        name: _encode(part.detach(), tensors, f"{path}.{name}") for name, part in zip(names, parts)
    }
    if layout == "sparse_coo":
        body["coalesced"] = value.is_coalesced()
    return {"__sparse__": {"layout": layout, "size": list(value.shape), **body}}


def _decode_sparse(body: dict, tensors: dict) -> Any:
    import torch

    parts = {
        name: _decode(part, tensors)
        for name, part in body.items()
        if name not in ("layout", "size")
    }
    if body["layout"] == "sparse_coo":
        return torch.sparse_coo_tensor(
            parts["indices"], parts["values"], body["size"], is_coalesced=parts["coalesced"]
        )
    return torch.sparse_compressed_tensor(
        parts["compressed"],
        parts["plain"],
        parts["values"],
        body["size"],
        layout=getattr(torch, body["layout"]),
    )


def _decode(value: Any, tensors: dict) -> Any:
    import torch

    if isinstance(value, list):
        return [_decode(v, tensors) for v in value]
    if not isinstance(value, dict):
        return value
    if len(value) == 1:
        ((tag, body),) = value.items()
        if tag == "__tensor__":
            return tensors[body]
        if tag == "__bytes_tensor__":
            dtype = getattr(torch, body["dtype"], None)
            if not isinstance(dtype, torch.dtype):
                raise CheckpointError(
                    f"a tensor in this checkpoint has dtype {body['dtype']}, unknown to torch {torch.__version__}",
                    "load it with the torch version that saved it",
                )
            return tensors[body["key"]].view(dtype).reshape(body["shape"])
        if tag == "__tuple__":
            return tuple(_decode(v, tensors) for v in body)
        if tag == "__items__":
            return {_decode(k, tensors): _decode(v, tensors) for k, v in body}
        if tag == "__int__":
            return int(body)
        if tag == "__float__":
            return float.fromhex(body)
        if tag == "__ndarray__":
            raw = base64.b64decode(body["data"])
            return np.frombuffer(raw, dtype=np.dtype(body["dtype"])).reshape(body["shape"]).copy()
        if tag == "__dtype__":
            return getattr(torch, body)
        if tag == "__sparse__":
            return _decode_sparse(body, tensors)
    return {k: _decode(v, tensors) for k, v in value.items()}


# -- what an entry is, and how to take and give back its state ------------------------------------


def _kind(obj: Any) -> str:
    import torch

    if isinstance(obj, torch.Generator):
        return "torch_generator"
    if isinstance(obj, np.random.Generator):
        return "numpy_generator"
    if _is_zero(obj):
        return "sharded_optimizer"
    if hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict"):
        return "stateful"
    return "value"


def _is_zero(obj: Any) -> bool:
    """torch.distributed.optim.ZeroRedundancyOptimizer: each rank holds the state of its shard only."""
    return (
        type(obj).__name__ == "ZeroRedundancyOptimizer"
        and type(obj).__module__.startswith("torch.distributed")
        and hasattr(obj, "optim")
    )


def _zero_world() -> int:
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _state_of(obj: Any, kind: str) -> Any:
    if kind == "torch_generator":
        return obj.get_state()
    if kind == "numpy_generator":
        return obj.bit_generator.state
    if kind == "stateful":
        return obj.state_dict()
    if kind == "sharded_optimizer":
        # Its state_dict() needs a consolidation onto one rank first (a collective gathering every
        # shard); each rank writes its own checkpoint part, so each keeps its own shard's state.
        return {"world_size": _zero_world(), "shard": obj.optim.state_dict()}
    return obj


def _restore(obj: Any, kind: str, state: Any, name: str) -> Any:
    if kind == "torch_generator":
        from twice.rng.seeding import own_storage

        obj.set_state(own_storage(state))
    elif kind == "numpy_generator":
        obj.bit_generator.state = state
    elif kind == "sharded_optimizer":
        if not _is_zero(obj):
            raise CheckpointError(
                f"entry {name!r} is a ZeroRedundancyOptimizer's shard; it is restored into a {type(obj).__name__}",
                "restore it into the ZeroRedundancyOptimizer it was saved from",
            )
        if state["world_size"] != _zero_world():
            raise CheckpointError(
                f"entry {name!r} holds a ZeroRedundancyOptimizer shard of {state['world_size']} processes; "
                f"this run has {_zero_world()}",
                "resume with the world size it was saved at: the shards "
                "partition the parameters by rank",
            )
        _load_state(obj.optim, state["shard"], name)
        # The hyperparameters (a scheduled learning rate) as saved, in the wrapper's groups too,
        # which step() copies into the shard's before each update.
        for outer, inner in zip(obj.param_groups, obj.optim.param_groups):
            outer.update({key: value for key, value in inner.items() if key != "params"})
    elif kind == "stateful":
        _load_state(obj, state, name)
    return obj


def _load_state(obj: Any, state: Any, name: str) -> None:
    """`obj.load_state_dict(state)`, its complaints as CheckpointErrors naming the entry."""
    try:
        result = obj.load_state_dict(state)
    except (RuntimeError, KeyError, ValueError, TypeError) as exc:
        raise CheckpointError(
            f"entry {name!r} does not fit the object it is restored into: {exc}",
            _fit_hint(obj, state),
        ) from exc
    missing = getattr(result, "missing_keys", None)
    if missing:
        raise CheckpointError(
            f"entry {name!r} lacks keys {missing}", "pass strict=False to load partially"
        )


# The key prefixes wrappers add to a module's state_dict, and the wrapper each means.
_WRAPPER_PREFIXES = {
    "_orig_mod.": "torch.compile",
    "module.": "DistributedDataParallel or DataParallel",
}


def _fit_hint(obj: Any, state: Any) -> str:
    """How to fix a state that does not fit: where its keys differ from the target's only by a
    wrapper's prefix (saved from a compiled or DDP-wrapped model, restored into the bare one, or
    the other way round), say so."""
    plain = "restore into the same kind of object, built with the same shapes"
    try:
        wanted = set(obj.state_dict())
    except Exception:  # noqa: BLE001 - only for a better hint
        return plain
    saved = {key for key in state if isinstance(key, str)} if isinstance(state, dict) else set()
    for prefix, wrapper in _WRAPPER_PREFIXES.items():
        if saved and saved == {prefix + key for key in wanted}:
            return (
                f"the checkpoint was saved from a {wrapper} wrapper (its keys start with {prefix!r}) and is "
                "restored into the bare module: track the wrapped model, as when it was saved"
            )
        if wanted and wanted == {prefix + key for key in saved}:
            return (
                f"the checkpoint was saved from a bare module and is restored into a {wrapper} wrapper "
                f"(its keys start with {prefix!r}): track the model as it was when saved"
            )
    return plain


# -- files ----------------------------------------------------------------------------------------


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


@functools.cache
def _safetensors_dtypes() -> dict:
    from safetensors.torch import _TYPES

    return {dtype: name for name, dtype in _TYPES.items()}


def _save_tensors(path: Path, tensors: dict) -> str:
    """Write `tensors` in the safetensors format and return the file's xxh3 digest.

    Written here rather than by safetensors.torch.save_file, which first builds the whole file in
    memory: writing each tensor's memory directly, and hashing it while it is hot, saves a copy
    and a re-read of the file. The output is a standard safetensors file (tested by loading it
    with the safetensors library).
    """
    from twice.core.digests import tensor_bytes_view

    names = _safetensors_dtypes()
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


def save(
    directory: str | Path, *, keep_last: int | None = None, collective: bool = False, **entries: Any
) -> Path:
    """Write `entries` (models, optimizers, schedulers, GradScalers, generators, plain values) to `directory`.

    The checkpoint appears complete or not at all. With `keep_last=N`, older `step-*` siblings
    beyond the newest N are removed afterwards.

    With `collective=True` under torch.distributed (world size > 1), every rank must call it: each
    writes its own part (`rank-00000/`, ... each a complete checkpoint of that rank's entries), and
    rank 0 writes the index that makes the whole complete only after every part is in.

    >>> twice.checkpoint.save("ckpt/step-00000100", model=model, optimizer=opt, extra={"epoch": 3})  # doctest: +SKIP
    """
    directory = Path(directory)
    try:
        directory.parent.mkdir(parents=True, exist_ok=True)
        group = _process_group() if collective else None
        if group is not None:
            _save_ranks(directory, group, entries)
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
    errno.EFBIG: "a file is larger than this process may write (ulimit -f) or the filesystem holds: raise the limit, or save elsewhere",  # noqa: E501
    errno.EROFS: "that filesystem is read-only: save elsewhere",
    errno.EEXIST: "a part of the path is a file, not a folder: choose another path",
    errno.ENOTDIR: "a part of the path is a file, not a folder: choose another path",
}


def _save_one(directory: Path, entries: dict) -> None:
    import torch

    tensors: dict[str, torch.Tensor] = {}
    kinds, encoded = {}, {}
    for name, obj in entries.items():
        kinds[name] = _kind(obj)
        encoded[name] = _encode(_state_of(obj, kinds[name]), tensors, name)
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


# -- checkpoints of multi-process runs: one part per rank, complete when rank 0 has indexed them all --


def _process_group():
    """torch.distributed when a process group of more than one process is up, else None."""
    import sys

    torch = sys.modules.get("torch")
    if torch is None:
        return None
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return dist
    return None


def _part(rank: int) -> str:
    return f"rank-{rank:05d}"


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
            "the previous checkpoint is intact; fix the cause (disk space, permissions) and save again",
        )
    return [v for _, v in results]


def _save_ranks(directory: Path, dist, entries: dict) -> None:
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
    mine = None
    try:
        _save_one(staging / _part(rank), entries)
        # Each part's own index already holds the digest of every file in it, taken as it was written.
        mine = _digest_file(staging / _part(rank) / INDEX)
    except (OSError, CheckpointError) as exc:
        failure = str(exc)
    indexes = _agree(dist, failure, "writing the rank's part", mine)
    if rank == 0:
        try:
            parts = {_part(r): digest for r, digest in enumerate(indexes)}
            index = {"format": RANKS_FORMAT, "world_size": world, "parts": parts}
            _write_file(
                staging / INDEX, json.dumps(index, sort_keys=True, indent=2).encode("utf-8")
            )
            _fsync_dir(staging)
            _move_into_place(staging, directory)
        except (OSError, CheckpointError) as exc:
            failure = str(exc)
    # No rank goes on (and perhaps resumes from `latest`) before the checkpoint is in place.
    _agree(dist, failure, "completing the checkpoint")


def _current_rank() -> tuple[int, int]:
    group = _process_group()
    if group is not None:
        return group.get_rank(), group.get_world_size()
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


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


def _retain(parent: Path, keep_last: int) -> None:
    if keep_last < 1:
        raise ValueError("keep_last must be at least 1")
    for old in list_checkpoints(parent)[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)


def verify(directory: str | Path) -> dict:
    """Check that `directory` is a complete, undamaged twice checkpoint; return its index."""
    directory = Path(directory)
    hint_restore = "restore an earlier checkpoint (twice.checkpoint.latest skips damaged ones), or re-create it"
    if directory.is_file():
        raise CheckpointError(
            f"{directory} is a file, not a twice checkpoint folder",
            "twice checkpoints are folders written by twice.checkpoint.save; it never loads pickles",
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
            f"{directory} has an unknown format {index.get('format') if isinstance(index, dict) else None!r}",
            f"this twice reads {FORMAT}",
        )
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
                f"checkpoint file {path} is truncated or extended: {size} bytes, expected {meta['size']}",
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


def load(
    directory: str | Path,
    *,
    strict: bool = True,
    rank: int | None = None,
    world_size_change: bool = False,
    **targets: Any,
) -> dict[str, Any]:
    """Verify `directory`, restore each entry into the object passed under its name, and return all entries.

    Entries without a target come back as plain values (tensors, numbers, dicts). In strict mode
    an entry in the checkpoint that is not asked for, or a target the checkpoint lacks, is an error
    naming it; `strict=False` restores what matches.

    A multi-rank checkpoint restores this process's rank's part (or `rank`'s). Resuming it at
    another world size is refused unless `world_size_change=True`; then rank r takes part r (rank 0's
    where there is none), with a warning that the result cannot be bitwise equal to the original.
    """
    from safetensors.torch import load_file

    directory = Path(directory)
    index = verify(directory)
    if index["format"] == RANKS_FORMAT:
        here, world = _current_rank()
        rank = here if rank is None else rank
        saved = index["world_size"]
        if world != saved and not world_size_change:
            raise CheckpointError(
                f"checkpoint {directory.name} was written by {saved} processes; this run has {world}",
                f"resume with the same world size ({saved}) for a bitwise continuation, or pass "
                "world_size_change=True (twice.Run(resume_world_size_change=True)) to accept a non-bitwise one",
            )
        if world != saved:
            warnings.warn(
                f"twice: resuming a {saved}-process checkpoint in {world} processes: data order, RNG streams "
                "and reduction order change, so the run cannot match the original bit for bit",
                RuntimeWarning,
                stacklevel=2,
            )
        part = _part(rank) if _part(rank) in index["parts"] else _part(0)
        return load(directory / part, strict=strict, **targets)
    kinds: dict[str, str] = index["entries"]
    missing = sorted(set(targets) - set(kinds))
    if missing:
        raise CheckpointError(
            f"checkpoint {directory.name} has no state for {', '.join(map(repr, missing))}",
            "save it in the checkpoint before resuming, or load with strict=False",
        )
    stateful = {name for name, kind in kinds.items() if kind != "value"}
    unexpected = sorted(stateful - set(targets))
    if strict and unexpected:
        raise CheckpointError(
            f"checkpoint {directory.name} has state for {', '.join(map(repr, unexpected))} that nothing restores",
            "pass those objects too (under twice.Run: run.track(name=obj) before run.resume()), "
            "or load with strict=False (run.resume(strict=False))",
        )
    tensors = load_file(str(directory / TENSORS))
    state = _decode(json.loads((directory / STATE).read_text(encoding="utf-8"))["entries"], tensors)
    restored = {}
    for name, kind in kinds.items():
        if name in targets:
            restored[name] = _restore(targets[name], kind, state[name], name)
        else:
            restored[name] = state[name]
    return restored


def list_checkpoints(parent: str | Path) -> list[Path]:
    """`step-<n>` folders under `parent`, oldest step first (complete or not)."""
    parent = Path(parent)
    if not parent.is_dir():
        return []
    found = [
        (int(m.group(1)), p)
        for p in parent.iterdir()
        if p.is_dir() and (m := _STEP_DIR.match(p.name))
    ]
    return [p for _, p in sorted(found)]


def latest(parent: str | Path) -> Path | None:
    """The newest checkpoint under `parent` that verifies; damaged or incomplete ones are skipped with a warning."""
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
    return Path(parent) / f"step-{step:08d}"


def encode_state(value: Any) -> dict:
    """`value` (RNG states, nested numbers, arrays, tensors) as plain dicts, lists, numbers and tensors.

    For state that travels inside another framework's checkpoint (Lightning, the Hugging Face
    Trainer): it survives torch.load(weights_only=True), which refuses NumPy arrays and tuples of
    arbitrary objects."""
    tensors: dict = {}
    return {"state": _encode(value, tensors, "state"), "tensors": tensors}


def decode_state(encoded: dict) -> Any:
    """The value `encode_state` was given."""
    return _decode(encoded["state"], encoded["tensors"])
