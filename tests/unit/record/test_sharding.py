"""record/sharding: what a rank holds of a DTensor parameter, for the manifest (its layout) and
for the replica check (its replica groups)."""

import torch
import torch.distributed as dist

from twice.core.digests import digest_pairs, digest_tensor
from twice.record.sharding import (
    Layouts,
    ReplicaClass,
    full_digests,
    replica_classes,
    sharding_layout,
)


def test_the_layout_names_each_dtensors_mesh_and_placements(one_rank_mesh):
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    full = torch.arange(12.0).reshape(6, 2)
    named = [
        ("w", distribute_tensor(full, one_rank_mesh, [Shard(0)])),
        ("b", distribute_tensor(full[0], one_rank_mesh, [Replicate()])),
        ("plain", torch.ones(2)),
    ]
    layout = sharding_layout(named)
    assert layout == {
        "meshes": ["(1)"],
        "placements": {"b": "(1) ['R']", "w": "(1) ['S(0)']"},
    }
    assert sharding_layout(named[2:]) is None  # a plain run: nothing to record
    layouts = Layouts()
    layouts.observe("optimizer", named)
    layouts.observe("optimizer", [])  # once per holder
    assert layouts.sharding == layout
    # the whole tensor's digest, whatever the placement
    assert full_digests(named) == [
        ("w", digest_tensor(full)),
        ("b", digest_tensor(full[0])),
        ("plain", digest_tensor(torch.ones(2))),
    ]
    # one rank holds no replica of anything: nothing to compare
    assert replica_classes(named, {"w": "a" * 32, "b": "b" * 32, "plain": "c" * 32}, dist) == []


def test_a_replica_class_is_three_signed_words_and_its_group_one_number():
    first, same, other = (
        ReplicaClass("k", (0, 1)),
        ReplicaClass("k", (0, 1)),
        ReplicaClass("k", (2,)),
    )
    for found in (first, same, other):
        found.pairs.append(("w", "f" * 32))
    assert first.words() == same.words() and first.group_id != other.group_id
    high, low, _ = first.words()
    assert (high % 2**64) << 64 | (low % 2**64) == int(digest_pairs(first.pairs), 16)
    assert all(-(2**63) <= w < 2**63 for w in first.words())
