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


@pytest.mark.parametrize("padding_idx", [-1, 2, 5])
def test_a_max_bags_gradient_skips_empty_bags_and_padding_as_torchs(padding_idx):
    """An empty bag's maximum index is 0 and names no row; a padding row takes no gradient.
    Integer gradients: every sum is exact, so the gradient is torch's to the bit."""
    torch.manual_seed(1)
    w = torch.randn(6, 3)
    idx, off = torch.tensor([2, 2, 1, 3, 2, 5]), torch.tensor([0, 2, 2, 4])
    aten = torch.ops.aten
    found = aten._embedding_bag(w, idx, off, False, 2, False, None, False, padding_idx)
    _, bags, sizes, top = found
    go = torch.randint(-4, 5, (4, 3)).float()
    args = (go, idx, bags, sizes, top, 6, False, 2, None, padding_idx)
    expected = aten._embedding_bag_dense_backward(*args)
    with PortableMode("strict"):
        assert torch.equal(aten._embedding_bag_dense_backward(*args), expected)


def test_max_norm_renormalises_each_named_row_once_as_torch():
    torch.manual_seed(2)
    weight = torch.randn(8, 4) * 3
    rows = torch.tensor([[1, 4, 4], [6, 1, 0]])
    expected = weight.clone()
    torch.embedding_renorm_(expected, rows, 2.0, 2.0)
    found = weight.clone()
    with PortableMode("strict"):
        torch.embedding_renorm_(found, rows, 2.0, 2.0)
        out = torch.nn.functional.embedding_bag(rows, weight.clone(), max_norm=2.0)
    assert torch.equal(found[[2, 3, 5, 7]], weight[[2, 3, 5, 7]])  # rows not named: untouched
    assert torch.allclose(found, expected, rtol=1e-6, atol=0)
    assert bool((torch.linalg.vector_norm(found[[0, 1, 4, 6]], dim=1) <= 2.0).all())
    assert out.shape == (2, 4)
