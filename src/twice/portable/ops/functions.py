"""Portable kernels for the trigonometric and hyperbolic functions, `remainder` and `prod`.

Each function is built in float64 from twice's own exp, log, log1p, expm1, sqrt and sine
(elementwise.py) and basic IEEE operations, one after another, then rounded once to the
result's dtype: no step depends on the machine. `sin` and `cos` reduce their argument to turns
by x - k pi/2 with pi/2 in three parts (exact for |x| below 1.6e6; beyond, the error grows with
|x|) and sum Taylor series on |r| <= pi/4; `atan` is
range-reduced to |t| <= tan(pi/8) and summed as its Taylor series. `prod` multiplies in a fixed
pairwise tree in float64; `remainder` is the exact `fmod` followed by one addition.
"""

from __future__ import annotations

import math
from fractions import Fraction

import torch

from twice.portable.arithmetic import elementwise as ew
from twice.portable.dispatch.table import kernel
from twice.portable.ops.math import floating, inplace, unary

__all__ = ["sin", "cos", "atan", "atan2"]

_F64 = torch.float64
aten = torch.ops.aten
_ATAN_TAYLOR = [float(Fraction((-1) ** n, 2 * n + 1)) for n in range(24)]
_TAN_PI_8 = math.sqrt(2.0) - 1.0
_BIG = 2.0**28  # beyond it, x**2 + 1 is x**2 in float64


def sin(x: torch.Tensor) -> torch.Tensor:
    """sin of float64 x (NaN where x is not finite; the sign of a zero kept)."""
    s, c, q = ew.quarter_turns(x)
    out = torch.where(q == 0, s, torch.where(q == 1, c, torch.where(q == 2, -s, -c)))
    out = torch.where(x == 0, x, out)  # keeps the sign of zero
    return torch.where(torch.isfinite(x), out, math.nan)


def cos(x: torch.Tensor) -> torch.Tensor:
    """cos of float64 x (NaN where x is not finite)."""
    s, c, q = ew.quarter_turns(x)
    out = torch.where(q == 0, c, torch.where(q == 1, -s, torch.where(q == 2, -c, s)))
    return torch.where(torch.isfinite(x), out, math.nan)


def _tan(x: torch.Tensor) -> torch.Tensor:
    s, c, q = ew.quarter_turns(x)
    odd = (q % 2) == 1
    out = torch.where(odd, -c / s, s / c)
    out = torch.where(x == 0, x, out)
    return torch.where(torch.isfinite(x), out, math.nan)


def _atan_small(t: torch.Tensor) -> torch.Tensor:
    """atan(t) for |t| <= tan(pi/8): t times its series in t**2."""
    total = torch.full_like(t, _ATAN_TAYLOR[-1])
    z = t * t
    for c in reversed(_ATAN_TAYLOR[:-1]):
        total = total * z + c
    return t * total


def atan(x: torch.Tensor) -> torch.Tensor:
    """atan by reduction: 1/|x| above 1 (pi/2 minus), (a-1)/(a+1) above tan(pi/8) (pi/4 plus)."""
    a = x.abs()
    big = a > 1.0
    r = torch.where(big, 1.0 / torch.where(big, a, 1.0), a)
    mid = r > _TAN_PI_8
    t = torch.where(mid, (r - 1.0) / (r + 1.0), r)
    small = _atan_small(t)
    value = torch.where(mid, math.pi / 4 + small, small)
    value = torch.where(big, math.pi / 2 - value, value)
    value = torch.where(torch.isnan(x), x, value)
    return torch.where(x < 0, -value, value)


def atan2(y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """atan2 with C's quadrants, zeros and infinities."""
    y, x = torch.broadcast_tensors(y, x)
    both_inf = torch.isinf(y) & torch.isinf(x)
    ratio = torch.where(both_inf, torch.sign(y) * torch.sign(x), y / x)
    base = atan(ratio)
    sign_y = torch.where(torch.signbit(y), -1.0, torch.ones_like(y))
    negative_x = torch.signbit(x)
    out = torch.where(negative_x, base + sign_y * math.pi, base)
    out = torch.where((x == 0) & (y != 0), sign_y * (math.pi / 2), out)
    out = torch.where((y == 0) & ~torch.isnan(x), torch.where(negative_x, sign_y * math.pi, y), out)
    return torch.where(torch.isnan(x) | torch.isnan(y), math.nan, out)


def _asin(x: torch.Tensor) -> torch.Tensor:
    root = ew.sqrt((1.0 - x) * (1.0 + x))
    return torch.where(x.abs() > 1.0, math.nan, atan2(x, root))


def _acos(x: torch.Tensor) -> torch.Tensor:
    root = ew.sqrt((1.0 - x) * (1.0 + x))
    return torch.where(x.abs() > 1.0, math.nan, atan2(root, x))


def _sinh(x: torch.Tensor) -> torch.Tensor:
    a = x.abs()
    e = ew.expm1(a)
    near = (e + e / (e + 1.0)) * 0.5
    far = ew.exp(a * 0.5)
    value = torch.where(a < 1.0, near, (far * 0.5) * far - 0.5 / (far * far))
    return torch.where(x < 0, -value, value)


def _cosh(x: torch.Tensor) -> torch.Tensor:
    half = ew.exp(x.abs() * 0.5)  # e**|x| as half * half keeps its range to |x| < 1420
    return (half * 0.5) * half + 0.5 / (half * half)


def _asinh(x: torch.Tensor) -> torch.Tensor:
    a = x.abs()
    small = ew.log1p(a + (a * a) / (1.0 + ew.sqrt(a * a + 1.0)))
    value = torch.where(a > _BIG, ew.log(a) + math.log(2.0), small)
    return torch.where(x < 0, -value, value)


def _acosh(x: torch.Tensor) -> torch.Tensor:
    t = x - 1.0
    near = ew.log1p(t + ew.sqrt(t * 2.0 + t * t))
    value = torch.where(x > _BIG, ew.log(x) + math.log(2.0), near)
    return torch.where(x < 1.0, math.nan, value)


def _atanh(x: torch.Tensor) -> torch.Tensor:
    a = x.abs()
    value = ew.log1p((a * 2.0) / (1.0 - a)) * 0.5
    value = torch.where(a > 1.0, math.nan, value)
    return torch.where(x < 0, -value, value)


for _name, _fn in {
    "sin": sin,
    "cos": cos,
    "tan": _tan,
    "atan": atan,
    "asin": _asin,
    "acos": _acos,
    "sinh": _sinh,
    "cosh": _cosh,
    "asinh": _asinh,
    "acosh": _acosh,
    "atanh": _atanh,
}.items():
    kernel(f"{_name}.default")(unary(_fn))
    kernel(f"{_name}_.default")(inplace(unary(_fn)))


@kernel("atan2.default")
def _atan2(y, x):
    floating(y, x)
    dtype = torch.result_type(y, x)
    dtype = dtype if dtype.is_floating_point else torch.get_default_dtype()
    return atan2(y.to(_F64), x.to(_F64)).to(dtype)


kernel("atan2_.default")(inplace(_atan2))


@kernel("remainder.Tensor", "remainder.Scalar")
def _remainder(a, b):
    """fmod (exact), then b added where the remainder's sign is not b's (Python's %)."""
    floating(a, b)
    r = torch.fmod(a, b)
    b_like = b if isinstance(b, torch.Tensor) else torch.tensor(b, dtype=r.dtype)
    fix = (r != 0) & ((r < 0) != (b_like < 0))
    return torch.where(fix, r + b, r)


kernel("remainder_.Tensor", "remainder_.Scalar")(inplace(_remainder))


def _pairwise_product(x: torch.Tensor) -> torch.Tensor:
    """The product over the last axis in a fixed pairwise tree (float64 multiplications)."""
    while x.shape[-1] > 1:
        n = x.shape[-1]
        if n % 2:
            x = torch.cat([x, torch.ones_like(x[..., :1])], -1)
        x = x[..., 0::2] * x[..., 1::2]
    return x[..., 0] if x.shape[-1] == 1 else torch.ones(x.shape[:-1], dtype=x.dtype)


@kernel("prod.default")
def _prod(x, *, dtype=None):
    floating(x)
    out = dtype or (x.dtype if x.is_floating_point() else torch.int64)
    return _pairwise_product(x.reshape(-1).to(_F64)).to(out)


@kernel("prod.dim_int")
def _prod_dim(x, dim, keepdim=False, *, dtype=None):
    floating(x)
    out = dtype or (x.dtype if x.is_floating_point() else torch.int64)
    moved = x.to(_F64).movedim(dim, -1) if x.dim() else x.to(_F64).reshape(1)
    result = _pairwise_product(moved).to(out)
    return result.unsqueeze(dim) if keepdim and x.dim() else result


# Distances: differences and powers elementwise, the sums over features exact.


def _p_sums(diff: torch.Tensor, p: float, dtype) -> torch.Tensor:
    from twice.portable.arithmetic.exact import exact_sum

    a = diff.abs()
    if p == 0:
        return (a != 0).sum(-1).to(_F64)
    if math.isinf(p):
        return a.amax(-1) if a.shape[-1] else a.sum(-1)
    if p == 1:
        return exact_sum(a, (-1,), False, _F64, dtype)
    if p == 2:
        return ew.sqrt(exact_sum(a * a, (-1,), False, _F64, dtype))
    powered = ew.pow_scalar(a, p)
    return ew.pow_scalar(exact_sum(powered, (-1,), False, _F64, dtype), 1.0 / p)


@kernel("_cdist_forward.default")
def _cdist(x1, x2, p, compute_mode=None):
    floating(x1, x2)
    diff = x1.to(_F64).unsqueeze(-2) - x2.to(_F64).unsqueeze(-3)
    return _p_sums(diff, float(p), x1.dtype).to(x1.dtype)


def _cdist_grad(grad, x1, x2, p, dist):
    """d/dx1 of sum_ij g_ij ||x1_i - x2_j||_p: each term elementwise, the sum over j exact."""
    from twice.portable.arithmetic.exact import exact_sum

    diff = x1.to(_F64).unsqueeze(-2) - x2.to(_F64).unsqueeze(-3)
    d = dist.to(_F64).unsqueeze(-1)
    g = grad.to(_F64).unsqueeze(-1)
    if p == 0:
        return torch.zeros_like(x1)
    if p == 1:
        terms = g * torch.sign(diff)
    elif math.isinf(p):  # the largest |difference| as the distance holds it: rounded
        top = diff.abs().to(x1.dtype).to(_F64) == d
        terms = g * torch.sign(diff) * top.to(_F64)
    elif p == 2:
        terms = torch.where(d == 0, 0.0, g * diff / torch.where(d == 0, 1.0, d))
    else:
        scale = ew.pow_scalar(diff.abs(), p - 2.0) * diff
        denominator = ew.pow_scalar(d, p - 1.0)
        terms = torch.where(d == 0, 0.0, g * scale / torch.where(d == 0, 1.0, denominator))
    return exact_sum(terms, (-2,), False, x1.dtype, x1.dtype)


@kernel("_cdist_backward.default")
def _cdist_backward(grad, x1, x2, p, dist):
    floating(grad, x1, x2)
    return _cdist_grad(grad, x1, x2, float(p), dist)


@kernel("_pdist_forward.default")
def _pdist(x, p=2.0):
    floating(x)
    n = x.shape[0]
    rows, cols = torch.triu_indices(n, n, 1)
    full = _cdist(x, x, p)
    return full[rows, cols]


@kernel("_pdist_backward.default")
def _pdist_backward(grad, x, p, pdist):
    floating(grad, x)
    n = x.shape[0]
    rows, cols = torch.triu_indices(n, n, 1)
    g = torch.zeros(n, n, dtype=_F64)
    g[rows, cols] = grad.to(_F64)
    g[cols, rows] = grad.to(_F64)
    dist = torch.zeros(n, n, dtype=_F64)
    dist[rows, cols] = pdist.to(_F64)
    dist[cols, rows] = pdist.to(_F64)
    return _cdist_grad(g, x, x, float(p), dist)


@kernel("exp2.default")
def _exp2(x):
    """2**x: the integer part exact (a power of two), the fraction through exp."""
    floating(x)
    x64 = x.to(_F64) if x.is_floating_point() else x.to(torch.get_default_dtype()).to(_F64)
    whole = torch.floor(x64)
    fraction = ew.exp((x64 - whole) * math.log(2.0))
    finite = torch.isfinite(whole)
    scaled = torch.ldexp(fraction, torch.where(finite, whole, 0.0).clamp(-2000, 2000))
    out = torch.where(finite, scaled, torch.where(x64 > 0, math.inf, 0.0))
    out = torch.where(torch.isnan(x64), x64, out)
    return out.to(x.dtype if x.is_floating_point() else torch.get_default_dtype())


kernel("exp2_.default")(inplace(_exp2))


@kernel("hypot.default")
def _hypot(x, y):
    floating(x, y)
    a, b = x.to(_F64).abs(), y.to(_F64).abs()
    big = torch.maximum(a, b)
    small = torch.minimum(a, b)
    safe = torch.where(big > 0, big, 1.0)
    ratio = small / safe
    out = big * ew.sqrt(1.0 + ratio * ratio)
    out = torch.where(torch.isinf(a) | torch.isinf(b), math.inf, out)
    return out.to(torch.result_type(x, y))


@kernel("elu.default")
def _elu(x, alpha=1.0, scale=1.0, input_scale=1.0):
    """x scale where x > 0, else alpha scale (e**(x input_scale) - 1), with twice's expm1."""
    floating(x)
    x64 = x.to(_F64)
    negative = ew.expm1(x64 * float(input_scale)) * (float(alpha) * float(scale))
    return torch.where(x64 > 0, x64 * float(scale), negative).to(x.dtype)


kernel("elu_.default")(inplace(_elu))


# Factories that compute their values (torch's kernels are vectorised, with fused multiply-adds
# on some instruction sets): i * step and one addition in float64, rounded to the dtype.


def _factory_dtype(dtype, *values):
    if dtype is not None:
        return dtype
    floats = any(
        isinstance(v, float) or (isinstance(v, torch.Tensor) and v.is_floating_point())
        for v in values
    )
    return torch.get_default_dtype() if floats else torch.int64


@kernel("arange.start_step", "arange.start", "arange.default")
def _arange(*args, dtype=None, layout=None, device=None, pin_memory=None):
    start, end, step = (0, args[0], 1) if len(args) == 1 else (*args, 1)[:3]
    dtype = _factory_dtype(dtype, start, end, step)
    if not dtype.is_floating_point:
        return aten.arange.start_step(start, end, step, dtype=dtype, device=device)
    count = aten.arange.start_step(start, end, step, dtype=_F64, device="meta").shape[0]
    i = torch.arange(count, dtype=_F64, device=device)
    return (i * float(step) + float(start)).to(dtype)


@kernel("linspace.default")
def _linspace(start, end, steps, *, dtype=None, layout=None, device=None, pin_memory=None):
    """torch's formula: start + i step in the first half, end - (steps - 1 - i) step in the
    second, step = (end - start) / (steps - 1), in float64."""
    dtype = dtype or torch.get_default_dtype()
    if not dtype.is_floating_point:
        return aten.linspace.default(start, end, steps, dtype=dtype, device=device)
    start, end = float(start), float(end)
    if steps == 1:
        return torch.full((1,), start, dtype=dtype, device=device)
    step = (end - start) / (steps - 1)
    i = torch.arange(steps, dtype=_F64, device=device)
    first = i * step + start
    second = end - (float(steps - 1) - i) * step
    return torch.where(i < steps // 2, first, second).to(dtype)


@kernel("logspace.default")
def _logspace(start, end, steps, base=10.0, *, dtype=None, layout=None, device=None, **_):
    dtype = dtype or torch.get_default_dtype()
    exponents = _linspace(start, end, steps, dtype=_F64, device=device)
    base64 = torch.full_like(exponents, float(base))
    return ew.pow_tensor(base64, exponents).to(dtype)
