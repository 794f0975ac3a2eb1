"""Elementwise functions by twice's own algorithms, in float64 from IEEE basic operations only.

torch evaluates exp, log, tanh, erf, ... with the platform's libm in its scalar code and with SLEEF
in its vectorised code, which round differently per instruction set. Here each function is a
fixed sequence of additions, multiplications, divisions, square roots and exact scalings by
powers of two (bit-built, never `pow`), so it gives the same bits wherever IEEE arithmetic holds:
any CPU, any vector width, any thread count, the GPU. A float32 input is evaluated in float64 and
rounded once. No operation is fused: a multiply and the add that follows are two roundings.

Each function takes and returns float64 tensors; accuracy is measured in tests and
docs/portable.md (within a few float64 ulps, so float32 results are correctly rounded but for
rare ties).
"""

from __future__ import annotations

import math
from fractions import Fraction

import torch

from twice.portable import native
from twice.portable.arithmetic.coefficients import (
    ATANH_ODD,
    COS_TAYLOR,
    ERF_TAYLOR,
    ERFCX_1_6,
    EXP_TAYLOR,
    EXPM1_SMALL,
    EXPM1_TAYLOR,
    GELU_3C,
    GELU_C,
    GELU_K,
    INV_LN2,
    INV_SQRT_2PI,
    LN2_HI,
    LN2_LO,
    SIN_TAYLOR,
    SQRT_HALF,
    TWO_OVER_SQRT_PI,
)

__all__ = [
    "sqrt",
    "exp",
    "log",
    "log1p",
    "expm1",
    "tanh",
    "sigmoid",
    "erf",
    "sincos_turns",
    "quarter_turns",
    "pow_scalar",
    "pow_tensor",
    "softplus",
    "gelu",
    "gelu_backward",
    "silu",
    "silu_backward",
    "pow2",
]


def _horner(coefficients, t: torch.Tensor) -> torch.Tensor:
    """sum(c[i] * t**i) by Horner's rule, lowest power first in `coefficients`."""
    acc = torch.full_like(t, coefficients[-1])
    for c in reversed(coefficients[:-1]):
        acc = acc * t
        acc = acc + c
    return acc


def pow2(k: torch.Tensor) -> torch.Tensor:
    """2.0**k for integer tensors k in [-1022, 1023], built from its bits (exact)."""
    bits = (k.to(torch.int64) + 1023) << 52
    return (
        bits.view(torch.float64) if bits.is_contiguous() else bits.contiguous().view(torch.float64)
    )


def _scale(p: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """p * 2**k in two exact steps (so that k may reach the subnormal range)."""
    half = torch.div(k, 2, rounding_mode="floor")
    return (p * pow2(half)) * pow2(k - half)


def sqrt(x: torch.Tensor) -> torch.Tensor:
    """The correctly rounded square root of float64 x (torch's own CPU sqrt is not: it misses
    the nearest double for about 1% of inputs, and the nearest float for 15%). torch's result
    is a candidate within an ulp, moved to its neighbour when the exact residual x - r*r says the
    root lies beyond the midpoint; x is first scaled into [1/2, 2) by an even power of two."""
    if (out := native.unary("sqrt", x)) is not None:
        return out
    m, e = torch.frexp(x)
    odd = (e % 2) != 0
    m = torch.where(odd, m * 2.0, m)
    half = torch.div(e - odd.to(e.dtype), 2, rounding_mode="floor").to(torch.int64)
    r = torch.sqrt(m)
    for _ in range(2):  # a candidate one ulp off moves once; the second pass confirms
        up = torch.nextafter(r, torch.full_like(r, math.inf))
        down = torch.nextafter(r, torch.full_like(r, -math.inf))
        residual = _square_residual(m, r)
        above = residual > r * (up - r) + ((up - r) * (up - r)) * 0.25
        below = residual < -(r * (r - down)) + ((r - down) * (r - down)) * 0.25
        r = torch.where(above, up, torch.where(below, down, r))
    out = _scale(r, half)
    out = torch.where((x == 0) | (x == math.inf), x, out)
    return torch.where((x < 0) | torch.isnan(x), math.nan, out)


def _square_residual(x: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """x - r*r with r*r's rounding error recovered exactly (Dekker's product, no fused ops)."""
    t = r * 134217729.0  # 2**27 + 1: Veltkamp's split into two 26-bit halves
    high = t - (t - r)
    low = r - high
    p = r * r
    error = ((high * high - p) + (high * low) * 2.0) + low * low
    return (x - p) - error


def exp(x: torch.Tensor) -> torch.Tensor:
    """e**x: x = k ln2 + r with |r| <= ln2/2, a degree-13 Taylor polynomial for e**r."""
    if (out := native.unary("exp", x)) is not None:
        return out
    if (out := native.gpu("exp", x)) is not None:
        return out
    x = torch.clamp(x, -746.0, 710.0)
    k = torch.round(x * INV_LN2)
    k = torch.where(torch.isnan(k), 0.0, k)
    r = (x - k * LN2_HI) - k * LN2_LO
    return _scale(_horner(EXP_TAYLOR, r), k.to(torch.int64))


def log(x: torch.Tensor) -> torch.Tensor:
    """ln x: x = m 2**e with m in [sqrt(1/2), sqrt(2)); ln m = 2 atanh((m-1)/(m+1)), a series."""
    if (out := native.unary("log", x)) is not None:
        return out
    if (out := native.gpu("log", x)) is not None:
        return out
    m, e = torch.frexp(x)
    low = m < SQRT_HALF
    m = torch.where(low, m * 2.0, m)
    e = (e - low.to(e.dtype)).to(torch.float64)
    f = m - 1.0
    s = f / (f + 2.0)
    z = s * s
    log_m = (s * 2.0) * _horner(ATANH_ODD, z)
    out = e * LN2_HI + (log_m + e * LN2_LO)
    out = torch.where(x == 0, -math.inf, out)
    out = torch.where(x == math.inf, math.inf, out)
    return torch.where((x < 0) | torch.isnan(x), math.nan, out)


def log1p(x: torch.Tensor) -> torch.Tensor:
    """ln(1 + x), with the rounding of 1 + x corrected: ln(u) * x / (u - 1)."""
    if (out := native.unary("log1p", x)) is not None:
        return out
    if (out := native.gpu("log1p", x)) is not None:
        return out
    u = x + 1.0
    d = u - 1.0
    exact = d == 0
    ratio = x / torch.where(exact, 1.0, d)
    out = torch.where(exact, x, log(u) * ratio)
    return torch.where(u == math.inf, math.inf, out)


def expm1(x: torch.Tensor) -> torch.Tensor:
    """e**x - 1: its Taylor series for |x| < ln2/2, e**x - 1 beyond."""
    if (out := native.unary("expm1", x)) is not None:
        return out
    if (out := native.gpu("expm1", x)) is not None:
        return out
    small = x.abs() < EXPM1_SMALL
    xs = torch.where(small, x, 0.0)
    series = xs * _horner(EXPM1_TAYLOR, xs)
    return torch.where(small, series, exp(x) - 1.0)


def tanh(x: torch.Tensor) -> torch.Tensor:
    """tanh x = -t / (t + 2) with t = e**(-2|x|) - 1, the sign restored."""
    if (out := native.unary("tanh", x)) is not None:
        return out
    if (out := native.gpu("tanh", x)) is not None:
        return out
    t = expm1(x.abs() * -2.0)
    magnitude = -t / (t + 2.0)
    return torch.where(x < 0, -magnitude, magnitude)


def sigmoid(x: torch.Tensor) -> torch.Tensor:
    """1 / (1 + e**-x)."""
    if (out := native.unary("sigmoid", x)) is not None:
        return out
    if (out := native.gpu("sigmoid", x)) is not None:
        return out
    return 1.0 / (exp(-x) + 1.0)


def erf(x: torch.Tensor) -> torch.Tensor:
    """erf x: its Taylor series for |x| < 1; 1 - e**(-x*x) erfcx(|x|) by a fitted polynomial on
    [1, 6]; 1 beyond (erfc(6) is below half a float64 ulp of 1). Odd."""
    if (out := native.unary("erf", x)) is not None:
        return out
    if (out := native.gpu("erf", x)) is not None:
        return out
    a = x.abs()
    near = torch.where(a < 1.0, a, 0.0)
    series = (near * TWO_OVER_SQRT_PI) * _horner(ERF_TAYLOR, near * near)
    far = torch.clamp(a, 1.0, 6.0)
    t = (far - 3.5) / 2.5
    erfc = exp(-(far * far)) * _horner(list(reversed(ERFCX_1_6)), t)
    magnitude = torch.where(a < 1.0, series, torch.where(a < 6.0, 1.0 - erfc, 1.0))
    magnitude = torch.where(torch.isnan(x), x, magnitude)
    return torch.where(x < 0, -magnitude, magnitude)


def sincos_turns(u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sin, cos) of 2 pi u for u in [0, 1): the quarter turn found exactly, then Taylor series
    of the angle within it (below pi/2)."""
    v = u * 4.0
    quarter = torch.floor(v)
    angle = (v - quarter) * (math.pi / 2)
    z = angle * angle
    s = angle * _horner(SIN_TAYLOR, z)
    c = _horner(COS_TAYLOR, z)
    q = quarter.to(torch.int64) % 4
    sin = torch.where(q == 0, s, torch.where(q == 1, c, torch.where(q == 2, -s, -c)))
    cos = torch.where(q == 0, c, torch.where(q == 1, -s, torch.where(q == 2, -c, s)))
    return sin, cos


# pi/2 in three parts of 33, 33 and 53 bits (fdlibm's): k times each of the first two is exact
# for |k| < 2**20, so x - k pi/2 is found to about 2**-85 of pi/2 for |x| below 1.6e6.
_PIO2 = (1.57079632673412561417e00, 6.07710050630396597660e-11, 2.02226624871116645580e-21)
_QUARTER_SIN = [float(Fraction((-1) ** n, math.factorial(2 * n + 1))) for n in range(11)]
_QUARTER_COS = [float(Fraction((-1) ** n, math.factorial(2 * n))) for n in range(11)]


def quarter_turns(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(sin r, cos r, k mod 4) with x = r + k pi/2, |r| <= pi/4 (Cody and Waite's reduction),
    the sine and cosine of r by their Taylor series: sin x and cos x are these turned by k."""
    k = torch.round(x * (2.0 / math.pi))
    r = x - k * _PIO2[0]
    r = r - k * _PIO2[1]
    r = r - k * _PIO2[2]
    z = r * r
    quadrant = torch.remainder(torch.where(torch.isfinite(k), k, 0.0), 4.0).to(torch.int64)
    return r * _horner(_QUARTER_SIN, z), _horner(_QUARTER_COS, z), quadrant


def pow_scalar(x: torch.Tensor, y: float) -> torch.Tensor:
    """x**y for a number y: exact products for small integers, sqrt for 1/2, else e**(y ln|x|)
    with the sign of an odd integer power."""
    if y == 0:
        return torch.ones_like(x)
    if y == 1:
        return x.clone()
    if y == 2:
        return x * x
    if y == 3:
        return (x * x) * x
    if y == 0.5:
        return sqrt(x)
    if y == -1:
        return 1.0 / x
    if y == -2:
        return 1.0 / (x * x)
    if y == -0.5:
        return 1.0 / sqrt(x)
    return pow_tensor(x, torch.full_like(x, float(y)))


def pow_tensor(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """x**y elementwise by e**(y ln|x|), following C's pow for signs, zeros and infinities."""
    x, y = torch.broadcast_tensors(x, y)
    magnitude = exp(y * log(x.abs()))
    integral = torch.floor(y) == y
    odd = integral & (torch.remainder(y, 2.0) == 1.0)
    out = torch.where((x < 0) & odd, -magnitude, magnitude)
    out = torch.where((x < 0) & ~integral & torch.isfinite(x), math.nan, out)
    return torch.where((y == 0) | (x == 1), 1.0, out)


def softplus(x: torch.Tensor, beta: float, threshold: float) -> torch.Tensor:
    """ln(1 + e**(beta x)) / beta, or x where beta x exceeds the threshold (torch's rule)."""
    if (out := native.binary("softplus", None, x, x.dtype, beta, threshold)) is not None:
        return out
    bx = x * beta
    return torch.where(bx > threshold, x, log1p(exp(bx)) / beta)


def gelu(x: torch.Tensor, approximate: str) -> torch.Tensor:
    """GELU: x Phi(x) with erf, or torch's tanh approximation."""
    name = "gelu_tanh" if approximate == "tanh" else "gelu"
    if (out := native.unary(name, x)) is not None:
        return out
    if (out := native.gpu(name, x)) is not None:
        return out
    if approximate == "tanh":
        inner = (x + ((x * x) * x) * GELU_C) * GELU_K
        return (x * 0.5) * (tanh(inner) + 1.0)
    return (x * 0.5) * (erf(x * SQRT_HALF) + 1.0)


def gelu_backward(grad: torch.Tensor, x: torch.Tensor, approximate: str) -> torch.Tensor:
    """d GELU / dx times the incoming gradient."""
    name = "gelu_tanh_backward" if approximate == "tanh" else "gelu_backward"
    if (out := native.binary(name, grad, x, grad.dtype)) is not None:
        return out
    if approximate == "tanh":
        k = GELU_K
        x2 = x * x
        inner = (x + (x2 * x) * GELU_C) * k
        t = tanh(inner)
        left = (t + 1.0) * 0.5
        d_inner = ((x2 * GELU_3C) + 1.0) * k
        right = ((x * 0.5) * (1.0 - t * t)) * d_inner
        return grad * (left + right)
    cdf = (erf(x * SQRT_HALF) + 1.0) * 0.5
    pdf = exp((x * x) * -0.5) * INV_SQRT_2PI
    return grad * (cdf + x * pdf)


def silu(x: torch.Tensor) -> torch.Tensor:
    """x / (1 + e**-x)."""
    if (out := native.unary("silu", x)) is not None:
        return out
    if (out := native.gpu("silu", x)) is not None:
        return out
    return x / (exp(-x) + 1.0)


def silu_backward(grad: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """grad * s (1 + x (1 - s)) with s the sigmoid of x."""
    if (out := native.binary("silu_backward", grad, x, grad.dtype)) is not None:
        return out
    s = sigmoid(x)
    return grad * (s * ((x * (1.0 - s)) + 1.0))
