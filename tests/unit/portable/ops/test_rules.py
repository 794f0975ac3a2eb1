"""The kernels made exact or fixed in order by a rule: a product's terms in source order, a
histogram's weights added exactly, allclose and renorm in float64."""

import torch

from twice.portable.dispatch.mode import PortableMode
from twice.portable.ops import rules

G = torch.Generator().manual_seed(5)


def test_an_ordered_product_multiplies_each_destinations_terms_in_source_order():
    destination = torch.tensor([2, 0, 2, 2, 1, 0])
    values = torch.tensor([3.0, 5.0, 7.0, 11.0, 13.0, 17.0], dtype=torch.float64)
    out = rules.ordered_product(torch.ones(4, dtype=torch.float64), destination, values)
    assert out.tolist() == [85.0, 13.0, 231.0, 1.0]
    # the order is the source's: a float32-unfriendly chain gives its sequential float64 bits
    chain = torch.tensor([1e300, 1e10, 1e-300, 1e-10], dtype=torch.float64)
    one = rules.ordered_product(
        torch.ones(1, dtype=torch.float64), torch.zeros(4, dtype=torch.long), chain
    )
    expected = ((1e300 * 1e10) * 1e-300) * 1e-10
    assert one.item() == expected


def test_scatter_and_index_reduce_prod_give_one_result_whatever_the_batch_around_them():
    src = torch.rand(6, 5, generator=G) + 0.5
    index = torch.randint(0, 3, (6, 5), generator=G)
    with PortableMode("strict"):
        whole = torch.zeros(3, 5).scatter_reduce(0, index, src, "prod", include_self=False)
        column = torch.zeros(3, 1).scatter_reduce(
            0, index[:, :1], src[:, :1], "prod", include_self=False
        )
        by_index = torch.ones(3, 5).index_reduce(0, torch.tensor([0, 2, 2, 1, 0, 2]), src, "prod")
    assert torch.equal(whole[:, :1], column)
    reference = torch.zeros(3, 5, dtype=torch.float64).scatter_reduce(
        0, index, src.double(), "prod", include_self=False
    )
    assert bool(((whole.double() - reference).abs() <= 1e-6 * reference.abs()).all())
    assert by_index.shape == (3, 5)


def test_histogram_weights_add_exactly_and_edges_follow_torchs_rules():
    x = torch.tensor([0.0, 0.5, 0.7, 2.0, float("nan")])
    w = torch.tensor([1e8, 1.0, -1e8, 0.25, 9.0])
    with PortableMode("strict"):
        hist, edges = torch.histogram(x, bins=2, range=(0.0, 2.0), weight=w)
        empty_edges = torch.histogram(torch.tensor([]), bins=1).bin_edges
        counts = torch.histc(x[:4], bins=4, min=0, max=2)
    assert edges.tolist() == [0.0, 1.0, 2.0]
    assert hist.tolist() == [1.0, 0.25]  # exact: float32 added in order would give 0 first
    assert empty_edges.tolist() == [0.0, 1.0]
    assert counts.tolist() == [1.0, 2.0, 0.0, 1.0]


def test_allclose_and_renorm_follow_torch():
    a = torch.randn(4, 6, generator=G)
    with PortableMode("strict"):
        assert torch.allclose(a, a + 1e-9) and not torch.allclose(a, a + 1e-3)
        assert torch.allclose(
            torch.tensor([float("nan")]), torch.tensor([float("nan")]), equal_nan=True
        )
        renormed = torch.renorm(a, 2, 0, 1.0)
        spaced = torch.linspace(torch.tensor(0.0), torch.tensor(1.0), 5)
    assert bool((torch.linalg.vector_norm(renormed, dim=1) <= 1.0 + 1e-6).all())
    assert spaced.tolist() == [0.0, 0.25, 0.5, 0.75, 1.0]


def test_logspace_takes_tensor_bounds_as_the_scalar_kernel_does():
    with PortableMode("strict"):
        from_tensors = torch.logspace(torch.tensor(0.0), torch.tensor(2.0), 5)
        from_numbers = torch.logspace(0.0, 2.0, 5)
    assert torch.equal(from_tensors, from_numbers) and from_tensors[-1] == 100.0


def test_histogram_bins_are_torchs_for_edges_in_any_order():
    """Edges out of order are torch's case too: an element counts where torch's binary search
    puts it, between the first and the last edge. Generated edges and values, counted (exact
    integers) as torch counts them, one dimension and several."""
    g = torch.Generator().manual_seed(5)
    for _ in range(40):
        edges = [torch.randn(int(torch.randint(2, 7, (1,), generator=g)), generator=g) * 3]
        edges.append(torch.randn(int(torch.randint(2, 5, (1,), generator=g)), generator=g) * 3)
        x = torch.randn(30, 2, generator=g) * 3
        x[0, 0], x[1, 1], x[2, 0] = edges[0][-1], edges[1][0], float("nan")
        expected = torch.histogramdd(x, edges).hist
        one = torch.histogram(x[:, 0], edges[0]).hist
        with PortableMode("strict"):
            assert torch.equal(torch.histogramdd(x, edges).hist, expected)
            assert torch.equal(torch.histogram(x[:, 0], edges[0]).hist, one)
