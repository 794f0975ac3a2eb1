"""Portable kernels for the special functions (arithmetic/special.py's algorithms) and the
orthogonal polynomials: each evaluated in float64 and rounded once to the result's dtype.

The polynomials run their three-term recurrences up to each element's own degree (the degree is
a tensor: an element stops, frozen, at its own), so a result depends on its x and n alone.
"""

from __future__ import annotations

import math

import torch

from twice.portable.arithmetic import bessel
from twice.portable.arithmetic import elementwise as ew
from twice.portable.arithmetic import special as sp
from twice.portable.dispatch.table import kernel
from twice.portable.ops import functions
from twice.portable.ops.math import floating, inplace, unary

__all__ = ["polynomial"]

_F64 = torch.float64


def _as64(value, like: torch.Tensor | None = None) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.to(_F64)
    device = like.device if like is not None else None
    return torch.tensor(float(value), dtype=_F64, device=device)


def _dtype(*values):
    dtype = torch.result_type(*values)
    return dtype if dtype.is_floating_point else torch.get_default_dtype()


def _entr(x: torch.Tensor) -> torch.Tensor:
    """-x ln x: 0 at 0, -inf below 0."""
    out = -(x * ew.log(x))
    out = torch.where(x == 0, 0.0, out)
    return torch.where(x < 0, -math.inf, torch.where(torch.isnan(x), x, out))


def _sinc(x: torch.Tensor) -> torch.Tensor:
    """sin(pi x) / (pi x), 1 at 0; sin(pi x) with x reduced exactly first."""
    s, _ = sp._sinpi_cospi(x)
    out = s / (x * math.pi)
    out = torch.where(x == 0, 1.0, out)
    return torch.where(torch.isinf(x), 0.0, torch.where(torch.isnan(x), x, out))


_J0_SERIES = [(-1) ** k / math.factorial(2 * k + 1) for k in range(10)]


def _spherical_j0(x: torch.Tensor) -> torch.Tensor:
    """sin(x) / x; below |x| = 1/2 its Taylor series in x^2 (Horner, 10 terms), where the
    quotient would carry sin's relative error near 0 and x = 0 is 0 / 0."""
    small = x.abs() < 0.5
    x2 = torch.where(small, x, 0.0) * torch.where(small, x, 0.0)
    series = torch.full_like(x, _J0_SERIES[-1])
    for c in reversed(_J0_SERIES[:-1]):
        series = series * x2 + c
    out = torch.where(small, series, functions.sin(x) / torch.where(small, 1.0, x))
    return torch.where(torch.isinf(x), 0.0, out)


for _names, _fn in {
    ("lgamma",): sp.lgamma,
    ("digamma",): sp.digamma,
    ("erfinv",): sp.erfinv,
    ("i0",): sp.i0,
    ("sinc",): _sinc,
}.items():
    for _name in _names:
        kernel(f"{_name}.default")(unary(_fn))
        kernel(f"{_name}_.default")(inplace(unary(_fn)))
for _name, _fn in {
    "special_erfcx": sp.erfcx,
    "special_ndtri": sp.ndtri,
    "special_log_ndtr": sp.log_ndtr,
    "special_i0e": sp.i0e,
    "special_i1": sp.i1,
    "special_i1e": sp.i1e,
    "special_modified_bessel_i0": sp.i0,
    "special_modified_bessel_i1": sp.i1,
    "special_entr": _entr,
    "special_spherical_bessel_j0": _spherical_j0,
    **{f"special_{name}": getattr(bessel, name) for name in bessel.__all__[:9]},
}.items():
    kernel(f"{_name}.default")(unary(_fn))
# erfc as 1 - erf loses its digits where erfc is small: the complement computed directly.
kernel("erfc.default")(unary(sp.erfc))
kernel("erfc_.default")(inplace(unary(sp.erfc)))


@kernel("polygamma.default")
def _polygamma(n, x):
    floating(x)
    if not x.is_floating_point():
        x = x.to(torch.get_default_dtype())
    return sp.polygamma(int(n), x.to(_F64)).to(x.dtype)


@kernel("polygamma_.default")
def _polygamma_(self, n):
    return self.copy_(_polygamma(n, self))


@kernel("mvlgamma.default")
def _mvlgamma(x, p):
    """The multivariate log-gamma: p (p-1)/4 ln pi plus ln Gamma(x - i/2) for i < p, added in
    that order (torch refuses x <= (p-1)/2, as here)."""
    floating(x)
    p = int(p)
    if bool((x <= (p - 1) / 2).any()):
        raise ValueError("All elements must be greater than (p-1)/2")
    x64 = x.to(_F64)
    total = torch.full_like(x64, p * (p - 1) / 4 * math.log(math.pi))
    for i in range(p):
        total = total + sp.lgamma(x64 - i / 2)
    return total.to(x.dtype)


kernel("mvlgamma_.default")(inplace(_mvlgamma))


@kernel("special_xlog1py.default", "special_xlog1py.self_scalar", "special_xlog1py.other_scalar")
def _xlog1py(x, y):
    """x ln(1 + y), 0 where x is 0 (unless y is NaN)."""
    floating(x, y)
    like = x if isinstance(x, torch.Tensor) else y
    x64, y64 = _as64(x, like), _as64(y, like)
    out = x64 * ew.log1p(y64)
    return torch.where((x64 == 0) & ~torch.isnan(y64), 0.0, out).to(_dtype(x, y))


@kernel("special_zeta.default", "special_zeta.self_scalar", "special_zeta.other_scalar")
def _zeta(s, q):
    floating(s, q)
    like = s if isinstance(s, torch.Tensor) else q
    return sp.zeta(_as64(s, like), _as64(q, like)).to(_dtype(s, q))


def _incomplete_gamma(function):
    """The kernel of igamma or igammac (both tensors; the result in their promoted dtype)."""

    def run(a, x):
        floating(a, x)
        return function(_as64(a), _as64(x)).to(_dtype(a, x))

    return run


kernel("igamma.default")(_incomplete_gamma(bessel.igamma))
kernel("igamma_.default")(inplace(_incomplete_gamma(bessel.igamma)))
kernel("igammac.default")(_incomplete_gamma(bessel.igammac))
kernel("igammac_.default")(inplace(_incomplete_gamma(bessel.igammac)))


def _recurrence(x, n, first, step):
    """P_n(x) from P_0 = 1, P_1 = first(x) and P_{k+1} = step(k, x, P_k, P_{k-1}), each element
    stopping at its own degree (n truncated to an integer); 0 for n < 0."""
    degree = n.to(torch.int64)
    x, degree = torch.broadcast_tensors(x, degree)
    previous, current = torch.ones_like(x), first(x)
    top = int(degree.max()) if degree.numel() else 0
    for k in range(1, top):
        going = degree > k
        following = step(k, x, current, previous)
        previous, current = (
            torch.where(going, current, previous),
            torch.where(going, following, current),
        )
    out = torch.where(degree == 0, 1.0, torch.where(degree >= 1, current, 0.0))
    return torch.where(degree < 0, 0.0, out)


def _chebyshev(first):
    return lambda x, n: _recurrence(x, n, first, lambda k, x, p, q: (x + x) * p - q)


_POLYNOMIALS = {
    "chebyshev_polynomial_t": _chebyshev(lambda x: x),
    "chebyshev_polynomial_u": _chebyshev(lambda x: x + x),
    "chebyshev_polynomial_v": _chebyshev(lambda x: (x + x) - 1.0),
    "chebyshev_polynomial_w": _chebyshev(lambda x: (x + x) + 1.0),
    "hermite_polynomial_h": lambda x, n: _recurrence(
        x, n, lambda x: x + x, lambda k, x, p, q: (x + x) * p - q * (2.0 * k)
    ),
    "hermite_polynomial_he": lambda x, n: _recurrence(
        x, n, lambda x: x.clone(), lambda k, x, p, q: x * p - q * float(k)
    ),
    "laguerre_polynomial_l": lambda x, n: _recurrence(
        x,
        n,
        lambda x: 1.0 - x,
        lambda k, x, p, q: ((((2.0 * k) + 1.0) - x) * p - q * float(k)) / (k + 1.0),
    ),
    "legendre_polynomial_p": lambda x, n: _recurrence(
        x,
        n,
        lambda x: x.clone(),
        lambda k, x, p, q: (((2.0 * k + 1.0) * x) * p - q * k) / (k + 1.0),
    ),
}
for _kind in ("t", "u", "v", "w"):
    _chebyshev_of = _POLYNOMIALS[f"chebyshev_polynomial_{_kind}"]
    _POLYNOMIALS[f"shifted_chebyshev_polynomial_{_kind}"] = lambda x, n, _of=_chebyshev_of: _of(
        (x + x) - 1.0, n
    )


def polynomial(name: str):
    """The kernel of torch.special's `name`(x, n), for its three overloads."""
    evaluate = _POLYNOMIALS[name]

    def run(x, n):
        floating(x, n)
        like = x if isinstance(x, torch.Tensor) else n
        return evaluate(_as64(x, like), _as64(n, like)).to(_dtype(x, n))

    return run


for _name in _POLYNOMIALS:
    kernel(f"special_{_name}.default", f"special_{_name}.x_scalar", f"special_{_name}.n_scalar")(
        polynomial(_name)
    )
