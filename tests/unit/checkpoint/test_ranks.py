"""Checkpoints of multi-process runs: each rank its part, rank 0 the index of them all, in place
only when every part is; here on a one-rank gloo group."""

import torch
import torch.distributed as dist

from twice import checkpoint
from twice.checkpoint.folder import verify
from twice.checkpoint.index import RanksIndex
from twice.checkpoint.ranks import current_rank, process_group, save_ranks


def test_a_group_writes_one_part_per_rank_under_an_index_of_their_digests(tmp_path, one_rank_mesh):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    target = tmp_path / "checkpoints" / "step-00000001"
    target.parent.mkdir()
    save_ranks(target, dist, {"model": model, "value": {"epoch": 4}})
    index = verify(target)
    assert isinstance(index, RanksIndex) and list(index.parts) == ["rank-00000"]
    assert [p.name for p in target.parent.iterdir()] == ["step-00000001"]  # no staging left
    fresh = torch.nn.Linear(3, 2)
    restored = checkpoint.load(target, model=fresh)
    assert restored["value"] == {"epoch": 4} and torch.equal(fresh.weight, model.weight)


def test_one_process_is_no_group_and_its_rank_comes_from_the_environment(monkeypatch):
    assert process_group() is None  # no group here (and a group of one is not one either)
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "8")
    assert current_rank() == (3, 8)
