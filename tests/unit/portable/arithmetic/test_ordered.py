"""arithmetic/ordered: a float64 product is its textbook loop, each sum in k's order, on every
route (the compiled kernel, the torch loop; the Triton kernel in test_triton.py), for torch.matmul's
shapes; what the order implies (transposes and blocks keep their bits, a split along k does not)."""

import pytest
import torch

from twice.portable.arithmetic.exact import exact_matmul
from twice.portable.arithmetic.ordered import ordered_loop, ordered_matmul
from unit.portable.bits import F64, both, gen, same_bits


def _loop_by_hand(a, b):
    """The definition in Python floats, element by element."""
    out = torch.empty(a.shape[0], b.shape[1], dtype=F64)
    for i in range(a.shape[0]):
        for j in range(b.shape[1]):
            total = float(a[i, 0]) * float(b[0, j])
            for k in range(1, a.shape[1]):
                total = total + float(a[i, k]) * float(b[k, j])
            out[i, j] = total
    return out


def test_the_rule_is_the_loop_written_by_hand():
    g = gen(1)
    a = torch.randn(5, 9, generator=g, dtype=F64) * torch.logspace(-8, 8, 9, dtype=F64)
    b = torch.randn(9, 4, generator=g, dtype=F64)
    for fast_or_slow in both(lambda: ordered_matmul(a, b)):
        assert same_bits(fast_or_slow, _loop_by_hand(a, b))


@pytest.mark.parametrize(
    "a_shape, b_shape",
    [((7,), (7,)), ((7,), (7, 3)), ((4, 7), (7,)), ((2, 1, 4, 7), (3, 7, 5)), ((3, 7), (2, 7, 1)),
     ((0, 7), (7, 3)), ((4, 0), (0, 3)), ((2, 0, 5), (5, 2))],
)  # fmt: skip
def test_torch_matmuls_shapes_on_both_routes(a_shape, b_shape):
    g = gen(2)
    a = torch.randn(*a_shape, generator=g, dtype=F64)
    b = torch.randn(*b_shape, generator=g, dtype=F64)
    fast, slow = both(lambda: ordered_matmul(a, b))
    want = torch.matmul(a, b)
    assert fast.shape == want.shape and same_bits(fast, slow)
    if a.shape[-1] == 0:  # no term: +0
        assert not fast.signbit().any()
    elif fast.numel():
        assert torch.allclose(fast, want, rtol=1e-13, atol=1e-13)


def test_shapes_that_do_not_multiply_are_torchs_error():
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        ordered_matmul(torch.ones(2, 3, dtype=F64), torch.ones(4, 2, dtype=F64))
    with pytest.raises(RuntimeError, match="at least 1D"):
        ordered_matmul(torch.ones((), dtype=F64), torch.ones(2, dtype=F64))


def test_every_float64_product_takes_the_rule_and_a_float32_one_does_not():
    """exact_matmul at float64 precision is the loop (a float32 result then one rounding of
    it); at float32 precision an exact sum, which no order changes."""
    g = gen(3)
    a, b = torch.randn(6, 40, generator=g), torch.randn(40, 5, generator=g)
    loop = ordered_loop(a.double(), b.double())
    assert same_bits(exact_matmul(a.double(), b.double()), loop)
    assert same_bits(exact_matmul(a, b, F64), loop)
    assert same_bits(exact_matmul(a, b, torch.float32, F64), loop.float())
    perm = torch.randperm(40, generator=g)
    assert same_bits(exact_matmul(a[:, perm], b[perm]), exact_matmul(a, b))


def test_blocks_and_transposes_keep_their_bits_a_split_along_k_does_not_have_to():
    g = gen(4)
    a = torch.randn(9, 300, generator=g, dtype=F64)
    b = torch.randn(300, 20, generator=g, dtype=F64)
    out = ordered_matmul(a, b)
    assert same_bits(ordered_matmul(b.mT, a.mT).mT, out)
    assert same_bits(torch.cat([ordered_matmul(a[:4], b), ordered_matmul(a[4:], b)]), out)
    assert same_bits(torch.cat([ordered_matmul(a, b[:, :7]), ordered_matmul(a, b[:, 7:])], 1), out)
    halves = ordered_matmul(a[:, :150], b[:150]) + ordered_matmul(a[:, 150:], b[150:])
    assert not torch.equal(halves, out)  # another computation, other bits (on these values)
