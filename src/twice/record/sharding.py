"""Sharded parameters (DTensor: FSDP2, tensor parallel, both on a 2-D mesh): what each rank holds.

The trace digests a DTensor as this rank's shard (core/digests.local_tensor). Two facts about the
sharding are needed beside it:

- **the layout**, for the manifest: the mesh (its shape and dimension names) and each parameter's
  placements, so that `twice diff` explains a change of mesh, placement or world size as such;
- **the replica groups**, for the replica check: which ranks must hold the same bytes of a
  parameter. A DTensor's shard is the same on every rank of its mesh whose coordinates agree on
  the dimensions the tensor is sharded (or partial) on; its replicated dimensions hold copies. A
  plain tensor is compared across the whole world, as under DDP. A tensor sharded on every
  dimension of its mesh has no replica, and nothing of it is compared.

Both are computed from the parameters themselves, the same on every rank (SPMD), so every rank
reaches the same verdict from the same gathered words.
"""

from __future__ import annotations

from typing import Any

from twice.core.digests import digest_pairs, dtensor_type

__all__ = ["Layouts", "ReplicaClass", "full_digests", "replica_classes", "sharding_layout"]

_REPLICATED = "replicated"  # a plain tensor: the whole world holds copies


def _mesh_text(mesh: Any) -> str:
    names = mesh.mesh_dim_names
    dims = ", ".join(
        f"{names[i]}={size}" if names else str(size) for i, size in enumerate(mesh.shape)
    )
    return f"({dims})"


def _placements_text(tensor: Any) -> str:
    return f"{_mesh_text(tensor.device_mesh)} {list(map(str, tensor.placements))}"


def sharding_layout(named: list[tuple[str, Any]]) -> dict | None:
    """{"meshes": [...], "placements": {name: "mesh placements"}} for the DTensors among
    `named`; None when none is a DTensor (a plain or DDP run: nothing to record)."""
    dtensor = dtensor_type()
    if dtensor is None:
        return None
    placements = {
        name: _placements_text(tensor) for name, tensor in named if isinstance(tensor, dtensor)
    }
    if not placements:
        return None
    meshes = sorted({text.split(" [", 1)[0] for text in placements.values()})
    return {"meshes": meshes, "placements": dict(sorted(placements.items()))}


class Layouts:
    """The sharding layout of every optimizer's parameters, taken once per optimizer: what the
    process record (and so the manifest) holds as `distributed.sharding`."""

    def __init__(self):
        self.sharding: dict | None = None
        self._seen: set[int] = set()

    def observe(self, holder: Any, named: list[tuple[str, Any]]) -> None:
        """Take the layout of `holder`'s parameters (an optimizer's, a hand loop's), once."""
        if id(holder) in self._seen:
            return
        self._seen.add(id(holder))
        layout = sharding_layout(named)
        if layout is not None:
            merged = self.sharding or {"meshes": [], "placements": {}}
            merged["meshes"] = sorted({*merged["meshes"], *layout["meshes"]})
            merged["placements"].update(layout["placements"])
            self.sharding = merged


def full_digests(named: list[tuple[str, Any]]) -> list[tuple[str, str]]:
    """(name, digest of the whole tensor) for each parameter: a DTensor gathered from every rank
    (`full_tensor()`, a collective: every rank calls it at the same step), a plain tensor as it
    is. The same digests whatever the mesh and placements."""
    from twice.core.digests import digest_tensor

    dtensor = dtensor_type()
    out = []
    for name, tensor in named:
        whole = (
            tensor.full_tensor() if dtensor is not None and isinstance(tensor, dtensor) else tensor
        )
        out.append((name, digest_tensor(whole.detach())))
    return out


class ReplicaClass:
    """Tensors that share a mesh and placements: on each rank, their digests combined, and the
    ranks that must hold the same bytes (`group`, the same list on each of them)."""

    def __init__(self, key: str, group: tuple[int, ...]):
        self.key = key
        self.group = group
        self.pairs: list[tuple[str, str]] = []

    @property
    def group_id(self) -> int:
        """A signed 63-bit number naming `group` (equal on the ranks of one group)."""
        return int(digest_pairs([("group", ",".join(map(str, self.group)))])[:15], 16)

    def words(self) -> list[int]:
        """(digest high, digest low, group id) as signed int64 words, for an all-gather."""
        value = int(digest_pairs(self.pairs), 16)
        words = [(value >> 64) & (2**64 - 1), value & (2**64 - 1)]
        return [w - 2**64 if w >= 2**63 else w for w in words] + [self.group_id]


def _group(tensor: Any, dist: Any) -> tuple[int, ...]:
    """The global ranks whose shard of `tensor` must equal this rank's."""
    mesh = tensor.device_mesh
    ranks = mesh.mesh.tolist()
    coordinate = mesh.get_coordinate()
    sharded = [i for i, p in enumerate(tensor.placements) if not p.is_replicate()]

    def walk(level: Any, where: tuple[int, ...]):
        if not isinstance(level, list):
            yield where, level
            return
        for i, part in enumerate(level):
            yield from walk(part, (*where, i))

    return tuple(
        sorted(
            rank
            for where, rank in walk(ranks, ())
            if all(where[d] == coordinate[d] for d in sharded)
        )
    )


def replica_classes(named: list[tuple[str, Any]], digests: dict[str, str], dist: Any) -> list:
    """The `ReplicaClass`es of `named` (name, tensor) whose group has more than this rank,
    sorted by key (the same order on every rank), each holding its tensors' digests."""
    dtensor = dtensor_type()
    world = tuple(range(dist.get_world_size()))
    classes: dict[str, ReplicaClass] = {}
    for name, tensor in named:
        if name not in digests:
            continue
        if dtensor is not None and isinstance(tensor, dtensor):
            key = _placements_text(tensor)
            found = classes.get(key)
            if found is None:
                found = classes[key] = ReplicaClass(key, _group(tensor, dist))
        else:
            found = classes.get(_REPLICATED)
            if found is None:
                found = classes[_REPLICATED] = ReplicaClass(_REPLICATED, world)
        found.pairs.append((name, digests[name]))
    return [classes[key] for key in sorted(classes) if len(classes[key].group) > 1]
