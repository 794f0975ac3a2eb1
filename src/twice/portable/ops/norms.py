"""Portable layer, batch and group normalisation, forward and backward.

Statistics are exact sums (exact.py; batch norm's per-channel sums and formulas in the compiled
kernels, native_norms.chansum/chanmap, with the same expressions here in torch operations), square
roots correctly rounded, everything in float64 and rounded once; the saved mean and inverse
standard deviation come back in the dtypes and shapes torch's kernels give them.
"""

from __future__ import annotations

import math

import torch

from twice.portable.arithmetic import elementwise as ew
from twice.portable.arithmetic.exact import beta_for, exact_sum, slices_for
from twice.portable.native import norms as native_norms

__all__ = [
    "layer_norm",
    "layer_norm_backward",
    "batch_norm",
    "batch_norm_backward",
    "group_norm",
    "group_norm_backward",
]

_F64 = torch.float64


def _sum(x, dims, like, keepdim=True):
    """The exact sum in float64, at the precision a result of dtype `like` needs."""
    return exact_sum(x, dims, keepdim, _F64, like)


def layer_norm(x, shape, weight, bias, eps: float):
    """aten.native_layer_norm: (out, mean, rstd) over the last len(shape) dimensions."""
    dims = tuple(range(x.dim() - len(shape), x.dim()))
    n = math.prod(shape)
    w64 = weight.to(_F64).reshape(-1) if weight is not None else None
    b64 = bias.to(_F64).reshape(-1) if bias is not None else None
    fast = None
    if x.dim() > len(shape):
        fast = native_norms.layer_norm(x, n, w64, b64, eps, beta_for(n, 1))
    if fast:
        out, mean, rstd = fast
        stats = x.shape[: x.dim() - len(shape)] + (1,) * len(shape)
        return out, mean.reshape(stats).to(x.dtype), rstd.reshape(stats).to(x.dtype)
    x64 = x.to(_F64)
    mean = _sum(x64, dims, x.dtype) / n
    d = x64 - mean
    rstd = 1.0 / ew.sqrt(_sum(d * d, dims, x.dtype) / n + eps)
    out = d * rstd
    if weight is not None:
        out = out * weight.to(_F64)
    if bias is not None:
        out = out + bias.to(_F64)
    return out.to(x.dtype), mean.to(x.dtype), rstd.to(x.dtype)


def _norm_input_grad(go, xhat, rstd, dims, n, like):
    """rstd * (g - mean(g) - xhat * mean(g * xhat)) over `dims` (the normalised elements)."""
    return (go - _sum(go, dims, like) / n - xhat * (_sum(go * xhat, dims, like) / n)) * rstd


def layer_norm_backward(grad, x, shape, mean, rstd, weight, bias, mask):
    """aten.native_layer_norm_backward: (grad input, grad weight, grad bias)."""
    dims = tuple(range(x.dim() - len(shape), x.dim()))
    batch = tuple(range(x.dim() - len(shape)))
    cols = math.prod(shape)
    want = (mask[0], bool(mask[1] and weight is not None), bool(mask[2] and bias is not None))
    precise = all(t is None or t.dtype == torch.float32 for t in (weight, bias))
    fast = None
    if batch and precise:
        fast = native_norms.layer_norm_backward(
            grad, x, cols, mean.to(_F64).reshape(-1), rstd.to(_F64).reshape(-1),
            weight.to(_F64).reshape(-1) if weight is not None else None,
            beta_for(cols, 1), beta_for(x.numel() // max(1, cols), 1), want,
        )  # fmt: skip
    if fast:
        gi, gw, gb = fast
        gw = gw.reshape(weight.shape).to(weight.dtype) if gw is not None else None
        gb = gb.reshape(bias.shape).to(bias.dtype) if gb is not None else None
        return gi, gw, gb
    go, r = grad.to(_F64), rstd.to(_F64)
    xhat = (x.to(_F64) - mean.to(_F64)) * r
    g = go * weight.to(_F64) if weight is not None else go
    gi = (
        _norm_input_grad(g, xhat, r, dims, math.prod(shape), x.dtype).to(x.dtype)
        if mask[0]
        else None
    )
    gw = (
        exact_sum(go * xhat, batch, False, weight.dtype) if mask[1] and weight is not None else None
    )
    gb = exact_sum(go, batch, False, bias.dtype) if mask[2] and bias is not None else None
    return gi, gw, gb


def _channel(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return t.to(_F64).reshape((1, -1) + (1,) * (like.dim() - 2))


def _chan_sum(expr: int, x, y, m, s, w, like) -> torch.Tensor:
    """The exact per-channel sum over (N, spatial) of one of batch norm's expressions, float64
    (C,): 0 x, 1 (x - m)^2, 2 y (x - m) s, 3 y w, 4 (y w)((x - m) s)."""
    terms = x.numel() // max(1, x.shape[1])
    fast = native_norms.chansum(expr, x, y, m, s, w, beta_for(terms, 1), slices_for(like))
    if fast is not None and fast is not False:
        return fast
    x64, y64 = x.to(_F64), (y.to(_F64) if y is not None else None)
    mb, sb, wb = (_channel(t, x) if t is not None else None for t in (m, s, w))
    if expr == 0:
        value = x64
    elif expr == 1:
        d = x64 - mb
        value = d * d
    elif expr == 2:
        value = y64 * ((x64 - mb) * sb)
    elif expr == 3:
        value = y64 * wb
    else:
        value = (y64 * wb) * ((x64 - mb) * sb)
    dims = (0,) + tuple(range(2, x.dim()))
    return exact_sum(value, dims, False, _F64, like)


def _chan_map(expr: int, x, y, m, s, w, b, p1, p2, dtype) -> torch.Tensor:
    """Batch norm's per-element formulas, rounded once: 0 ((x - m) s) w + b, 1 ((y w - p1) -
    ((x - m) s) p2) s, 2 (y w) s."""
    fast = native_norms.chanmap(expr, x, y, m, s, w, b, p1, p2, dtype)
    if fast is not None:
        return fast
    x64 = x.to(_F64)
    mb, sb, wb, bb, p1b, p2b = (
        _channel(t, x) if t is not None else None for t in (m, s, w, b, p1, p2)
    )
    if expr == 0:
        out = (x64 - mb) * sb
        out = out * wb if wb is not None else out
        out = out + bb if bb is not None else out
    elif expr == 1:
        out = ((y.to(_F64) * wb - p1b) - ((x64 - mb) * sb) * p2b) * sb
    else:
        out = (y.to(_F64) * wb) * sb
    return out.to(dtype)


def batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps):
    """aten.native_batch_norm: (out, save_mean, save_invstd); updates the running statistics."""
    c = x.shape[1]
    w = weight.to(_F64) if weight is not None else None
    b = bias.to(_F64) if bias is not None else None
    if training:
        n = x.numel() // c
        mean = _chan_sum(0, x, None, None, None, None, x.dtype) / n
        var = _chan_sum(1, x, None, mean, None, None, x.dtype) / n
        invstd = 1.0 / ew.sqrt(var + eps)
        if running_mean is not None:
            new = running_mean.to(_F64) * (1.0 - momentum) + mean * momentum
            running_mean.copy_(new.to(running_mean.dtype))
        if running_var is not None:
            unbiased = var * (n / max(n - 1, 1))
            new = running_var.to(_F64) * (1.0 - momentum) + unbiased * momentum
            running_var.copy_(new.to(running_var.dtype))
        save = (mean.to(x.dtype), invstd.to(x.dtype))
    else:
        mean = running_mean.to(_F64)
        invstd = 1.0 / ew.sqrt(running_var.to(_F64) + eps)
        empty = torch.empty(0, dtype=x.dtype, device=x.device)
        save = (empty, empty.clone())
    return (_chan_map(0, x, None, mean, invstd, w, b, None, None, x.dtype),) + save


def batch_norm_backward(grad, x, weight, rmean, rvar, smean, sinvstd, train, eps, mask):
    """aten.native_batch_norm_backward: (grad input, grad weight, grad bias)."""
    if train:
        mean, invstd = smean.to(_F64), sinvstd.to(_F64)
    else:
        mean, invstd = rmean.to(_F64), 1.0 / ew.sqrt(rvar.to(_F64) + eps)
    n = x.numel() // x.shape[1]
    w = weight.to(_F64) if weight is not None else torch.ones_like(mean)
    sums = None
    if train and slices_for(x.dtype) == 1:  # the four sums in two passes (the same bits)
        sums = native_norms.bnsums(x, grad, mean, invstd, w, beta_for(n, 1))
    if sums is None or sums is False:
        sums = None
    gi = None
    if mask[0]:
        if train:
            s3 = sums[:, 2] if sums is not None else _chan_sum(3, x, grad, None, None, w, x.dtype)
            s4 = sums[:, 3] if sums is not None else _chan_sum(4, x, grad, mean, invstd, w, x.dtype)
            gi = _chan_map(1, x, grad, mean, invstd, w, None, s3 / n, s4 / n, x.dtype)
        else:
            gi = _chan_map(2, x, grad, None, invstd, w, None, None, None, x.dtype)
    gw = gb = None
    if mask[1]:
        s2 = sums[:, 1] if sums is not None else _chan_sum(2, x, grad, mean, invstd, None, x.dtype)
        gw = s2.to(x.dtype)
    if mask[2]:
        s0 = sums[:, 0] if sums is not None else _chan_sum(0, grad, None, None, None, None, x.dtype)
        gb = s0.to(x.dtype)
    return gi, gw, gb


def group_norm(x, weight, bias, n, c, hw, groups, eps):
    """aten.native_group_norm: (out, mean, rstd), the statistics shaped (N, groups)."""
    if x.numel() == 0:  # no value to normalise: torch's statistics of nothing (constants)
        return torch.ops.aten.native_group_norm.default(x, weight, bias, n, c, hw, groups, eps)
    grouped = x.reshape(n, groups, -1)
    out, mean, rstd = layer_norm(grouped, [grouped.shape[-1]], None, None, eps)
    out = out.to(_F64).reshape(n, c, -1)
    if weight is not None:
        out = out * weight.to(_F64).reshape(1, c, 1)
    if bias is not None:
        out = out + bias.to(_F64).reshape(1, c, 1)
    return out.reshape(x.shape).to(x.dtype), mean.reshape(n, groups), rstd.reshape(n, groups)


def group_norm_backward(grad, x, mean, rstd, weight, n, c, hw, groups, mask):
    """aten.native_group_norm_backward: (grad input, grad weight, grad bias)."""
    if x.numel() == 0:  # sums over no element: torch's zeros and empties
        settings = (weight, n, c, hw, groups, mask)
        return torch.ops.aten.native_group_norm_backward.default(grad, x, mean, rstd, *settings)
    go = grad.to(_F64).reshape(n, c, -1)
    m, r = mean.to(_F64).reshape(n, groups, 1), rstd.to(_F64).reshape(n, groups, 1)
    xg = x.to(_F64).reshape(n, groups, -1)
    xhat = ((xg - m) * r).reshape(n, c, -1)
    g = go * weight.to(_F64).reshape(1, c, 1) if weight is not None else go
    gi = None
    if mask[0]:
        gg, xh = g.reshape(n, groups, -1), xhat.reshape(n, groups, -1)
        gi = _norm_input_grad(gg, xh, r, (2,), gg.shape[-1], x.dtype).reshape(x.shape).to(x.dtype)
    gw = exact_sum(go * xhat, (0, 2), False, x.dtype) if mask[1] else None
    gb = exact_sum(go, (0, 2), False, x.dtype) if mask[2] else None
    return gi, gw, gb
