"""The segment reductions (exact sums and extremes, ordered products, torch's backward formula)
and the multi-dimensional histogram (exact bins and counts) against torch in float64."""

import pytest
import torch

from twice.portable.dispatch.mode import PortableMode
from twice.portable.ops import segments

G = torch.Generator().manual_seed(7)


def close(ours, reference, rtol=1e-6):
    ours, reference = ours.double(), reference.double()
    same_nan = torch.isnan(ours) == torch.isnan(reference)
    ok = (ours == reference) | ((ours - reference).abs() <= 1e-12 + rtol * reference.abs())
    return bool(same_nan.all()) and bool((ok | torch.isnan(reference)).all())


@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min", "prod"])
@pytest.mark.parametrize("initial", [None, 0.5])
def test_segment_reduce_matches_torch_with_empty_segments_lengths_and_offsets(reduce, initial):
    data = torch.rand(3, 9, 2, generator=G) + 0.5
    lengths = torch.tensor([[2, 0, 4, 3], [0, 9, 0, 0], [1, 1, 1, 6]])
    offsets = torch.cat([torch.zeros(3, 1, dtype=torch.long), lengths.cumsum(1)], 1)
    reference = torch.segment_reduce(
        data.double(), reduce, lengths=lengths, axis=1, initial=initial
    )
    with PortableMode("strict"):
        by_lengths = torch.segment_reduce(data, reduce, lengths=lengths, axis=1, initial=initial)
        by_offsets = torch.segment_reduce(data, reduce, offsets=offsets, axis=1, initial=initial)
    assert torch.equal(by_lengths.nan_to_num(7.0), by_offsets.nan_to_num(7.0))
    assert close(by_lengths, reference)
    if reduce in ("max", "min"):  # exact: torch's own float32 result
        expected = torch.segment_reduce(data, reduce, lengths=lengths, axis=1, initial=initial)
        assert torch.equal(by_lengths, expected)


def test_a_segments_sum_is_exact_and_independent_of_the_other_columns():
    data = torch.tensor([[1e8, 1.0], [1.0, 2.0], [-1e8, 3.0]], dtype=torch.float32)
    lengths = torch.tensor([3])
    with PortableMode("strict"):
        whole = torch.segment_reduce(data, "sum", lengths=lengths)
        column = torch.segment_reduce(data[:, :1].contiguous(), "sum", lengths=lengths)
    assert whole.tolist() == [[1.0, 6.0]]  # sequential float32 addition gives 0 for the first
    assert torch.equal(whole[:, :1], column)


def test_max_and_min_propagate_nan_and_take_ieee_zero_signs():
    data = torch.tensor([-0.0, 0.0, 1.0, float("nan"), -0.0, -0.0])
    with PortableMode("strict"):
        high = torch.segment_reduce(data, "max", lengths=torch.tensor([2, 2, 2]))
        low = torch.segment_reduce(data, "min", lengths=torch.tensor([2, 2, 2]))
    assert high[0].item() == 0.0 and not torch.signbit(high[0])
    assert torch.isnan(high[1]) and torch.isnan(low[1])
    assert low[0].item() == 0.0 and torch.signbit(low[0]) and torch.signbit(high[2])


@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min", "prod"])
def test_the_backward_follows_torchs_formula_ties_and_zeros_included(reduce):
    data = torch.tensor(
        [3.0, 1.0, 3.0, 0.0, 2.0, 5.0, 5.0, 5.0, 0.0, 0.0, 4.0], dtype=torch.float64
    )
    lengths = torch.tensor([3, 0, 2, 3, 3])
    grad = torch.tensor([2.0, 7.0, 1.5, -3.0, 0.25], dtype=torch.float64)

    def gradient(x):
        x = x.clone().requires_grad_(True)
        out = torch.segment_reduce(x, reduce, lengths=lengths, initial=1.5)
        return torch.autograd.grad(out, x, grad.to(x.dtype))[0]

    reference = gradient(data)
    with PortableMode("strict"):
        ours = gradient(data.float())
    assert close(ours, reference)
    if reduce == "max":  # the positive share split between two ties, the negative one not
        assert ours[:3].tolist() == [1.0, 0.0, 1.0] and ours[5:8].tolist() == [-3.0] * 3


def test_histogramdd_counts_exactly_with_the_last_bins_right_edge_inclusive():
    x = torch.rand(200, 2, generator=G) * 4 - 1
    x[0] = torch.tensor([3.0, 3.0])  # exactly the right edges
    weight = torch.rand(200, generator=G)
    edges = [torch.tensor([-1.0, 0.0, 1.5, 3.0]), torch.tensor([-1.0, 1.0, 3.0])]
    with PortableMode("strict"):
        counts = torch.histogramdd(x, [4, 3])
        given = torch.histogramdd(x, edges, weight=weight, density=True)
        ranged = torch.histogramdd(x, [2, 2], range=[0.0, 1.0, -1.0, 0.0])
    expected = torch.histogramdd(x.double(), [4, 3])
    assert torch.equal(counts.hist.double(), expected.hist)
    for ours, theirs in zip(counts.bin_edges, expected.bin_edges):
        assert close(ours, theirs)
    reference = torch.histogramdd(
        x.double(), [e.double() for e in edges], weight=weight.double(), density=True
    )
    assert close(given.hist, reference.hist)
    assert torch.equal(
        ranged.hist.double(),
        torch.histogramdd(x.double(), [2, 2], range=[0.0, 1.0, -1.0, 0.0]).hist,
    )


def test_exclusive_products_leave_out_each_value_once():
    destination = torch.tensor([0, 1, 0, 0, 1])
    values = torch.tensor([2.0, 3.0, 0.0, 5.0, 7.0], dtype=torch.float64)
    assert segments._exclusive_products(destination, values).tolist() == [0, 7, 10, 0, 3]
