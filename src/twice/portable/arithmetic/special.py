"""Special functions by twice's own algorithms, in float64 from IEEE basic operations and the
elementwise functions (elementwise.py): the gamma family, the Hurwitz zeta function, the error
function's inverse and its scaled complement, and the modified Bessel functions of order 0 and 1.

Each is one fixed algorithm (an argument shift or reflection, then a series or an asymptotic
expansion with a fixed number of terms; Newton steps a fixed number of times), with no step
that depends on the machine or on the other elements of the tensor: a loop whose length depends
on the data (the zeta function's shift) freezes each element once it is done. Every coefficient
is computed here from exact fractions. Accuracy is measured in tests and listed in
docs/portable.md.
"""

from __future__ import annotations

import math
from fractions import Fraction

import torch

from twice.portable.arithmetic import elementwise as ew
from twice.portable.arithmetic.coefficients import COS_TAYLOR, ERFCX_1_6, SIN_TAYLOR

__all__ = [
    "lgamma",
    "digamma",
    "trigamma",
    "zeta",
    "polygamma",
    "erfc",
    "erfcx",
    "erfinv",
    "ndtri",
    "log_ndtr",
    "i0",
    "i0e",
    "i1",
    "i1e",
]

_INF, _NAN = math.inf, math.nan
_HALF_LOG_2PI = 0.91893853320467274178  # ln(2 pi) / 2
_SQRT_PI = 1.77245385090551602730
_SQRT2 = 1.41421356237309504880
_SHIFT = 8.0  # the gamma family's asymptotic series are summed at x >= 8


def _bernoulli(count: int) -> list[Fraction]:
    """B_0 .. B_{count-1} (B_1 = -1/2), by the recurrence sum C(m+1, k) B_k = 0."""
    b = [Fraction(1)]
    for m in range(1, count):
        b.append(-sum(math.comb(m + 1, k) * b[k] for k in range(m)) / (m + 1))
    return b


_B = _bernoulli(32)
# ln Gamma(y) = (y - 1/2) ln y - y + ln(2 pi)/2 + sum B_2k / (2k (2k-1) y^(2k-1))
_STIRLING = [float(_B[2 * k] / (2 * k * (2 * k - 1))) for k in range(1, 12)]
# psi(y) = ln y - 1/(2y) - sum B_2k / (2k y^2k)
_DIGAMMA = [float(_B[2 * k] / (2 * k)) for k in range(1, 12)]
# zeta's Euler-Maclaurin tail: B_2j / (2j)!
_ZETA_MAX_SHIFT = 2**16  # q below -65526: the sum stops short (torch's loop goes on)
_ZETA_TAIL = [float(_B[2 * j] / math.factorial(2 * j)) for j in range(1, 13)]


def _sinpi_cospi(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sin(pi x), cos(pi x)): x reduced exactly to t in [0, 1/4] (x - 2 round(x / 2), then
    1 - a and 1/2 - a, each exact), then the Taylor series of sin(pi t) and cos(pi t)."""
    r = x - torch.round(x * 0.5) * 2.0
    a = r.abs()
    flip = a > 0.5
    a = torch.where(flip, 1.0 - a, a)
    swap = a > 0.25
    angle = torch.where(swap, 0.5 - a, a) * math.pi
    z = angle * angle
    s, c = angle * ew._horner(SIN_TAYLOR, z), ew._horner(COS_TAYLOR, z)
    sin, cos = torch.where(swap, c, s), torch.where(swap, s, c)
    return torch.where(r < 0, -sin, sin), torch.where(flip, -cos, cos)


def _shifted(x: torch.Tensor):
    """(y, product, reciprocals): y = x + n >= 8 for x > 0, the product x (x+1) ... (x+n-1)
    and the sum 1/x + ... + 1/(x+n-1), each in ascending order."""
    y, product, reciprocals = x, torch.ones_like(x), torch.zeros_like(x)
    for _ in range(int(_SHIFT)):
        low = y < _SHIFT
        product = torch.where(low, product * y, product)
        reciprocals = torch.where(low, reciprocals + 1.0 / y, reciprocals)
        y = torch.where(low, y + 1.0, y)
    return y, product, reciprocals


def _lgamma_positive(x: torch.Tensor) -> torch.Tensor:
    y, product, _ = _shifted(x)
    r = 1.0 / y
    series = r * ew._horner(_STIRLING, r * r)
    stirling = ((y - 0.5) * ew.log(y) - y) + (_HALF_LOG_2PI + series)
    return stirling - ew.log(product)


def lgamma(x: torch.Tensor) -> torch.Tensor:
    """ln |Gamma(x)|: Stirling's series at x + n >= 8; below 0 by reflection,
    ln(pi / |sin(pi x)|) - ln Gamma(1 - x). Poles and infinities give +inf, as torch's."""
    negative = x < 0
    positive = _lgamma_positive(torch.where(negative, 1.0 - x, x))
    s, _ = _sinpi_cospi(x)
    reflected = ew.log(math.pi / s.abs()) - positive
    out = torch.where(negative, reflected, positive)
    out = torch.where(x == 0, _INF, out)
    return torch.where(torch.isinf(x), _INF, out)


def digamma(x: torch.Tensor) -> torch.Tensor:
    """psi(x) = d/dx ln Gamma(x): the asymptotic series at x + n >= 8 less the shift's
    reciprocals; below 0 by reflection, psi(1 - x) - pi / tan(pi x)."""
    negative = x < 0
    z = torch.where(negative, 1.0 - x, x)
    y, _, reciprocals = _shifted(z)
    r = 1.0 / y
    r2 = r * r
    positive = ((ew.log(y) - r * 0.5) - r2 * ew._horner(_DIGAMMA, r2)) - reciprocals
    s, c = _sinpi_cospi(x)
    out = torch.where(negative, positive - (c * math.pi) / s, positive)
    out = torch.where(negative & (torch.round(x) == x), _NAN, out)
    out = torch.where(x == 0, torch.where(torch.signbit(x), _INF, -_INF), out)
    out = torch.where(x == _INF, _INF, out)
    return torch.where(x == -_INF, _NAN, out)


def zeta(s: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """The Hurwitz zeta function sum (q + k)^-s: its terms summed while q + k < 10 (at least
    ten), then the Euler-Maclaurin tail with twelve Bernoulli terms. s == 1 gives inf, s < 1
    NaN; q a non-positive integer inf; q <= 0 with s not an integer NaN (torch's cases)."""
    s, q = torch.broadcast_tensors(s, q)
    a, total = q.clone(), torch.zeros_like(q)
    # Each element stops on its own (ten terms, and q + k >= 10): the loop runs until the
    # element that needs the most terms has them, so no element's sum depends on the others.
    finite = q[torch.isfinite(q)]
    lowest = float(finite.min()) if finite.numel() else 10.0
    for k in range(max(10, min(_ZETA_MAX_SHIFT, math.ceil(10.0 - lowest)))):
        active = (a < 10.0) | (k < 10)
        total = torch.where(active, total + ew.pow_tensor(a, -s), total)
        a = torch.where(active, a + 1.0, a)
    w = a
    b = ew.pow_tensor(w, -s)
    total = (total + (b * w) / (s - 1.0)) + b * 0.5
    rising, power = torch.ones_like(s), b
    for j, coefficient in enumerate(_ZETA_TAIL):
        rising = rising * (s + 2 * j)
        power = power / w
        total = total + (rising * power) * coefficient
        rising = rising * (s + (2 * j + 1))
        power = power / w
    out = torch.where(q <= 0, torch.where(torch.floor(s) == s, total, _NAN), total)
    out = torch.where((q <= 0) & (torch.floor(q) == q), _INF, out)
    out = torch.where(s < 1, _NAN, out)
    return torch.where(s == 1, _INF, out)


def trigamma(x: torch.Tensor) -> torch.Tensor:
    """psi'(x) = zeta(2, x) for x > 0; below, pi^2 / sin^2(pi x) - psi'(1 - x)."""
    negative = x < 0.5
    positive = zeta(torch.full_like(x, 2.0), torch.where(negative, 1.0 - x, x))
    s, _ = _sinpi_cospi(x)
    return torch.where(negative, (math.pi * math.pi) / (s * s) - positive, positive)


def polygamma(n: int, x: torch.Tensor) -> torch.Tensor:
    """The n-th derivative of digamma: (-1)^(n+1) n! zeta(n + 1, x) for n >= 2."""
    if n == 0:
        return digamma(x)
    if n == 1:
        return trigamma(x)
    sign = 1.0 if n % 2 == 1 else -1.0
    return zeta(torch.full_like(x, float(n + 1)), x) * (sign * math.factorial(n))


# erfcx(x) ~ (1 / (x sqrt(pi))) sum (-1)^k (2k-1)!! / (2 x^2)^k beyond x = 6 (terms fall to
# about 1e-15 of the first by k = 25 there)
_ERFCX_ASYMPTOTIC = [float((-1) ** k * math.prod(range(1, 2 * k, 2))) for k in range(26)]


def _exp_minus_square(x: torch.Tensor) -> torch.Tensor:
    """e^(-x^2) with x^2's rounding error carried (Dekker's product): accurate where x^2 is
    large and a rounded square would cost the result its last digits."""
    t = x * 134217729.0
    high = t - (t - x)
    low = x - high
    square = x * x
    error = ((high * high - square) + (high * low) * 2.0) + low * low
    return ew.exp(-square) * (1.0 - error)


def erfcx(x: torch.Tensor) -> torch.Tensor:
    """e^(x^2) erfc(x): e^(x^2) (1 - erf x) below 1, the fitted polynomial on [1, 6] that erf
    uses, the asymptotic series beyond 6; negative x by 2 e^(x^2) - erfcx(-x)."""
    a = x.abs()
    near = ew.exp(a * a) * (1.0 - ew.erf(torch.clamp(a, max=1.0)))
    mid = ew._horner(list(reversed(ERFCX_1_6)), (torch.clamp(a, 1.0, 6.0) - 3.5) / 2.5)
    r = 1.0 / torch.clamp(a, min=6.0)
    far = (r * (1.0 / _SQRT_PI)) * ew._horner(_ERFCX_ASYMPTOTIC, (r * r) * 0.5)
    positive = torch.where(a < 1.0, near, torch.where(a <= 6.0, mid, far))
    root = ew.exp(x * x * 0.5)
    out = torch.where(x < 0, (root * 2.0) * root - positive, positive)
    return torch.where(torch.isnan(x), x, out)


def erfc(x: torch.Tensor) -> torch.Tensor:
    """1 - erf x without cancellation: e^(-x^2) erfcx(x) from x = 1 on, 2 - erfc(-x) below -1."""
    a = x.abs()
    tail = _exp_minus_square(torch.clamp(a, min=1.0)) * erfcx(torch.clamp(a, min=1.0))
    tail = torch.where(a < 30.0, tail, 0.0)
    out = torch.where(a < 1.0, 1.0 - ew.erf(x), torch.where(x < 0, 2.0 - tail, tail))
    return torch.where(torch.isnan(x), x, out)


def _erfcinv_tail(z: torch.Tensor) -> torch.Tensor:
    """x > 0 with erfc(x) = z for z in (0, 1/2]: Newton's method on ln erfc(x) = ln z, which
    is ln erfcx(x) - x^2 (no underflow down to the least double), six steps from
    sqrt(-ln z)."""
    log_z = ew.log(z)
    x = ew.sqrt(-log_z)
    for _ in range(6):
        scaled = erfcx(x)
        gap = (ew.log(scaled) - x * x) - log_z
        x = x + gap * (scaled * (_SQRT_PI * 0.5))
    return x


def _erfinv_center(y: torch.Tensor) -> torch.Tensor:
    """erfinv for |y| <= 1/2: its series' first terms, then Newton's method on erf (four steps)."""
    t = y * (_SQRT_PI * 0.5)
    x = t * ew._horner([1.0, 1.0 / 3.0, 7.0 / 30.0, 127.0 / 630.0], t * t)
    for _ in range(4):
        x = x - (ew.erf(x) - y) * (ew.exp(x * x) * (_SQRT_PI * 0.5))
    return x


def erfinv(y: torch.Tensor) -> torch.Tensor:
    """The inverse of erf on (-1, 1): Newton's method on erf near 0, on ln erfc beyond |y| = 1/2
    (1 - |y| is exact there). +-1 give +-inf, |y| > 1 NaN; the sign of a zero is kept."""
    a = y.abs()
    center = _erfinv_center(torch.where(a <= 0.5, y, 0.0))
    tail = _erfcinv_tail(torch.where(a > 0.5, 1.0 - a, 0.5).clamp(min=4.9e-324))
    out = torch.where(a <= 0.5, center, torch.where(y < 0, -tail, tail))
    out = torch.where(a == 1.0, torch.where(y < 0, -_INF, _INF), out)
    out = torch.where(y == 0, y, out)
    return torch.where((a > 1.0) | torch.isnan(y), _NAN, out)


def ndtri(p: torch.Tensor) -> torch.Tensor:
    """The standard normal quantile: -sqrt(2) erfcinv(2p) below 1/2, its mirror above."""
    low = p < 0.5
    z = torch.where(low, p * 2.0, (1.0 - p) * 2.0)  # 1 - p is exact from 1/2 up
    x = torch.where(z >= 1.0, 0.0, _erfcinv_tail(torch.clamp(z, 4.9e-324, 1.0)))
    central = _erfinv_center(torch.where((p > 0.25) & (p < 0.75), p * 2.0 - 1.0, 0.0)) * _SQRT2
    out = torch.where(low, -x * _SQRT2, x * _SQRT2)
    out = torch.where((p > 0.25) & (p < 0.75), central, out)
    out = torch.where(p == 0, -_INF, torch.where(p == 1, _INF, out))
    return torch.where((p < 0) | (p > 1) | torch.isnan(p), _NAN, out)


def log_ndtr(x: torch.Tensor) -> torch.Tensor:
    """ln Phi(x): ln(erfcx(-x / sqrt 2) / 2) - x^2 / 2 below -1, ln1p(-erfc(x / sqrt 2) / 2)
    from -1 up."""
    t = x * (1.0 / _SQRT2)
    low = x < -1.0
    below = ew.log(erfcx(torch.where(low, -t, 1.0)) * 0.5) - (x * x) * 0.5
    above = ew.log1p(erfc(torch.where(low, 0.0, t)) * -0.5)
    out = torch.where(low, below, above)
    return torch.where(x == -_INF, -_INF, out)


def _bessel_coefficients(order: int) -> tuple[list[float], list[float]]:
    """The series sum (x^2/4)^k / (k! (k+order)!) and the asymptotic one,
    e^x / sqrt(2 pi x) sum (-1)^k a_k / x^k with a_k = prod((4n^2 - (2i-1)^2)) / (k! 8^k)."""
    series = [float(Fraction(1, math.factorial(k) * math.factorial(k + order))) for k in range(64)]
    asymptotic, a = [], Fraction(1)
    for k in range(22):
        asymptotic.append(float((-1) ** k * a))
        a = a * (4 * order * order - (2 * k + 1) ** 2) / ((k + 1) * 8)
    return series, asymptotic


_I0, _I0_FAR = _bessel_coefficients(0)
_I1, _I1_FAR = _bessel_coefficients(1)


def _bessel_i(order: int, x: torch.Tensor, scaled: bool) -> torch.Tensor:
    """I_order(x) (times e^-|x| where `scaled`): the power series to |x| = 30 (all its terms
    positive: no cancellation), the asymptotic expansion beyond."""
    series, far_series = (_I0, _I0_FAR) if order == 0 else (_I1, _I1_FAR)
    a = x.abs()
    near_a = torch.clamp(a, max=30.0)
    near = ew._horner(series, (near_a * near_a) * 0.25)
    if order == 1:
        near = near * (near_a * 0.5)
    far_a = torch.clamp(a, min=30.0)
    far = ew._horner(far_series, 1.0 / far_a) / ew.sqrt(far_a * (2.0 * math.pi))
    if scaled:
        near = near * ew.exp(-near_a)
    else:
        half = ew.exp(far_a * 0.5)  # e^x as two halves: no overflow before the result's own
        far = (far * half) * half
    out = torch.where(a <= 30.0, near, far)
    if order == 1:
        out = torch.where(x < 0, -out, out)
    return torch.where(torch.isnan(x), x, out)


def i0(x: torch.Tensor) -> torch.Tensor:
    """I_0(x), the modified Bessel function of the first kind of order 0."""
    return _bessel_i(0, x, scaled=False)


def i0e(x: torch.Tensor) -> torch.Tensor:
    """e^-|x| I_0(x)."""
    return _bessel_i(0, x, scaled=True)


def i1(x: torch.Tensor) -> torch.Tensor:
    """I_1(x), of order 1 (odd)."""
    return _bessel_i(1, x, scaled=False)


def i1e(x: torch.Tensor) -> torch.Tensor:
    """e^-|x| I_1(x)."""
    return _bessel_i(1, x, scaled=True)
