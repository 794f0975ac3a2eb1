"""native/products: a float64 exact product's compiled steps (the three slices in one pass, the
second and third slices, the six products' scaled sum) give the torch steps' bits."""

import pytest
import torch

from twice.portable import native
from twice.portable.arithmetic.exact import exact_matmul
from twice.portable.native import products
from unit.portable.bits import F64, both, same_bits

needs_native = pytest.mark.skipif(not native.available(), reason="twice._native was not built")


def test_the_steps_decline_what_they_do_not_take():
    x = torch.randn(3, 4, dtype=F64)
    assert products.slices(x.float(), x.float(), x[:, :1], 20) is None  # float64 only
    assert products.slices(x, x[:2], x[:, :1], 20) is None  # ints of another shape
    third = torch.zeros(3, 4, dtype=F64)
    assert products.combine3([third, third, third], x[:, 0], x[0], F64, 2.0**-20) is None  # 2-d
    for take in (products.left3, products.right3):
        assert take(x.float(), 20) is None and take(x[0], 20) is None  # float64 matrices only
        assert take(torch.zeros(0, 4, dtype=F64), 20) is None
        assert take(torch.tensor([[1.0, float("nan")]], dtype=F64), 20) is False


@needs_native
def test_the_one_pass_slices_give_the_two_pass_bits_over_generated_layouts(monkeypatch):
    """left3/right3 and the combine from first units against the route they replace (the first
    slice, then the next two, stacked by torch): generated shapes, batches, every operand read
    in place or transposed, and magnitudes from the subnormal range to near overflow."""
    g = torch.Generator().manual_seed(5)

    def draw(shape, flip):
        exponent = float(torch.randint(-300, 300, (1,), generator=g))
        x = torch.randn(*shape, generator=g, dtype=F64) * 10.0**exponent
        x = x * 10.0 ** (4 * torch.rand(*shape[:-1], 1, generator=g, dtype=F64))
        return x.transpose(-1, -2).contiguous().transpose(-1, -2) if flip else x

    one_pass = products.left3
    for index in range(48):
        m, k, n = (int(v) for v in torch.randint(1, 30, (3,), generator=g))
        batch = [int(torch.randint(1, 4, (1,), generator=g))] if index % 3 == 0 else []
        a, b = draw((*batch, m, k), index % 2), draw((*batch, k, n), index // 2 % 2)
        out = F64 if index % 4 else torch.float32
        monkeypatch.setattr(products, "left3", one_pass)
        fast = exact_matmul(a, b, out, F64)
        monkeypatch.setattr(products, "left3", lambda *args: None)
        two_pass = exact_matmul(a, b, out, F64)
        assert same_bits(fast, two_pass), (a.shape, b.shape, a.stride(), b.stride(), out)


@needs_native
def test_float64_products_keep_the_sliced_bits_over_generated_shapes_and_scales():
    """The compiled second and third slices and the compiled six-product sum against the torch
    steps: generated shapes (a single row, column or term included), batches, operands read
    transposed, and magnitudes from the subnormal range to near overflow."""
    g = torch.Generator().manual_seed(11)

    def draw(*shape):
        exponent = float(torch.randint(-300, 300, (1,), generator=g))
        scales = 10.0 ** (exponent + 4 * torch.rand(*shape[:-1], 1, generator=g, dtype=F64))
        return torch.randn(*shape, generator=g, dtype=F64) * scales

    for _ in range(40):
        m, k, n = (int(v) for v in torch.randint(1, 40, (3,), generator=g))
        batch = [int(torch.randint(1, 4, (1,), generator=g))] if bool(torch.rand(1) < 0.3) else []
        a, b = draw(*batch, m, k), draw(*batch, n, k).transpose(-1, -2)
        if bool(torch.rand(1, generator=g) < 0.5):
            a = draw(*batch, k, m).transpose(-1, -2)
        out = F64 if bool(torch.rand(1, generator=g) < 0.7) else torch.float32
        fast, slow = both(lambda a=a, b=b, out=out: exact_matmul(a, b, out, F64))
        assert same_bits(fast, slow), (a.shape, b.shape, out)


@needs_native
def test_the_compiled_slices_keep_the_sign_of_zero_as_torch_round():
    """A value below half a slice's unit rounds to zero with its sign, in the compiled cut as in
    torch.round: the product's zeros have the same sign on both routes, and one row's zero
    does not change with the other rows (an output of -0 times a column spanning 1e-40 to
    1e33, float32 and float64 results)."""
    a = [1.5581888072463007e-25, -3.476339503739756e-30, 1729613.979974848]
    a = torch.tensor([*a, -4.5783740169753924e-40, -0.0, 1.3358424650773064e33], dtype=F64)
    b = [0.0, -3.6690704400538167e-19, 2.4828791498756225e-18, 1631603090.9962142]
    b = torch.tensor(
        [*b, -47150544567528.45, -1.5230280687197558e-29, -3.4993591947291392e28], dtype=F64
    )
    a, b = a.to(F64)[:, None], b.to(F64)[None]
    for out in (F64, torch.float32):
        fast, slow = both(lambda out=out: exact_matmul(a, b, out, F64))
        assert same_bits(fast, slow) and torch.equal(fast.signbit(), slow.signbit())
        for rows in (slice(4, 5), slice(3, 6)):
            alone = exact_matmul(a[rows], b, out, F64)
            assert torch.equal(alone.signbit(), fast[rows].signbit())
