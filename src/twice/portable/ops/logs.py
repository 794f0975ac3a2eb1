"""Portable kernels for the log-domain functions models use beside the elementwise ones:
logsumexp (the exact sum of twice's exponentials), logaddexp and logaddexp2, logcumsumexp, logit,
xlogy, CELU, Mish, GLU and the Huber loss, each in float64 from twice's exp/log/log1p/expm1 and
rounded once."""

from __future__ import annotations

import math

import torch

from twice.portable.arithmetic import elementwise as ew
from twice.portable.arithmetic.exact import exact_sum
from twice.portable.dispatch.table import kernel
from twice.portable.ops.math import floating

_F64 = torch.float64


def _dtype(*values):
    dtype = torch.result_type(*values)
    return dtype if dtype.is_floating_point else torch.get_default_dtype()


@kernel("logsumexp.default")
def _logsumexp(x, dim, keepdim=False):
    """max + log(sum(exp(x - max))): the sum exact, a row of -inf gives -inf, +inf gives +inf."""
    floating(x)
    dtype = x.dtype if x.is_floating_point() else torch.get_default_dtype()
    dims = tuple(dim) if isinstance(dim, (list, tuple)) else (dim,)
    if x.numel() == 0:
        return torch.logsumexp(x.to(_F64), dims, keepdim).to(dtype)
    x64 = x.to(_F64)
    top = x64.amax(dim=dims, keepdim=True)
    shift = torch.where(torch.isfinite(top), top, 0.0)
    total = exact_sum(ew.exp(x64 - shift), dims, True, _F64, dtype)
    out = ew.log(total) + shift
    out = torch.where(torch.isinf(top), top, out)
    return (out if keepdim else out.squeeze(dims)).to(dtype)


def _logaddexp64(a64: torch.Tensor, b64: torch.Tensor) -> torch.Tensor:
    """ln(e^a + e^b) of float64 tensors: the larger plus log1p(e^-|a - b|)."""
    top = torch.maximum(a64, b64)
    gap = -(a64 - b64).abs()
    out = top + ew.log1p(ew.exp(torch.where(torch.isnan(gap), 0.0, gap)))
    out = torch.where(torch.isinf(top) & (a64 == b64), top, out)
    return torch.where(torch.isnan(a64) | torch.isnan(b64), math.nan, out)


@kernel("logaddexp.default")
def _logaddexp(a, b):
    floating(a, b)
    a64, b64 = torch.broadcast_tensors(a.to(_F64), b.to(_F64))
    return _logaddexp64(a64, b64).to(_dtype(a, b))


@kernel("logcumsumexp.default", "_logcumsumexp.default")
def _logcumsumexp(x, dim):
    """The running ln(sum e^x) along `dim`: one float64 logaddexp after another in index order
    (the order torch's CPU kernel adds in), rounded once at the end."""
    floating(x)
    if x.dim() == 0 or x.numel() == 0:
        return x.clone()
    x64 = x.to(_F64).movedim(dim, 0)
    out = torch.empty_like(x64)
    total = out[0] = x64[0]
    for i in range(1, x64.shape[0]):
        total = out[i] = _logaddexp64(total, x64[i])
    return out.movedim(0, dim).to(x.dtype)


@kernel("logaddexp2.default")
def _logaddexp2(a, b):
    floating(a, b)
    ln2 = math.log(2.0)
    out = _logaddexp(a.to(_F64) * ln2, b.to(_F64) * ln2) * (1.0 / ln2)
    return out.to(_dtype(a, b))


@kernel("logit.default")
def _logit(x, eps=None):
    floating(x)
    x64 = x.to(_F64)
    if eps is not None:
        x64 = torch.clamp(x64, float(eps), 1.0 - float(eps))
    return ew.log(x64 / (1.0 - x64)).to(x.dtype)


@kernel("xlogy.Tensor", "xlogy.Scalar_Other", "xlogy.Scalar_Self")
def _xlogy(x, y):
    """x log y, 0 where x is 0 (unless y is NaN)."""
    floating(x, y)
    dtype = _dtype(x, y)
    x64 = x.to(_F64) if isinstance(x, torch.Tensor) else torch.tensor(float(x), dtype=_F64)
    y64 = y.to(_F64) if isinstance(y, torch.Tensor) else torch.tensor(float(y), dtype=_F64)
    out = x64 * ew.log(y64)
    out = torch.where((x64 == 0) & ~torch.isnan(y64), 0.0, out)
    return out.to(dtype)


@kernel("celu.default")
def _celu(x, alpha=1.0):
    floating(x)
    x64, a = x.to(_F64), float(alpha)
    return torch.where(x64 > 0, x64, ew.expm1(x64 / a) * a).to(x.dtype)


@kernel("mish.default")
def _mish(x):
    """x tanh(softplus(x)), softplus = log1p(e**x) (x itself above 20, as torch's)."""
    floating(x)
    x64 = x.to(_F64)
    soft = torch.where(x64 > 20.0, x64, ew.log1p(ew.exp(torch.clamp(x64, max=20.0))))
    return (x64 * ew.tanh(soft)).to(x.dtype)


@kernel("glu.default")
def _glu(x, dim=-1):
    floating(x)
    torch._check(
        x.dim() > 0, lambda: "glu does not support scalars because halving size must be even"
    )
    size = x.shape[dim]
    torch._check(
        size % 2 == 0, lambda: f"Halving dimension must be even, but dimension {dim} is size {size}"
    )
    a, b = x.to(_F64).chunk(2, dim)
    return (a * ew.sigmoid(b)).to(x.dtype)


@kernel("huber_loss.default")
def _huber(x, target, reduction=1, delta=1.0):
    """0.5 d**2 below delta, delta (|d| - delta/2) above; a mean or sum exact."""
    floating(x, target)
    d = x.to(_F64) - target.to(_F64)
    a, delta = d.abs(), float(delta)
    loss = torch.where(a < delta, (d * d) * 0.5, (a - delta * 0.5) * delta).to(x.dtype)
    if reduction == 0:
        return loss
    total = exact_sum(loss, None, False, _F64, x.dtype)
    if reduction == 1:
        total = total / max(1, loss.numel())
    return total.to(x.dtype)
