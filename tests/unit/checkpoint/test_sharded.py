"""Sharded state (FSDP2: DTensor parameters) saved and loaded through Distributed Checkpoint, its
pieces decoded by torch's weights-only unpickler; here on a one-rank mesh."""

import io
import pickle

import pytest
import torch
import torch.distributed as dist

from twice import checkpoint
from twice.checkpoint.ranks import save_ranks
from twice.checkpoint.sharded import decode_piece, is_sharded
from twice.core.errors import CheckpointError


def _sharded(mesh, seed):
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    fully_shard(model, mesh=mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=0.1)


def test_an_fsdp2_model_and_optimizer_come_back_bit_for_bit(tmp_path, one_rank_mesh):
    model, opt = _sharded(one_rank_mesh, 0)
    assert is_sharded(model) and is_sharded(opt) and not is_sharded(torch.nn.Linear(2, 2))
    model(torch.ones(3, 4)).sum().backward()
    opt.step()
    save_ranks(tmp_path / "c", dist, {"model": model, "optimizer": opt})
    assert (tmp_path / "c" / "dcp" / ".metadata").is_file()
    fresh, fresh_opt = _sharded(one_rank_mesh, 1)
    checkpoint.load(tmp_path / "c", model=fresh, optimizer=fresh_opt)
    for a, b in zip(model.parameters(), fresh.parameters()):
        assert torch.equal(a.full_tensor(), b.full_tensor())
    moments = [
        (opt.state[a]["exp_avg"].full_tensor(), fresh_opt.state[b]["exp_avg"].full_tensor())
        for a, b in zip(model.parameters(), fresh.parameters())
    ]
    assert all(torch.equal(x, y) for x, y in moments)


class _Touch:
    def __reduce__(self):
        return (print, ("ran",))


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")  # the crafted piece's
def test_a_piece_is_a_tensor_of_its_described_dtype_and_size_or_refused():
    buffer = io.BytesIO()
    torch.save(torch.arange(6.0).reshape(2, 3), buffer)
    piece = buffer.getvalue()
    assert torch.equal(decode_piece(piece, "p"), torch.arange(6.0).reshape(2, 3))
    assert decode_piece(piece, "p", (torch.float32, (2, 3))).shape == (2, 3)
    with pytest.raises(CheckpointError, match="is not the torch.float64 tensor of size"):
        decode_piece(piece, "p", (torch.float64, (2, 3)))
    with pytest.raises(CheckpointError, match="cannot be read"):
        decode_piece(pickle.dumps(_Touch()), "dcp/__0_0.distcp")
