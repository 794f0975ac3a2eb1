"""The special functions' algorithms: accurate to the figures docs/portable.md gives (against
SciPy in float64), torch's special cases, and each element's result its own alone."""

import math

import numpy as np
import pytest
import torch
from scipy import special as scipy_special

from twice.portable.arithmetic import special

RNG = np.random.default_rng(7)
WIDE = np.concatenate(
    [RNG.uniform(-20, 20, 4000), RNG.uniform(0, 3, 1000), 10 ** RNG.uniform(-300, 2, 500)]
)
POSITIVE = np.concatenate([RNG.uniform(0, 40, 4000), 10 ** RNG.uniform(-300, 2, 500)])
UNIT = np.concatenate(
    [
        RNG.uniform(-1, 1, 4000),
        1 - 10 ** RNG.uniform(-16, 0, 500),
        -1 + 10 ** RNG.uniform(-16, 0, 500),
    ]
)
PROBABILITY = np.concatenate([RNG.uniform(0, 1, 4000), 10 ** RNG.uniform(-300, 0, 500)])

# (function, reference, inputs, the largest error relative to |reference| + 1e-300, plus an
# absolute allowance where the function crosses zero)
CASES = {
    "lgamma": (special.lgamma, scipy_special.gammaln, WIDE, 1e-13, 1e-14),
    "digamma": (special.digamma, scipy_special.digamma, WIDE, 1e-13, 1e-14),
    "trigamma": (special.trigamma, lambda x: scipy_special.polygamma(1, x), WIDE, 1e-12, 0),
    "polygamma3": (
        lambda t: special.polygamma(3, t),
        lambda x: scipy_special.polygamma(3, x),
        POSITIVE,
        1e-13,
        0,
    ),
    "i0": (special.i0, scipy_special.i0, WIDE, 1e-14, 0),
    "i0e": (special.i0e, scipy_special.i0e, WIDE, 1e-14, 0),
    "i1": (special.i1, scipy_special.i1, WIDE, 1e-14, 0),
    "i1e": (special.i1e, scipy_special.i1e, WIDE, 1e-14, 0),
    "erfcx": (special.erfcx, scipy_special.erfcx, WIDE, 1e-14, 0),
    "erfc": (special.erfc, scipy_special.erfc, WIDE, 1e-13, 0),
    "log_ndtr": (special.log_ndtr, scipy_special.log_ndtr, WIDE, 1e-12, 0),
    "erfinv": (special.erfinv, scipy_special.erfinv, UNIT, 1e-14, 0),
    "ndtri": (special.ndtri, scipy_special.ndtri, PROBABILITY, 1e-14, 0),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_function_is_as_accurate_as_documented(name):
    function, reference, x, relative, absolute = CASES[name]
    ours = function(torch.from_numpy(x)).numpy()
    expected = reference(x)
    finite = np.isfinite(expected)
    assert np.array_equal(np.isfinite(ours), finite)
    error = np.abs(ours[finite] - expected[finite])
    assert np.all(error <= relative * np.abs(expected[finite]) + absolute), float(error.max())


def test_the_hurwitz_zeta_function_matches_scipy_and_torchs_cases():
    s = RNG.uniform(1.01, 30, 3000)
    q = np.concatenate([RNG.uniform(0.01, 50, 2000), RNG.uniform(-20, 0, 1000)])
    s[2000:] = np.round(s[2000:])  # q <= 0 is defined for an integer s only
    ours = special.zeta(torch.from_numpy(s), torch.from_numpy(q)).numpy()
    expected = scipy_special.zeta(s, q)
    finite = np.isfinite(expected)
    assert np.all(np.abs(ours[finite] - expected[finite]) <= 1e-13 * np.abs(expected[finite]))
    cases = special.zeta(
        torch.tensor([1.0, 0.5, 2.0, 2.0, 2.5], dtype=torch.float64),
        torch.tensor([1.0, 1.0, 0.0, -1.0, -1.5], dtype=torch.float64),
    )
    assert cases.tolist()[:4] == [
        math.inf,
        pytest.approx(math.nan, nan_ok=True),
        math.inf,
        math.inf,
    ]
    assert math.isnan(cases[4])


def test_torchs_special_values_are_kept():
    t = lambda *v: torch.tensor(v, dtype=torch.float64)  # noqa: E731
    inf = math.inf
    assert special.digamma(t(0.0, -0.0, inf)).tolist() == [-inf, inf, inf]
    assert special.digamma(t(-1.0, -inf)).isnan().all()
    assert special.lgamma(t(0.0, -1.0, -inf, inf)).tolist() == [inf] * 4
    assert special.erfinv(t(1.0, -1.0)).tolist() == [inf, -inf]
    assert special.erfinv(t(1.5, math.nan)).isnan().all()
    assert torch.signbit(special.erfinv(t(-0.0)))
    assert special.ndtri(t(0.0, 1.0)).tolist() == [-inf, inf]
    assert special.log_ndtr(t(-inf)).tolist() == [-inf]


@pytest.mark.parametrize(
    "function",
    [special.lgamma, special.digamma, special.erfinv, special.i0, lambda x: special.zeta(x + 3, x)],
)
def test_an_elements_bits_do_not_depend_on_the_others(function):
    x = torch.from_numpy(RNG.uniform(-0.99, 0.99, 64) * 30).to(torch.float64)
    x[::7] = -x[::7] * 2  # zeta's shift loop runs longer for the most negative q
    whole = function(x)
    for i in (0, 7, 13, 63):
        alone = function(x[i : i + 1])
        assert torch.equal(whole[i : i + 1].view(torch.int64), alone.view(torch.int64))


def test_zetas_terms_stop_at_each_elements_own_q_whatever_the_batch():
    s = torch.tensor([2.0, 2.0, 3.0], dtype=torch.float64)
    q = torch.tensor([-0.4598, -6.0, -0.999], dtype=torch.float64)
    whole = special.zeta(s, q)
    for i in (0, 2):
        assert torch.equal(whole[i : i + 1], special.zeta(s[i : i + 1], q[i : i + 1]))
