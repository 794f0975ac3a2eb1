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
import re
from pathlib import Path
from typing import Any

from twice.core.digests import dtensor_type
from twice.core.errors import CheckpointError, CorruptRecord
from twice.store import dcpmeta

__all__ = [
    "DCP_FOLDER",
    "DCP_FILE",
    "is_sharded",
    "save_sharded",
    "load_sharded",
    "read_metadata",
    "check_sharded",
]

DCP_FOLDER = "dcp"
# the file names DCP's FileSystemWriter gives: its metadata, and each rank's data files
DCP_FILE = re.compile(r"^(\.metadata|__\d{1,5}_\d{1,5}\.distcp)$")


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


def load_sharded(folder: Path, sharded: dict[str, Any]) -> None:
    """Every rank: load the sharded entries from `folder` through DCP into the objects, in place
    (a collective; DCP reshards where the mesh changed)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    owners = _owners(sharded)
    state = _state(sharded)
    dcp.load(state, checkpoint_id=str(folder))
    for name, obj in sharded.items():
        if name not in owners:
            set_model_state_dict(obj, state[name])
    for name, owner in owners.items():
        set_optimizer_state_dict(sharded[owner], sharded[name], state[name])


def read_metadata(path: Path) -> Any:
    """DCP's Metadata record in `path` (store/dcpmeta.py: decoded without running code); damage
    is a CheckpointError."""
    try:
        return dcpmeta.read(path.read_bytes(), str(path))
    except (OSError, CorruptRecord) as exc:
        raise CheckpointError(
            str(exc),
            "the checkpoint's sharded state is damaged or crafted: restore an earlier checkpoint",
        ) from None


def check_sharded(folder: Path, files: dict) -> None:
    """What `twice checkpoint verify` checks of the DCP folder beyond its digests: its metadata
    decodes (see read_metadata), and every piece of state it lists lies inside a file the index
    records. (The pieces themselves are tensors that DCP reads with `torch.load(weights_only=
    True)` on load.)"""
    where_metadata = folder / dcpmeta.METADATA
    metadata = read_metadata(where_metadata)
    storage = getattr(metadata, "storage_data", None) or {}
    if not metadata.state_dict_metadata:
        raise CheckpointError(f"{where_metadata} lists no state", "restore an earlier checkpoint")
    for where, info in storage.items():
        name = getattr(info, "relative_path", None)
        offset, length = getattr(info, "offset", None), getattr(info, "length", None)
        entry = files.get(name) if isinstance(name, str) else None
        if (
            entry is None
            or type(offset) is not int
            or type(length) is not int
            or offset < 0
            or length < 0
            or offset + length > entry.size
        ):
            raise CheckpointError(
                f"{where_metadata} places {getattr(where, 'fqn', where)} outside the files "
                "the checkpoint holds",
                "the sharded state is damaged or crafted: restore an earlier checkpoint",
            )
