"""Sharded state (FSDP2, tensor parallel: DTensor parameters) saved through PyTorch's Distributed
Checkpoint (DCP), not a format of twice's own.

A tracked model with DTensor parameters, and a tracked optimizer over them, cannot go into one
rank's part: each rank holds shards. They are saved together by `torch.distributed.checkpoint`
into the checkpoint's `dcp/` folder (every rank writes its `__R_0.distcp`, rank 0 the
`.metadata`), through DCP's state-dict API (`get_state_dict`: keys by parameter name, the
optimizer's state laid out like its parameters), and loaded back in place, then set into the
objects. Everything else (RNGs, the data position, counters, plain objects) stays in the rank
parts; the index holds the size and digest of every file DCP wrote.

DCP's `.metadata` is a pickle: store/dcpmeta.py reads it without running code.
"""

from __future__ import annotations

import contextlib
import io
import math
from pathlib import Path
from typing import Any

from twice.checkpoint.index import DCP_METADATA
from twice.core.digests import dtensor_type
from twice.core.errors import CheckpointError, CorruptRecord
from twice.store import dcpmeta
from twice.store.reader import open_record, read_record

__all__ = [
    "is_sharded",
    "save_sharded",
    "load_sharded",
    "read_metadata",
    "check_sharded",
]


def _params(obj: Any) -> list:
    if hasattr(obj, "param_groups"):
        return [p for group in obj.param_groups for p in group["params"]]
    if hasattr(obj, "parameters") and hasattr(obj, "named_modules"):
        return list(obj.parameters())
    return []


def is_sharded(obj: Any) -> bool:
    """A model or optimizer whose parameters include a DTensor (saved through DCP)."""
    dtensor = dtensor_type()
    return dtensor is not None and any(isinstance(p, dtensor) for p in _params(obj))


def _owners(sharded: dict[str, Any]) -> dict[str, str]:
    """For each sharded optimizer, the name of the tracked model that holds its parameters."""
    models = {n: o for n, o in sharded.items() if not hasattr(o, "param_groups")}
    owners = {}
    for name, obj in sharded.items():
        if name in models:
            continue
        wanted = {id(p) for p in _params(obj)}
        owner = next(
            (m for m, model in models.items() if wanted <= set(map(id, _params(model)))), None
        )
        if owner is None:
            raise CheckpointError(
                f"entry {name!r} is an optimizer over sharded (DTensor) parameters, and no tracked "
                "model holds them",
                "track the FSDP2 / tensor-parallel model too: run.track(model=model, "
                "optimizer=optimizer)",
            )
        owners[name] = owner
    return owners


@contextlib.contextmanager
def _without_step_hooks():
    """DCP's state-dict API gives a fresh optimizer its state by one step with zero gradients
    and a zero learning rate (parameters unchanged). It is not a training step: torch's global
    step hooks (the step trace's among them) do not see it."""
    from torch.optim import optimizer

    saved = (
        dict(optimizer._global_optimizer_pre_hooks),
        dict(optimizer._global_optimizer_post_hooks),
    )
    optimizer._global_optimizer_pre_hooks.clear()
    optimizer._global_optimizer_post_hooks.clear()
    try:
        yield
    finally:
        optimizer._global_optimizer_pre_hooks.update(saved[0])
        optimizer._global_optimizer_post_hooks.update(saved[1])


def _state(sharded: dict[str, Any]) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    owners = _owners(sharded)
    state = {}
    with _without_step_hooks():
        for name, obj in sharded.items():
            if name in owners:
                state[name] = get_optimizer_state_dict(sharded[owners[name]], obj)
            else:
                state[name] = get_model_state_dict(obj)
    return state


def save_sharded(folder: Path, sharded: dict[str, Any]) -> None:
    """Every rank: save the sharded entries into `folder` through DCP (a collective)."""
    import torch.distributed.checkpoint as dcp

    dcp.save(_state(sharded), checkpoint_id=str(folder))


def load_sharded(folder: Path, sharded: dict[str, Any], metadata: Any) -> None:
    """Every rank: load the sharded entries from `folder` through DCP into the objects, in place
    (a collective; DCP reshards where the mesh changed). `metadata` is the folder's record as
    check_sharded decoded it: DCP is handed that object and never unpickles a file itself. What
    does not load (state that does not fit the objects) is a CheckpointError."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import (
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    try:
        owners = _owners(sharded)
        state = _state(sharded)
        dcp.load(state, storage_reader=_reader(folder, metadata), planner=_planner(folder))
        for name, obj in sharded.items():
            if name not in owners:
                set_model_state_dict(obj, state[name])
        for name, owner in owners.items():
            set_optimizer_state_dict(sharded[owner], sharded[name], state[name])
    except CheckpointError:
        raise
    except (
        CheckpointException,  # DCP's, a BaseException: every rank's failures gathered
        RuntimeError,
        ValueError,
        TypeError,
        KeyError,
        IndexError,
        AttributeError,
        AssertionError,
        OSError,
    ) as exc:  # noqa: B014 - each names a way DCP reports state that does not load
        raise CheckpointError(
            f"the sharded state in {folder} does not load into "
            f"{', '.join(map(repr, sharded))}: {type(exc).__name__}: {str(exc)[:300]}",
            "restore into the model and optimizer it was saved from (DCP reshards them to this "
            "mesh), or restore an earlier checkpoint",
        ) from exc


def _reader(folder: Path, metadata: Any):
    """DCP's FileSystemReader of `folder`, but for its metadata: the record twice decoded, not
    DCP's own `pickle.load` of `.metadata` (which runs whatever the file names)."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class _DecodedMetadataReader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            # As FileSystemReader.read_metadata does after unpickling: this load's id stamped
            if not isinstance(getattr(metadata, "storage_meta", None), StorageMeta):
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return _DecodedMetadataReader(folder)


def _planner(folder: Path):
    """DCP's default load planner, but for the values that are not tensors (an optimizer's
    hyperparameters): DefaultLoadPlanner.load_bytes decodes them with `torch.load(weights_only=
    False)`, which runs code; here they go through decode_piece, as verify decodes them. (DCP
    reads the tensors itself with `weights_only=True`.)"""
    from torch.distributed.checkpoint import DefaultLoadPlanner
    from torch.distributed.checkpoint._traverse import set_element

    class _WeightsOnlyPlanner(DefaultLoadPlanner):
        def load_bytes(self, read_item: Any, value: Any) -> None:
            fqn = read_item.dest_index.fqn
            decoded = decode_piece(value.getvalue(), f"{folder}: {fqn}")
            if self.flatten_state_dict:
                set_element(self.original_state_dict, self.mappings[fqn], decoded)
            else:
                self.state_dict[fqn] = decoded

    return _WeightsOnlyPlanner()


def decode_piece(data: bytes, where: str, expected: tuple | None = None) -> Any:
    """One piece of DCP's data (a `torch.save` of a tensor chunk or a plain value) decoded by
    torch's weights-only unpickler, which builds tensors and plain values and calls nothing a
    file names. With `expected` (dtype, sizes), it must be a tensor of them. Anything else is a
    CheckpointError."""
    import torch

    try:
        value = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any decoding failure means a damaged piece
        raise CheckpointError(
            f"{where} cannot be read: {type(exc).__name__}: {str(exc)[:200]}", _CRAFTED_HINT
        ) from None
    if expected is not None and not (
        isinstance(value, torch.Tensor)
        and value.dtype == expected[0]
        and tuple(value.shape) == tuple(expected[1])
    ):
        raise CheckpointError(
            f"{where} is not the {expected[0]} tensor of size {list(expected[1])} its "
            "metadata describes",
            _CRAFTED_HINT,
        )
    return value


_CRAFTED_HINT = "the checkpoint's sharded state is damaged or crafted: restore an earlier one"


def read_metadata(path: Path) -> Any:
    """DCP's Metadata record in `path` (store/dcpmeta.py: decoded without running code), read as
    a bounded regular file; damage is a CheckpointError."""
    try:
        return dcpmeta.read(read_record(path), str(path))
    except (OSError, CorruptRecord) as exc:
        raise CheckpointError(str(exc), _CRAFTED_HINT) from None


def check_sharded(folder: Path, files: dict) -> Any:
    """What `twice checkpoint verify` checks of the DCP folder beyond its digests, and what load
    checks before DCP reads a byte: the metadata decodes (read_metadata); every piece of state
    it describes lies inside a data file the index records, untransformed; and every piece
    decodes (decode_piece), each tensor of the dtype and size its metadata gives. Returns the
    metadata, the object load hands to DCP."""
    where = folder / DCP_METADATA
    metadata = read_metadata(where)
    try:
        expected = _expected_pieces(metadata, where)
        storage = metadata.storage_data
        if not isinstance(storage, dict) or set(storage) != set(expected):
            raise CheckpointError(
                f"{where} does not place exactly the state it lists", _CRAFTED_HINT
            )
        by_file: dict[str, list] = {}
        for key, info in storage.items():
            by_file.setdefault(_place(info, key, files, where), []).append((key, info))
    except (AttributeError, TypeError, ValueError) as exc:  # fields of the wrong types
        raise CheckpointError(f"{where} is not DCP metadata: {exc}", _CRAFTED_HINT) from None
    for name, pieces in sorted(by_file.items()):
        _decode_pieces(folder / name, pieces, expected)
    return metadata


def _expected_pieces(metadata: Any, where: Path) -> dict:
    """{storage key: (dtype, sizes) of a tensor chunk, or None for a plain value} for every
    piece the metadata's state lists."""
    from torch.distributed.checkpoint.metadata import (
        BytesStorageMetadata,
        MetadataIndex,
        TensorStorageMetadata,
    )

    state = metadata.state_dict_metadata
    if not isinstance(state, dict) or not state:
        raise CheckpointError(f"{where} lists no state", _CRAFTED_HINT)
    expected: dict = {}
    for fqn, md in state.items():
        if isinstance(md, BytesStorageMetadata) and isinstance(fqn, str):
            expected[MetadataIndex(fqn)] = None
            continue
        if not isinstance(md, TensorStorageMetadata) or not isinstance(fqn, str):
            raise CheckpointError(f"{where} describes {fqn!r} as no kind of state", _CRAFTED_HINT)
        size = tuple(md.size)
        for chunk in md.chunks:
            offsets, sizes = tuple(chunk.offsets), tuple(chunk.sizes)
            if (
                len(offsets) != len(size)
                or len(sizes) != len(size)
                or any(
                    type(o) is not int or type(n) is not int or o < 0 or n < 0 or o + n > whole
                    for o, n, whole in zip(offsets, sizes, size)
                )
            ):
                raise CheckpointError(
                    f"{where} places a piece of {fqn!r} outside its size {list(size)}",
                    _CRAFTED_HINT,
                )
            expected[MetadataIndex(fqn, offsets)] = (md.properties.dtype, sizes)
        # pieces inside the tensor, at distinct offsets, as many elements as it has: no part of
        # it left at the fresh object's values
        if len({tuple(chunk.offsets) for chunk in md.chunks}) != len(md.chunks) or sum(
            math.prod(chunk.sizes) for chunk in md.chunks
        ) != math.prod(size):
            raise CheckpointError(f"{where} does not hold all of {fqn!r}", _CRAFTED_HINT)
    return expected


def _place(info: Any, key: Any, files: dict, where: Path) -> str:
    """The data file a piece lies in, checked: one the index records, the range inside it, no
    transform (twice saves none, and DCP would apply what a name asks for)."""
    name = getattr(info, "relative_path", None)
    offset, length = getattr(info, "offset", None), getattr(info, "length", None)
    entry = files.get(name) if isinstance(name, str) and name != DCP_METADATA else None
    if (
        entry is None
        or type(offset) is not int
        or type(length) is not int
        or offset < 0
        or length < 0
        or offset + length > entry.size
        or getattr(info, "transform_descriptors", None)
    ):
        raise CheckpointError(
            f"{where} places {getattr(key, 'fqn', key)} outside the files the checkpoint holds",
            _CRAFTED_HINT,
        )
    return name


def _decode_pieces(path: Path, pieces: list, expected: dict) -> None:
    """Decode every piece placed in the data file `path`, read through the bounded reader."""
    try:
        with open_record(path) as handle:
            for key, info in sorted(pieces, key=lambda piece: piece[1].offset):
                handle.seek(info.offset)
                data = handle.read(info.length)
                if len(data) != info.length:
                    raise CheckpointError(
                        f"{path} is shorter than its metadata says", _CRAFTED_HINT
                    )
                decode_piece(data, f"{path}: {key.fqn}", expected[key])
    except (OSError, CorruptRecord) as exc:
        raise CheckpointError(f"cannot read {path}: {exc}", _CRAFTED_HINT) from None
