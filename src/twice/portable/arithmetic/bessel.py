"""The Bessel functions J, Y and K of order 0 and 1, the Airy function Ai and the regularized
incomplete gamma functions, by twice's own algorithms in float64 (IEEE basic operations and the
elementwise functions of elementwise.py).

Each is one fixed algorithm: a power series (with its logarithmic terms for Y and K) on a short
interval, an integral summed by the trapezoidal rule at fixed nodes, an asymptotic expansion
with a fixed number of terms beyond; the incomplete gamma functions run a fixed number of
series or continued-fraction steps, each element frozen once its own terms stop changing it.
Every coefficient is computed here from exact fractions (the trapezoidal nodes' cosh values
from decimal arithmetic). Accuracy is measured in tests and listed in docs/portable.md.
"""

from __future__ import annotations

import math
from decimal import Decimal, localcontext
from fractions import Fraction

import torch

from twice.portable.arithmetic import elementwise as ew
from twice.portable.arithmetic import special as sp

__all__ = [
    "bessel_j0",
    "bessel_j1",
    "bessel_y0",
    "bessel_y1",
    "modified_bessel_k0",
    "modified_bessel_k1",
    "scaled_modified_bessel_k0",
    "scaled_modified_bessel_k1",
    "airy_ai",
    "igamma",
    "igammac",
]

_INF, _NAN = math.inf, math.nan
_EULER = 0.57721566490153286061  # Euler's constant
_SQRT1_2 = 0.70710678118654752440
_NEAR = 14.0  # J and Y: power series to x = 14, Hankel's expansion beyond


def _sincos(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sin x, cos x) for finite float64 x, from elementwise.quarter_turns."""
    s, c, q = ew.quarter_turns(x)
    sin = torch.where(q == 0, s, torch.where(q == 1, c, torch.where(q == 2, -s, -c)))
    cos = torch.where(q == 0, c, torch.where(q == 1, -s, torch.where(q == 2, -c, s)))
    return sin, cos


def _harmonic(k: int) -> Fraction:
    return sum((Fraction(1, i) for i in range(1, k + 1)), Fraction(0))


def _hankel(order: Fraction, count: int) -> list[float]:
    """a_k = prod_{i<=k} (4 order^2 - (2i-1)^2) / (k! 8^k): the terms of Hankel's expansions."""
    out, a = [], Fraction(1)
    for k in range(count):
        out.append(float(a))
        a = a * (4 * order * order - (2 * k + 1) ** 2) / ((k + 1) * 8)
    return out


_TERMS = 48  # the power series' terms: below 1e-20 of the largest at x = 14
_J0 = [float(Fraction((-1) ** k, math.factorial(k) ** 2)) for k in range(_TERMS)]
_J1 = [float(Fraction((-1) ** k, math.factorial(k) * math.factorial(k + 1))) for k in range(_TERMS)]
# Y0's and K0's series sum H_k z^k / (k!)^2, Y1's and K1's sum (H_k + H_{k+1}) z^k / (k!(k+1)!)
_H0 = [_harmonic(k) / math.factorial(k) ** 2 for k in range(_TERMS)]
_H1 = [
    (_harmonic(k) + _harmonic(k + 1)) / (math.factorial(k) * math.factorial(k + 1))
    for k in range(_TERMS)
]
_Y0 = [float((-1) ** (k + 1) * c) for k, c in enumerate(_H0)]
_Y1 = [float((-1) ** k * c) for k, c in enumerate(_H1)]
_K0 = [float(c) for c in _H0]
_K1 = [float(c) for c in _H1]
_I0 = [float(Fraction(1, math.factorial(k) ** 2)) for k in range(_TERMS)]
_I1 = [float(Fraction(1, math.factorial(k) * math.factorial(k + 1))) for k in range(_TERMS)]
_HANKEL = {order: _hankel(Fraction(order), 28) for order in (0, 1)}


def _hankel_pq(order: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """P = sum (-1)^k a_2k / x^2k and Q = sum (-1)^k a_2k+1 / x^(2k+1), x >= 14 (the smallest
    term, about e^-2x, is below 1e-12 of the first there)."""
    a = _HANKEL[order]
    t = 1.0 / x
    t2 = t * t
    p = ew._horner([(-1) ** k * a[2 * k] for k in range(len(a) // 2)], t2)
    q = t * ew._horner([(-1) ** k * a[2 * k + 1] for k in range(len(a) // 2)], t2)
    return p, q


def _bessel(order: int, x: torch.Tensor, second: bool) -> torch.Tensor:
    """J_order(|x|) (second: Y_order(x)) for x >= 0: power series to 14, Hankel's expansion
    beyond with the phase x - pi/4 (order 1: x - 3 pi/4) from sin x and cos x."""
    a = x.abs()
    near = torch.clamp(a, max=_NEAR)
    z = (near * near) * 0.25
    j = ew._horner(_J0 if order == 0 else _J1, z)
    if order == 1:
        j = j * (near * 0.5)
    if second:
        logged = (ew.log(near * 0.5) + _EULER) * (2.0 / math.pi)
        if order == 0:
            j = logged * j + ew._horner(_Y0, z) * (2.0 / math.pi)
        else:
            series = ew._horner(_Y1, z) * (near * (0.5 / math.pi))
            j = (logged * j - series) - (2.0 / math.pi) / near
    far = torch.clamp(a, min=_NEAR)
    p, q = _hankel_pq(order, far)
    s, c = _sincos(far)
    if order == 0:
        cos_phase, sin_phase = (c + s) * _SQRT1_2, (s - c) * _SQRT1_2
    else:
        cos_phase, sin_phase = (s - c) * _SQRT1_2, -(s + c) * _SQRT1_2
    if second:
        wave = p * sin_phase + q * cos_phase
    else:
        wave = p * cos_phase - q * sin_phase
    out = torch.where(a <= _NEAR, j, wave * ew.sqrt((2.0 / math.pi) / far))
    return torch.where(torch.isfinite(x), out, _NAN)


def bessel_j0(x: torch.Tensor) -> torch.Tensor:
    """J_0(x), even; NaN at +-inf (as torch's)."""
    return _bessel(0, x, second=False)


def bessel_j1(x: torch.Tensor) -> torch.Tensor:
    """J_1(x), odd (the sign of a zero kept)."""
    out = _bessel(1, x, second=False)
    return torch.where(x < 0, -out, torch.where(x == 0, x, out))


def _second_kind(order: int, x: torch.Tensor) -> torch.Tensor:
    out = _bessel(order, torch.where(x > 0, x, 1.0), second=True)
    out = torch.where(x == 0, -_INF, out)
    return torch.where((x < 0) | torch.isnan(x), _NAN, out)


def bessel_y0(x: torch.Tensor) -> torch.Tensor:
    """Y_0(x) for x > 0: -inf at 0, NaN below."""
    return _second_kind(0, x)


def bessel_y1(x: torch.Tensor) -> torch.Tensor:
    """Y_1(x) for x > 0: -inf at 0, NaN below."""
    return _second_kind(1, x)


def _cosh_decimal(t: Fraction) -> float:
    with localcontext() as context:
        context.prec = 40
        e = (Decimal(t.numerator) / Decimal(t.denominator)).exp()
        return float((e + 1 / e) / 2)


# e^x K_nu(x) = integral_0^inf e^(-x (cosh t - 1)) cosh(nu t) dt, summed by the trapezoidal
# rule with step 1/10 to t = 4.5 (the integrand is below e^-80 beyond there for x >= 2; the
# rule's error falls like e^(-2 pi d / h) with d the strip the integrand is bounded in).
_STEP = Fraction(1, 10)
_NODES = [_STEP * n for n in range(46)]
_COSH_MINUS_1 = [_cosh_decimal(t) - 1.0 for t in _NODES]
_WEIGHT = {
    nu: [
        float(_STEP) * (0.5 if n == 0 else 1.0) * _cosh_decimal(nu * t)
        for n, t in enumerate(_NODES)
    ]
    for nu in (Fraction(0), Fraction(1), Fraction(1, 3))
}
_K_FAR = 18.0  # beyond it the asymptotic expansion's smallest term is below e^-36
_K_ASYMPTOTIC = {nu: _hankel(nu, 36) for nu in (Fraction(0), Fraction(1), Fraction(1, 3))}


def _scaled_k_beyond(nu: Fraction, x: torch.Tensor) -> torch.Tensor:
    """e^x K_nu(x) for x >= 2: the trapezoidal sum to 18, the asymptotic expansion
    sqrt(pi / 2x) sum a_k / x^k beyond."""
    mid = torch.clamp(x, max=_K_FAR)
    total = torch.zeros_like(x)
    for shift, weight in zip(_COSH_MINUS_1, _WEIGHT[nu]):
        total = total + ew.exp(mid * -shift) * weight
    far = torch.clamp(x, min=_K_FAR)
    series = ew._horner(_K_ASYMPTOTIC[nu], 1.0 / far) * ew.sqrt((math.pi * 0.5) / far)
    return torch.where(x <= _K_FAR, total, series)


def _bessel_k(order: int, x: torch.Tensor, scaled: bool) -> torch.Tensor:
    """K_order(x) (times e^x where `scaled`): the series with its logarithm to 2, beyond it
    e^-x times the scaled function; inf at 0, NaN below."""
    near = torch.clamp(torch.where(x > 0, x, 1.0), max=2.0)
    z = (near * near) * 0.25
    logged = ew.log(near * 0.5) + _EULER
    if order == 0:
        series = ew._horner(_K0, z) - logged * ew._horner(_I0, z)
    else:
        half = near * 0.5
        series = (1.0 / near + logged * (ew._horner(_I1, z) * half)) - (
            ew._horner(_K1, z) * (half * 0.5)
        )
    if scaled:
        series = series * ew.exp(near)
    beyond = torch.clamp(x, min=2.0)
    far = _scaled_k_beyond(Fraction(order), beyond)
    if not scaled:
        far = far * ew.exp(-beyond)
    out = torch.where(x <= 2.0, series, far)
    out = torch.where(x == _INF, 0.0, torch.where(x == 0, _INF, out))
    return torch.where((x < 0) | torch.isnan(x), _NAN, out)


def modified_bessel_k0(x: torch.Tensor) -> torch.Tensor:
    """K_0(x) for x > 0."""
    return _bessel_k(0, x, scaled=False)


def modified_bessel_k1(x: torch.Tensor) -> torch.Tensor:
    """K_1(x) for x > 0."""
    return _bessel_k(1, x, scaled=False)


def scaled_modified_bessel_k0(x: torch.Tensor) -> torch.Tensor:
    """e^x K_0(x) for x > 0."""
    return _bessel_k(0, x, scaled=True)


def scaled_modified_bessel_k1(x: torch.Tensor) -> torch.Tensor:
    """e^x K_1(x) for x > 0."""
    return _bessel_k(1, x, scaled=True)


# Ai(x) = c1 f(x) - c2 g(x) with f = sum 1*4*...*(3k-2) x^3k / (3k)!,
# g = sum 2*5*...*(3k-1) x^(3k+1) / (3k+1)!: from x = -8 to 2 (the alternating terms' largest is
# about e^15 below -8, where the asymptotic expansion takes over)
_AI_0, _AI_PRIME_0 = 0.35502805388781723926, 0.25881940379280679840  # Ai(0), -Ai'(0)
_AI_F = [float(Fraction(math.prod(range(1, 3 * k, 3)), math.factorial(3 * k))) for k in range(40)]
_AI_G = [
    float(Fraction(math.prod(range(2, 3 * k, 3)), math.factorial(3 * k + 1))) for k in range(40)
]
_THIRD = Fraction(1, 3)
_AI_HANKEL = _hankel(_THIRD, 28)


def airy_ai(x: torch.Tensor) -> torch.Tensor:
    """Ai(x): its Maclaurin series on [-8, 2]; above, sqrt(x/3) K_1/3(zeta) / pi with
    zeta = 2/3 x^(3/2); below, the oscillating asymptotic expansion with the phase zeta + pi/4.
    NaN at +-inf (as torch's)."""
    near = torch.clamp(x, -8.0, 2.0)
    cube = near * near * near
    series = ew._horner(_AI_F, cube) * _AI_0 - (ew._horner(_AI_G, cube) * near) * _AI_PRIME_0
    above = torch.clamp(x, min=2.0)
    root = ew.sqrt(above)
    zeta = (above * root) * (2.0 / 3.0)
    decay = _scaled_k_beyond(_THIRD, zeta) * ew.exp(-zeta)
    right = (decay * ew.sqrt(above * (1.0 / 3.0))) * (1.0 / math.pi)
    below = torch.clamp(-x, min=8.0)
    root = ew.sqrt(below)
    zeta = (below * root) * (2.0 / 3.0)
    t = 1.0 / zeta
    t2 = t * t
    p = ew._horner([(-1) ** k * _AI_HANKEL[2 * k] for k in range(14)], t2)
    q = t * ew._horner([(-1) ** k * _AI_HANKEL[2 * k + 1] for k in range(14)], t2)
    s, c = _sincos(zeta)
    wave = (p * (s + c) + q * (c - s)) * _SQRT1_2
    left = wave / (ew.sqrt(root) * math.sqrt(math.pi))
    out = torch.where(x > 2.0, right, torch.where(x < -8.0, left, series))
    return torch.where(torch.isfinite(x), out, _NAN)


_EPSILON = 2.0**-53
_GAMMA_STEPS = 2000  # enough for a up to about 5e4 near x = a (the series needs ~ 9 sqrt(a))
_TINY = 1e-300


def _gamma_prefactor(a: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """x^a e^-x / Gamma(a), through its logarithm."""
    return ew.exp((a * ew.log(x) - x) - sp.lgamma(a))


def _lower_series(a: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """P(a, x) = x^a e^-x / Gamma(a) sum x^n / (a (a+1) ... (a+n)), for x < a + 1; each element
    frozen once its term no longer changes its sum."""
    term = 1.0 / a
    total, going = term, torch.ones_like(a, dtype=torch.bool)
    for n in range(1, _GAMMA_STEPS + 1):
        term = term * (x / (a + float(n)))
        following = total + term
        going = going & (term > total * _EPSILON)
        total = torch.where(going, following, total)
        if n % 64 == 0 and not bool(going.any()):
            break  # every element frozen: the remaining steps would change nothing
    return total * _gamma_prefactor(a, x)


def _upper_fraction(a: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Q(a, x) by Legendre's continued fraction, evaluated by the modified Lentz method, for
    x >= a + 1; each element frozen once a step changes it by less than an ulp."""
    b = (x + 1.0) - a
    c = torch.full_like(a, 1.0 / _TINY)
    d = 1.0 / b
    h, going = d, torch.ones_like(a, dtype=torch.bool)
    for i in range(1, _GAMMA_STEPS + 1):
        an = (a - float(i)) * float(i)
        b = b + 2.0
        d = an * d + b
        d = torch.where(d.abs() < _TINY, _TINY, d)
        c = b + an / c
        c = torch.where(c.abs() < _TINY, _TINY, c)
        d = 1.0 / d
        step = d * c
        h = torch.where(going, h * step, h)
        going = going & ((step - 1.0).abs() >= _EPSILON)
        if i % 64 == 0 and not bool(going.any()):
            break  # every element frozen: the remaining steps would change nothing
    return h * _gamma_prefactor(a, x)


def _incomplete_gamma(a: torch.Tensor, x: torch.Tensor, upper: bool) -> torch.Tensor:
    """P(a, x) (upper: Q = 1 - P): the series below x = a + 1, the continued fraction from
    there, the other one as its complement; torch's special cases at 0, inf and below 0."""
    a, x = torch.broadcast_tensors(a, x)
    regular = (a > 0) & (x > 0) & torch.isfinite(a) & torch.isfinite(x)
    low = x < a + 1.0
    a_low, x_low = torch.where(regular & low, a, 1.0), torch.where(regular & low, x, 0.5)
    a_high, x_high = torch.where(regular & ~low, a, 1.0), torch.where(regular & ~low, x, 2.0)
    p = _lower_series(a_low, x_low)
    q = _upper_fraction(a_high, x_high)
    if upper:
        out, at_zero, at_inf = torch.where(low, 1.0 - p, q), 1.0, 0.0
    else:
        out, at_zero, at_inf = torch.where(low, p, 1.0 - q), 0.0, 1.0
    out = torch.where(x == _INF, at_inf, out)
    out = torch.where(a == _INF, torch.where(x == _INF, _NAN, at_zero), out)
    out = torch.where(x == 0, at_zero, out)
    out = torch.where(a == 0, torch.where(x > 0, at_inf, _NAN), out)
    bad = (a < 0) | (x < 0) | torch.isnan(a) | torch.isnan(x)
    return torch.where(bad, _NAN, out)


def igamma(a: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The regularized lower incomplete gamma function P(a, x)."""
    return _incomplete_gamma(a, x, upper=False)


def igammac(a: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The regularized upper incomplete gamma function Q(a, x)."""
    return _incomplete_gamma(a, x, upper=True)
