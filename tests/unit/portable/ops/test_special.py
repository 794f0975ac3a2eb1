"""The special functions' and polynomials' kernels under portable mode: their values agree with
torch's to float32's precision, and a polynomial stops at each element's own degree."""

import pytest
import torch

from twice.portable.dispatch.mode import PortableMode
from twice.portable.ops import special

G = torch.Generator().manual_seed(3)
X = torch.rand(200, generator=G) * 1.8 - 0.9


# (the function, its input made from X in float32 first, so both sides see the same numbers)
CASES = [
    (torch.lgamma, X * 10),
    (torch.digamma, X * 10),
    (lambda x: torch.polygamma(2, x), X + 1.5),
    (torch.erfinv, X),
    (torch.special.erfcx, X * 8),
    (torch.special.ndtri, X.abs()),
    (torch.special.log_ndtr, X * 10),
    (torch.special.i0e, X * 50),
    (torch.special.i1, X * 5),
    (lambda x: torch.special.zeta(x + 3, x.abs() + 0.5), X),
    (lambda x: torch.special.xlog1py(x, x.abs()), X),
    (torch.special.entr, X.abs()),
    (torch.sinc, X * 4),
    (lambda x: torch.mvlgamma(x, 3), X.abs() + 3),
    (lambda x: torch.special.chebyshev_polynomial_t(x, 7), X),
    (lambda x: torch.special.hermite_polynomial_h(x, torch.arange(200) % 9), X),
    (lambda x: torch.special.legendre_polynomial_p(x, 5.0), X),
    (lambda x: torch.special.laguerre_polynomial_l(x, 4), X * 3),
    (lambda x: torch.special.shifted_chebyshev_polynomial_w(x, 6), X.abs()),
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_kernels_agree_with_torch_to_float32_precision(case):
    function, x = CASES[case]
    with PortableMode("strict"):
        ours = function(x)
    theirs = function(x.double()).float()
    assert ours.dtype == torch.float32
    finite = torch.isfinite(theirs)
    assert torch.equal(torch.isfinite(ours), finite)
    assert bool(((ours - theirs).abs() <= 1e-6 + 1e-5 * theirs.abs())[finite].all())


def test_a_polynomial_stops_at_each_elements_own_degree():
    evaluate = special.polynomial("chebyshev_polynomial_u")
    x = torch.linspace(-1, 1, 9, dtype=torch.float64)
    n = torch.tensor([0, 1, 2, 3, 11, -1, 4, 0, 20])
    whole = evaluate(x, n)
    alone = torch.cat([evaluate(x[i : i + 1], n[i : i + 1]) for i in range(9)])
    assert torch.equal(whole, alone)
    assert whole[5] == 0 and whole[0] == 1 and whole[-1] == 21  # U_n(1) = n + 1


def test_erfc_keeps_its_digits_where_it_is_small():
    with PortableMode("strict"):
        small = torch.erfc(torch.tensor([5.0, 9.0], dtype=torch.float64))
    expected = torch.tensor([1.5374597944280349e-12, 4.1370317465138102e-37], dtype=torch.float64)
    assert bool(((small - expected).abs() <= 1e-14 * expected).all())


def test_spherical_bessel_j0_matches_scipy_in_float64_to_a_few_ulps():
    scipy_special = pytest.importorskip("scipy.special")
    x = torch.cat([torch.linspace(-60, 60, 4001, dtype=torch.float64), torch.tensor([0.0, 0.5])])
    with PortableMode("strict"):
        got = torch.special.spherical_bessel_j0(x)
        ends = torch.special.spherical_bessel_j0(torch.tensor([float("inf"), float("nan")]))
    ref = torch.from_numpy(scipy_special.spherical_jn(0, x.numpy()))
    assert (got - ref).abs().max() <= 1e-15
    assert ends[0] == 0 and ends[1].isnan()
