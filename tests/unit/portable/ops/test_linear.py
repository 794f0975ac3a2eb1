"""ops/linear: exact sums of one tensor (scans, pooling, scatters); pooling sums cut by the
compiled kernel give the fallback's bits."""

import math

import pytest
import torch

from twice.portable import native
from twice.portable.dispatch.mode import PortableMode
from twice.portable.ops import linear
from unit.portable.bits import (
    gen,
    same_bits,
)


@pytest.mark.skipif(not native.available(), reason="needs the compiled kernels")
@pytest.mark.parametrize("spoil", [None, math.inf, math.nan])
def test_pooling_sums_cut_by_the_compiled_kernel_give_the_fallbacks_bits(spoil):
    torch.manual_seed(5)
    x = torch.randn(3, 4, 9, 11) * torch.logspace(-4, 4, 4).reshape(1, 4, 1, 1)
    x3 = torch.randn(2, 3, 5, 6, 7)
    if spoil is not None:
        x[1, 2, 3, 4] = spoil

    def pools():
        out = []
        for inp, pool in (
            (x, torch.nn.functional.avg_pool2d),
            (x3, torch.nn.functional.avg_pool3d),
        ):
            leaf = inp.clone().requires_grad_()
            with PortableMode("strict"):
                y = pool(leaf, 3, 2, 1, ceil_mode=True, count_include_pad=False)
                (grad,) = torch.autograd.grad(
                    y, leaf, torch.linspace(-1, 1, y.numel()).reshape(y.shape)
                )
            out += [y, grad]
        return out

    fast = pools()
    with native.fallback():
        slow = pools()
    assert all(same_bits(a, b) for a, b in zip(fast, slow))


def test_a_sum_of_elements_has_the_same_bits_in_any_order_with_ieee_infinities():
    g = gen(4)
    x = torch.randn(50, 3, generator=g) * torch.logspace(-5, 5, 50).reshape(-1, 1)
    columns = lambda t: t.sum(0)
    total = linear.exact_linear(x, columns, None, 50, torch.float32)
    perm = torch.randperm(50, generator=g)
    assert torch.equal(linear.exact_linear(x[perm], columns, None, 50, torch.float32), total)
    assert bool(((total.double() - x.double().sum(0)).abs() <= 1e-6 * x.abs().sum(0)).all())
    x[3, 0], x[7, 0], x[9, 1] = math.inf, -math.inf, math.inf
    spoilt = linear.exact_linear(x, columns, None, 50, torch.float32)
    assert math.isnan(spoilt[0]) and spoilt[1] == math.inf and spoilt[2] == total[2]
