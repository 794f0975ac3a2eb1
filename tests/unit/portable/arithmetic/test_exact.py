"""arithmetic/exact: exact products and sums whose bits depend on the values alone (not on
layout, order or code path), IEEE non-finite values, and Repeated's slices cut once; float64
products follow ordered.py's rule (its own tests: test_ordered.py)."""

import contextlib
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from twice.portable.arithmetic.exact import Repeated, exact_addmm, exact_matmul, exact_sum
from twice.portable.arithmetic.ordered import ordered_loop
from unit.portable.bits import (
    EXAMPLES,
    F64,
    both,
    compiled_kernels,
    gen,
    needs_native,
    same_bits,
)


@needs_native
def test_exact_sums_and_products_native_equal_fallback():
    g = gen(3)
    m = torch.randn(37, 53, 11, generator=g) * torch.rand(37, 1, 1, generator=g)
    for dims in [None, (0,), (1,), (2,), (0, 2), (1, 2)]:
        for precision in (torch.float32, F64):
            for keepdim in (False, True):
                fast, slow = both(lambda d=dims, p=precision, k=keepdim: exact_sum(m, d, k, F64, p))
                assert torch.equal(fast, slow), (dims, precision, keepdim)
    for dt in (torch.float32, F64):
        for a_shape, b_shape in [((40, 70), (70, 30)), ((3, 40, 70), (3, 70, 30))]:
            a = torch.randn(*a_shape, generator=g).to(dt)
            b = torch.randn(*b_shape, generator=g).to(dt)
            bt = b.transpose(-1, -2).contiguous().transpose(-1, -2)
            assert torch.equal(*both(lambda: exact_matmul(a, b)))
            assert torch.equal(*both(lambda bt=bt: exact_matmul(a, bt)))
            bias = torch.randn(b_shape[-1], generator=g).to(dt)
            assert torch.equal(*both(lambda: exact_addmm(bias, a, b, dt)))


# a product's m, k, n, its operands' seed and its dtype
_PRODUCTS = (
    st.integers(1, 9),
    st.integers(1, 70),
    st.integers(1, 9),
    st.integers(0, 2**31),
    st.sampled_from([torch.float32, F64]),
)


@EXAMPLES
@given(
    *_PRODUCTS,
    st.sampled_from([1e-30, 1.0, 1e30]),
    st.sampled_from([None, math.inf, math.nan]),
    st.booleans(),
)
def test_a_product_is_its_transposes_and_its_column_blocks(m, k, n, seed, dtype, scale, spoil, on):
    """`a @ b` is `(b.mT @ a.mT).mT` and the columns of `a @ [b1 | b2]` are `a @ b1` and
    `a @ b2`, bit for bit: autograd forms a gradient in one of these shapes and a fused route
    (recurrent.py's cells) may form it in another, and each must give the other's bits."""
    g = gen(seed)
    a = (torch.randn(m, k, generator=g) * torch.rand(m, 1, generator=g) * scale).to(dtype)
    b = (torch.randn(k, n, generator=g) * torch.rand(1, n, generator=g)).to(dtype)
    if spoil is not None:
        a[seed % m, seed % k] = spoil
    with compiled_kernels(on):
        out = exact_matmul(a, b)
        assert same_bits(exact_matmul(b.mT, a.mT).mT, out)
        assert same_bits(exact_matmul(b.mT.contiguous(), a.mT.contiguous()).mT, out)
        cut = seed % (n + 1)
        parts = [exact_matmul(a, b[:, :cut]), exact_matmul(a, b[:, cut:])]
        assert same_bits(torch.cat(parts, 1), out)


@settings(max_examples=25, deadline=None)
@given(*_PRODUCTS)
def test_products_do_not_depend_on_layout_or_order(m, k, n, seed, dtype):
    g = gen(seed)
    a = (torch.randn(m, k, generator=g) * torch.rand(m, 1, generator=g) * 10).to(dtype)
    b = torch.randn(k, n, generator=g).to(dtype)
    out = exact_matmul(a, b)
    # a transposed layout, a non-contiguous view, the sum order permuted: the same bits
    a_t = a.t().contiguous().t()
    b_wide = torch.zeros(k, 2 * n, dtype=dtype)
    b_wide[:, ::2] = b
    perm = torch.randperm(k, generator=g)
    assert torch.equal(exact_matmul(a_t, b), out)
    assert torch.equal(exact_matmul(a, b_wide[:, ::2]), out)
    assert torch.equal(exact_matmul(a.unsqueeze(0), b.unsqueeze(0))[0], out)
    if dtype == torch.float32:  # exact: any order of the terms
        assert torch.equal(exact_matmul(a[:, perm], b[perm]), out)
    else:  # float64: the sums in k's order (ordered.py)
        assert torch.equal(ordered_loop(a, b), out)
    # accurate to a few units of the float32 result (k float64 roundings) on the magnitudes
    ref = a.double() @ b.double()
    scale = a.double().abs() @ b.double().abs()
    tol = 2e-6 if dtype == torch.float32 else 2.3e-16 * k
    assert bool(((out.double() - ref).abs() <= tol * scale + 1e-300).all())


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.integers(1, 6), min_size=1, max_size=4),
    st.integers(0, 2**31),
    st.sampled_from([torch.float32, F64]),
)
def test_sums_do_not_depend_on_order(shape, seed, dtype):
    g = gen(seed)
    x = (torch.randn(*shape, generator=g) * torch.exp(torch.randn(*shape, generator=g) * 3)).to(
        dtype
    )
    dim = int(torch.randint(0, len(shape), (1,), generator=g))
    total = exact_sum(x, (dim,))
    perm = torch.randperm(shape[dim], generator=g)
    assert torch.equal(exact_sum(x.index_select(dim, perm), (dim,)), total)
    assert torch.equal(exact_sum(x.movedim(dim, 0).contiguous(), (0,)), total)
    assert torch.equal(exact_sum(x, (dim,), keepdim=True).squeeze(dim), total)
    ref = x.double().sum(dim)
    biggest = float(x.double().abs().max())
    tol = 1e-6 if dtype == torch.float32 else 1e-13
    assert bool(((total.double() - ref).abs() <= tol * (ref.abs() + biggest)).all())


def test_nonfinite_values_follow_ieee():
    a = torch.tensor([[1.0, math.inf, 0.0], [2.0, 3.0, math.nan], [-math.inf, 1.0, 1.0]])
    b = torch.tensor([[1.0, 2.0], [0.0, 1.0], [3.0, -1.0]])
    out, ref = exact_matmul(a, b), a.double() @ b.double()
    assert torch.equal(out.isnan(), ref.isnan())
    assert torch.equal(torch.nan_to_num(out.double(), 7.0), torch.nan_to_num(ref, 7.0))
    x = torch.tensor([[1.0, math.inf, -math.inf], [math.nan, 1.0, 2.0], [1.0, 2.0, math.inf]])
    s, r = exact_sum(x, (1,)), x.double().sum(1)
    assert torch.equal(s.isnan(), r.isnan()) and s[2] == math.inf
    s, r = exact_sum(x, (0,)), x.double().sum(0)  # over the leading dimension: column sums
    assert torch.equal(s.isnan(), r.isnan()) and s[1] == math.inf
    assert same_bits(*both(lambda: exact_sum(x, (0,))))


@EXAMPLES
@given(
    rows=st.integers(1, 6),
    inner=st.integers(1, 9),
    cols=st.integers(1, 6),
    dtype=st.sampled_from([torch.float32, torch.float64]),
    spoil=st.sampled_from([None, math.inf, math.nan]),
)
def test_a_repeated_operand_gives_exact_matmuls_bits(rows, inner, cols, dtype, spoil):
    torch.manual_seed(rows * 100 + inner * 10 + cols)
    weight = torch.randn(inner, cols, dtype=dtype) * 10.0
    right, left = Repeated(weight, dtype, "right"), Repeated(weight.t(), dtype, "left")
    for step in range(3):
        a = torch.randn(rows, inner, dtype=dtype) * 10.0**step
        if spoil is not None and step == 1:
            a[0, 0] = spoil
        assert same_bits(right(a), exact_matmul(a, weight, dtype))
        assert same_bits(left(a.t()), exact_matmul(weight.t(), a.t(), dtype))


@pytest.mark.parametrize("side", ["left", "right"])
def test_a_repeated_operand_that_is_not_finite_falls_back_to_the_whole_product(side):
    weight = torch.randn(4, 4)
    weight[1, 2] = math.inf
    other = torch.randn(4, 4)
    repeated = Repeated(weight, torch.float32, side)
    got = repeated(other)
    want = exact_matmul(other, weight) if side == "right" else exact_matmul(weight, other)
    assert same_bits(got, want)


def test_a_float64_product_of_one_term_is_the_ieee_product():
    """An inner dimension of one: each output of a float64 product is its one product, which
    IEEE multiplication rounds once (a univariate series' input projection, a rank-one update),
    batched too; a float32 result keeps the sliced route."""
    g = gen(12)
    for a_shape, b_shape in [((97, 1), (1, 204)), ((3, 5, 1), (3, 1, 4)), ((2, 1), (1, 1))]:
        a = torch.randn(*a_shape, generator=g, dtype=F64) * 1e150
        b = torch.randn(*b_shape, generator=g, dtype=F64) * 1e-160
        assert same_bits(exact_matmul(a, b), a * b)
    a, b = torch.tensor([[math.inf], [0.0]], dtype=F64), torch.tensor([[0.0, 2.0]], dtype=F64)
    assert torch.equal(exact_matmul(a, b).isnan(), (a * b).isnan())
    f = torch.randn(4, 1, generator=g)
    assert exact_matmul(f, f.t(), torch.float32).dtype == torch.float32


def test_an_exact_zero_is_positive_whatever_the_kernel_or_route():
    """ZERO_SIGN: a sum of products that is exactly zero is +0, on the compiled route and the
    torch one, for shapes that send BLAS to different kernels (which start their sums from +0
    or from the first product): products of negative values and zeros, batched or not, an inner
    dimension of one or more; and the sums and running sums of negative zeros. (A float64
    product's zeros take the signs its order gives: test_ordered.py.)"""
    from twice.portable import native
    from twice.portable.arithmetic.exact import exact_cumsum

    for batch, m, k, n in [((), 16, 1, 16), ((1,), 32, 1, 32), ((1,), 64, 1, 64), ((2,), 5, 3, 7),
                           ((), 97, 51, 4), ((3,), 1, 1, 1)]:  # fmt: skip
        a = -torch.rand(*batch, m, k, dtype=torch.float64) - 0.5
        b = torch.zeros(*batch, k, n, dtype=torch.float64)
        for out, precision in ((torch.float32, None),):
            for route in ("compiled", "torch"):
                if route == "torch":
                    with native.fallback():
                        got = exact_matmul(a, b, out, precision)
                else:
                    got = exact_matmul(a, b, out, precision)
                assert not got.signbit().any(), (batch, m, k, n, out, precision, route)
    zeros = -torch.zeros(4, 6, dtype=torch.float64)
    for route in ("compiled", "torch"):
        if route == "torch":
            with native.fallback():
                sums, running = exact_sum(zeros, (1,)), exact_cumsum(zeros, 1)
        else:
            sums, running = exact_sum(zeros, (1,)), exact_cumsum(zeros, 1)
        assert not sums.signbit().any() and not running.signbit().any(), route


def test_values_near_the_subnormal_range_never_give_nan():
    """A float64 row whose largest magnitude is near 2**-1022 cuts slices on grids below the
    smallest subnormal (a unit of 0) or without an exact inverse: those hold nothing or are cut
    by division, never 0 / 0, on the compiled route and the torch one alike, for sums, running
    sums and products."""
    from twice.portable import native
    from twice.portable.arithmetic.exact import exact_cumsum

    tiny = torch.tensor(
        [[1e-300, -2e-300, 5e-310], [-5.4449521527805944e-269, 0.0, 3e-269]], dtype=torch.float64
    )
    ones = torch.ones(3, 2, dtype=torch.float64)
    results = {}
    for route in ("compiled", "torch"):
        if route == "torch":
            with native.fallback():
                results[route] = (exact_sum(tiny, (1,)), exact_cumsum(tiny, 1),
                                  exact_matmul(tiny, ones))  # fmt: skip
        else:
            results[route] = (exact_sum(tiny, (1,)), exact_cumsum(tiny, 1),
                              exact_matmul(tiny, ones))  # fmt: skip
        for got in results[route]:
            assert not got.isnan().any(), route
        sums = results[route][0]
        assert (
            sums[0].item() == -1e-300 + 5e-310
            and sums[1].item() == -5.4449521527805944e-269 + 3e-269
        )
    for compiled, plain in zip(results["compiled"], results["torch"]):
        assert same_bits(compiled, plain)


def _exact_value(a_row, b_col) -> float:
    """The float64 the exact sum of products rounds to (Python's integer division rounds once,
    into the subnormal range too), the infinity where it overflows."""
    from fractions import Fraction

    total = sum((Fraction(x) * Fraction(y) for x, y in zip(a_row, b_col)), Fraction(0))
    try:
        return float(total)
    except OverflowError:
        return math.copysign(math.inf, total)


@pytest.mark.parametrize("route", ["compiled", "torch"])
def test_products_are_rounded_once_at_any_range(route):
    """SCALE (arithmetic/scaling.py): operands whose units' product overflows or underflows the
    double range give the exactly rounded result, on every route (the compiled kernels, the
    torch steps, transposed and batched operands, a float32 result): 0 where the exact sum is 0
    (not 0 * inf = NaN), the infinity, the subnormal rounded once. Rows are small integers times
    powers of two that a slice holds exactly, so the sliced result is the exact one. A float64
    result is ordered.py's loop, at any range too."""
    from twice.portable import native

    g = gen(17)

    def draw(batch, rows, cols, exponents, dim):
        m = torch.randint(-(2**10), 2**10, (*batch, rows, cols), generator=g).to(F64)
        m[..., 0, 0] = 0.0
        spread = torch.randint(0, 10, m.shape, generator=g)
        return m * scaling.pow2(exponents.unsqueeze(dim) + spread)

    from twice.portable.arithmetic import scaling

    for index in range(30):
        batch = [2] if index % 3 == 0 else []
        m, k, n = (int(v) for v in torch.randint(1, 7, (3,), generator=g))
        k += 1  # one term is the IEEE product (-0 where it gives -0): test_..._one_term
        target = torch.randint(-1200, 1100, (1,), generator=g)  # the units' exponents' sum
        ea = torch.randint(-980, 990, (*batch, m), generator=g)
        ea = torch.clamp(ea, (target - 990).item(), (target + 980).item())
        a = draw(batch, m, k, ea, -1)
        b = draw(batch, k, n, torch.clamp(target - ea.amax(), -980, 990).expand(*batch, n), -2)
        if index % 2:
            b = b.transpose(-1, -2).contiguous().transpose(-1, -2)
        rows_a, cols_b = a.reshape(-1, m, k), b.reshape(-1, k, n)
        want = torch.tensor(
            [[[_exact_value(ra[i].tolist(), cb[:, j].tolist()) for j in range(n)]
              for i in range(m)] for ra, cb in zip(rows_a, cols_b)], dtype=F64,
        ).reshape(*batch, m, n)  # fmt: skip
        context = native.fallback() if route == "torch" else contextlib.nullcontext()
        with context:
            got64, got32 = exact_matmul(a, b, F64, F64), exact_matmul(a, b, torch.float32)
        assert same_bits(got64, ordered_loop(a, b)), (index, a.shape, b.shape, target)
        assert same_bits(got32, want.to(torch.float32)), index


def test_products_of_huge_values_that_cancel_are_zero():
    """[[1e300, 0]] @ [[0], [1e300]] is 0 on every route, not NaN (the units' product is
    beyond the double range); a float64 product's running sum overflows as its order does."""
    from twice.portable import native

    a = torch.tensor([[1e300, 0.0], [1e300, 1e300]], dtype=F64)
    b = torch.tensor([[0.0, 1e300], [1e300, -1e300]], dtype=F64)
    for context in (contextlib.nullcontext(), native.fallback()):
        with context:
            got = exact_matmul(a, b, torch.float32)
            assert got[0, 0].item() == 0.0 and not got[0, 0].signbit()
            assert got[1, 1].item() == 0.0 and got[0, 1].item() == math.inf
            ordered = exact_matmul(a, b, F64)
            assert ordered[0, 0].item() == 0.0 and ordered[0, 1].item() == math.inf
            assert ordered[1, 1].isnan()  # 1e600 - 1e600: inf - inf
