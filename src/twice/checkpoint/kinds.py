"""What a checkpoint entry is, and how its state is taken and given back: one table of kinds.

Each entry of a checkpoint is recorded with its kind's name; loading looks the name up in the
same table, so a name this version does not know (a damaged or crafted index) is an error, never
an entry silently left at its fresh state.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from twice.core.errors import CheckpointError

__all__ = ["EntryKind", "KINDS", "kind_of", "kind_named"]


@dataclass(frozen=True)
class EntryKind:
    """One kind of checkpoint entry: how to recognise it, take its state, and restore that state."""

    name: str
    matches: Callable[[Any], bool]
    state_of: Callable[[Any], Any]
    restore: Callable[[Any, Any, str], None]  # (target, state, entry name)


def _is_torch_generator(obj: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Generator)


def _is_numpy_generator(obj: Any) -> bool:
    np = sys.modules.get("numpy")
    return np is not None and isinstance(obj, np.random.Generator)


def _is_zero(obj: Any) -> bool:
    """torch.distributed.optim.ZeroRedundancyOptimizer: each rank holds the state of its shard
    only."""
    return (
        type(obj).__name__ == "ZeroRedundancyOptimizer"
        and type(obj).__module__.startswith("torch.distributed")
        and hasattr(obj, "optim")
    )


def _is_stateful(obj: Any) -> bool:
    return hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict")


def _zero_world() -> int:
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _restore_torch_generator(generator: Any, state: Any, name: str) -> None:
    from twice.rng.seeding import own_storage

    generator.set_state(own_storage(state))


def _restore_numpy_generator(generator: Any, state: Any, name: str) -> None:
    generator.bit_generator.state = state


def _zero_state(optimizer: Any) -> dict:
    # Its state_dict() needs a consolidation onto one rank first (a collective gathering every
    # shard); each rank writes its own checkpoint part, so each keeps its own shard's state.
    return {"world_size": _zero_world(), "shard": optimizer.optim.state_dict()}


def _restore_zero(obj: Any, state: Any, name: str) -> None:
    if not _is_zero(obj):
        raise CheckpointError(
            f"entry {name!r} is a ZeroRedundancyOptimizer's shard; it is restored into a "
            f"{type(obj).__name__}",
            "restore it into the ZeroRedundancyOptimizer it was saved from",
        )
    if state["world_size"] != _zero_world():
        raise CheckpointError(
            f"entry {name!r} holds a ZeroRedundancyOptimizer shard of {state['world_size']} "
            f"processes; "
            f"this run has {_zero_world()}",
            "resume with the world size it was saved at: the shards partition the parameters by "
            "rank",
        )
    _load_state(obj.optim, state["shard"], name)
    # The hyperparameters (a scheduled learning rate) as saved, in the wrapper's groups too,
    # which step() copies into the shard's before each update.
    for outer, inner in zip(obj.param_groups, obj.optim.param_groups):
        outer.update({key: value for key, value in inner.items() if key != "params"})


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
                f"the checkpoint was saved from a {wrapper} wrapper (its keys start with "
                f"{prefix!r}) and is "
                "restored into the bare module: track the wrapped model, as when it was saved"
            )
        if wanted and wanted == {prefix + key for key in saved}:
            return (
                f"the checkpoint was saved from a bare module and is restored into a {wrapper} "
                f"wrapper "
                f"(its keys start with {prefix!r}): track the model as it was when saved"
            )
    return plain


# First match wins: a ZeroRedundancyOptimizer is stateful too, but its state is per rank.
KINDS: tuple[EntryKind, ...] = (
    EntryKind(
        "torch_generator", _is_torch_generator, lambda g: g.get_state(), _restore_torch_generator
    ),
    EntryKind(
        "numpy_generator",
        _is_numpy_generator,
        lambda g: g.bit_generator.state,
        _restore_numpy_generator,
    ),
    EntryKind("sharded_optimizer", _is_zero, _zero_state, _restore_zero),
    EntryKind("stateful", _is_stateful, lambda obj: obj.state_dict(), _load_state),
    EntryKind("value", lambda obj: True, lambda obj: obj, lambda obj, state, name: None),
)
_BY_NAME = {kind.name: kind for kind in KINDS}


def kind_of(obj: Any) -> EntryKind:
    """The kind an object is saved as."""
    return next(kind for kind in KINDS if kind.matches(obj))


def kind_named(name: Any, entry: str, where: Any) -> EntryKind:
    """The kind a checkpoint index names for `entry`; an unknown name is a CheckpointError."""
    kind = _BY_NAME.get(name) if isinstance(name, str) else None
    if kind is None:
        raise CheckpointError(
            f"checkpoint {where} records entry {entry!r} as {name!r}, which is not a kind twice "
            f"writes "
            f"({', '.join(_BY_NAME)})",
            "the index is damaged or was edited: restore an earlier checkpoint, or re-create it",
        )
    return kind
