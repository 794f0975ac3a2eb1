"""ops/embedding: embedding bags (sum, mean, max, per-sample weights) with each bag's rows added
exactly, so a bag's value does not depend on the order of its rows."""

import pytest
import torch

from twice.portable.dispatch.mode import PortableMode
from twice.portable.dispatch.table import KERNELS
from twice.portable.ops import embedding


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_a_bag_is_the_same_bits_whatever_the_order_of_its_rows(mode):
    assert KERNELS["_embedding_bag.default"].__module__ == embedding.__name__
    torch.manual_seed(0)
    bag = torch.nn.EmbeddingBag(20, 6, mode=mode)
    with torch.no_grad():
        bag.weight.mul_(torch.logspace(-4, 4, 20).reshape(-1, 1))
    rows = torch.tensor([3, 17, 5, 9, 1, 12, 0, 19])
    offsets = torch.tensor([0, 5])
    with PortableMode("strict"):
        out = bag(rows, offsets)
        shuffled = bag(torch.cat([rows[:5].flip(0), rows[5:].flip(0)]), offsets)
        out.square().sum().backward()
    assert torch.equal(out, shuffled)
    assert torch.allclose(out, bag(rows, offsets), rtol=1e-5, atol=1e-6)  # torch's, to float noise
    assert bag.weight.grad is not None


def test_per_sample_weights_scale_each_row_before_the_exact_sum():
    torch.manual_seed(1)
    bag = torch.nn.EmbeddingBag(10, 3, mode="sum")
    rows, offsets = torch.tensor([1, 2, 4, 4]), torch.tensor([0, 2])
    weights = torch.tensor([0.5, 2.0, 1.0, -1.0])
    with PortableMode("strict"):
        out = bag(rows, offsets, per_sample_weights=weights)
    assert torch.allclose(out, bag(rows, offsets, per_sample_weights=weights), atol=1e-6)
    assert torch.equal(out[1], torch.zeros(3))  # the same row added and taken away: exactly 0
