"""arithmetic/scaling: an exact product's sum times its units, rounded once at any range: the
two-step route against C's ldexp (correctly rounded), the one multiplication inside the band,
and the compiled scale (csrc/portable.h: scale_by) against the torch one."""

import math

import torch
from hypothesis import example, given
from hypothesis import strategies as st

from twice.portable import native
from twice.portable.arithmetic import scaling
from unit.portable.bits import EXAMPLES, F64, needs_native, same_bits


def _ldexp(t: float, k: int) -> float:
    """C's ldexp (IEEE scaleB, rounded once), overflow given as the infinity."""
    try:
        return math.ldexp(t, k)
    except OverflowError:
        return math.copysign(math.inf, t)


def _doubles(g, count):
    """Generated doubles of every kind: random bit patterns (subnormals and the largest included)
    and small integers, as an exact sum's levels give them."""
    bits = torch.randint(0, 2**62, (count,), generator=g, dtype=torch.int64)
    bits = bits | (torch.randint(0, 2, (count,), generator=g) << 63)
    values = bits.view(F64)
    values = torch.where(torch.isfinite(values), values, 1.0)
    ints = torch.randint(-(2**53) + 1, 2**53, (count,), generator=g, dtype=torch.int64).to(F64)
    return torch.cat(
        [values, ints, torch.tensor([0.0, 1.0, -1.0, 2.0**-1074, 2.0**1023], dtype=F64)]
    )


def test_ldexp_exact_rounds_once_as_c_ldexp():
    g = torch.Generator().manual_seed(1)
    t = _doubles(g, 3000)
    k = torch.randint(-2300, 2300, t.shape, generator=g, dtype=torch.int64)
    got = scaling.ldexp_exact(t, k)
    want = torch.tensor([_ldexp(x, int(e)) for x, e in zip(t.tolist(), k.tolist())], dtype=F64)
    assert same_bits(got, want)


@EXAMPLES
@example(1023, 1023, 0)  # the range's edges, where halves of the units overflowed
@example(-1022, -1022, 0)
@example(1023, -1022, 0)
@given(st.integers(-1022, 1023), st.integers(-1022, 1023), st.integers(0, 2**31))
def test_scaled_is_the_units_product_rounded_once_at_any_range(ka, kb, seed):
    """scaled(t, 2**ka, 2**kb) is t * 2**(ka + kb) rounded once: the one multiplication inside
    the band (the same bits as `wide=False` there), the two steps outside it, an exact zero +0."""
    t = _doubles(torch.Generator().manual_seed(seed), 40)
    t = t + 0.0  # an exact sum's zero is +0 (ZERO_SIGN)
    ua, ub = torch.tensor([2.0**ka], dtype=F64), torch.tensor([2.0**kb], dtype=F64)
    got = scaling.scaled(t, ua, ub)
    want = torch.tensor([_ldexp(x, ka + kb) for x in t.tolist()], dtype=F64)
    assert same_bits(got, want), (ka, kb)
    if -900 <= ka + kb <= 900:  # SAFE_LO, SAFE_HI
        assert same_bits(got, scaling.scaled(t, ua, ub, wide=False))


def test_a_custom_outer_product_scale_is_split_per_output():
    """A form's own scale (a convolution's: the weight's one unit times each sample's) at
    units whose products leave the band one way for one sample and the other way for another."""
    t = torch.tensor([[0.0, 3.0], [5.0, -7.0]], dtype=F64)
    ua = torch.tensor([2.0**700], dtype=F64)
    ub = torch.tensor([2.0**400, 2.0**-1000], dtype=F64)

    def scale(a, b):
        return a.reshape(()) * b.reshape(-1, 1)

    got = scaling.scaled(t, ua, ub, scale)
    want = [[_ldexp(x, 700 + k) for x in row] for row, k in zip(t.tolist(), (400, -1000))]
    assert same_bits(got, torch.tensor(want, dtype=F64))


@needs_native
def test_the_compiled_scale_gives_the_torch_scales_bits():
    """p_scale (scale_by) against scaling.scaled over units on both sides of the band and
    beyond the double range, float64 and float32 results."""
    g = torch.Generator().manual_seed(2)
    for _ in range(20):
        rows, cols = (int(v) for v in torch.randint(1, 9, (2,), generator=g))
        product = torch.randint(-(2**40), 2**40, (rows, cols), generator=g).to(F64)
        product[0, 0] = 0.0
        ka = torch.randint(-1022, 1024, (rows, 1), generator=g)
        kb = torch.randint(-1022, 1024, (1, cols), generator=g)
        ua, ub = scaling.pow2(ka), scaling.pow2(kb)
        for out in (F64, torch.float32):
            fast = native.scaled(product, ua, ub, out)
            assert same_bits(fast, scaling.scaled(product, ua, ub).to(out))


def test_levels_are_added_exactly_within_and_in_order_across():
    """A level's integers are added exactly (their order cannot matter), then the levels in
    order, each times step**level. Below, the first level's 2**53 - 2 met each half of the
    second level separately would round twice to even and stay; met with their exact sum it
    is 2**53 - 1."""
    f64 = lambda v: torch.tensor([v], dtype=torch.float64)  # noqa: E731
    total = scaling.levels_added([[f64(2.0**53 - 2)], [f64(1.0), f64(1.0)]], 0.5)
    assert total.item() == 2.0**53 - 1
    three = scaling.levels_added([[f64(2.0**52)], [f64(3.0), f64(-1.0)], [f64(4.0)]], 0.5)
    assert torch.equal(
        three, scaling.levels_added([[f64(2.0**52)], [f64(-1.0), f64(3.0)], [f64(4.0)]], 0.5)
    )
    assert three.item() == 2.0**52 + 2.0
    zero = scaling.levels_added([[f64(-0.0)], [f64(-0.0)]], 0.5)
    assert zero.item() == 0.0 and not zero.signbit().item()  # ZERO_SIGN
