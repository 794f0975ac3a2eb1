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


def test_max_pooling_gradients_with_disjoint_windows_are_the_exact_sums_bits():
    """Max pooling's input gradient is torch's kernel itself where no two windows overlap (each
    input at most one output's gradient), the exact sum where they do: generated 2-d and 3-d
    pools (strides below, at and above the window, dilation, padding, ceil mode, unbatched
    inputs, gradients with -0, infinities and NaN) give the exact route's bits either way, and
    the direct route is taken exactly where the windows are disjoint."""
    import torch.nn.functional as F

    g = gen(9)
    taken = []
    direct = linear._disjoint_windows
    for index in range(40):
        dims = 2 + index % 2
        k = [int(v) for v in torch.randint(1, 4, (dims,), generator=g)]
        s = [int(v) for v in torch.randint(1, 5, (dims,), generator=g)]
        d = [int(v) for v in torch.randint(1, 3, (dims,), generator=g)] if index % 5 == 0 else 1
        p = [int(torch.randint(0, (kk + 1) // 2, (1,), generator=g)) for kk in k]
        p = p if d == 1 else 0
        shape = [2, 3][: 1 + index % 3 // 2] + [
            int(v) for v in torch.randint(6, 10, (dims,), generator=g)
        ]
        x = torch.randn(*shape, generator=g).requires_grad_()
        pool = F.max_pool2d if dims == 2 else F.max_pool3d
        with PortableMode("strict"):
            y = pool(x, k, s, p, d, ceil_mode=bool(index % 4 == 1))
        up = torch.randn(y.shape, generator=g)
        up.view(-1)[:3] = torch.tensor([-0.0, math.inf, math.nan])[: up.numel()]
        with PortableMode("strict"):
            (got,) = torch.autograd.grad(y, x, up)
        want = linear._sum_backward(
            getattr(torch.ops.aten, f"max_pool{dims}d_with_indices_backward").default
        )(up, x.detach(), k, s, p, [d] * dims if d == 1 else d, index % 4 == 1,
          pool(x.detach(), k, s, p, d, index % 4 == 1, return_indices=True)[1])  # fmt: skip
        assert same_bits(got, want), (dims, k, s, d, p, shape)
        taken.append(direct(dims)(x, k, s, p, [d] * dims if d == 1 else d, False, None))
        dk = [(kk - 1) * (d if d == 1 else d[i]) + 1 for i, kk in enumerate(k)]
        assert taken[-1] == all(a <= b for a, b in zip(dk, s)), (k, s, d)
    assert any(taken) and not all(taken)
