"""The network operations of portable mode, forward and backward: softmax, losses, normalisations,
convolution and embedding gradients.

Each is written with the exact reductions of exact.py and the elementwise functions of
elementwise.py, in float64, and rounded once to the input's dtype, so its bits depend only on its
inputs. The formulas are the textbook ones (those torch's own kernels implement); where torch
saves statistics for the backward (mean, inverse standard deviation), these return them in the
dtypes and shapes torch's kernels do, so autograd and other kernels can read them.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from twice.portable import elementwise as ew
from twice.portable import native
from twice.portable.exact import (
    _beta,
    exact_addmm,
    exact_bilinear,
    exact_matmul,
    exact_sum,
    slices_for,
)

__all__ = [
    "softmax",
    "softmax_backward",
    "log_softmax",
    "log_softmax_backward",
    "nll_loss",
    "nll_loss_backward",
    "layer_norm",
    "layer_norm_backward",
    "batch_norm",
    "batch_norm_backward",
    "group_norm",
    "group_norm_backward",
    "convolution",
    "convolution_backward",
    "embedding_backward",
    "Unsupported",
]

_F64 = torch.float64


class Unsupported(Exception):
    """A call portable mode has no implementation for (its arguments, not the operation)."""


def _sum(x, dims, like, keepdim=True):
    """The exact sum in float64, at the precision a result of dtype `like` needs."""
    return exact_sum(x, dims, keepdim, _F64, like)


def _shifted(x: torch.Tensor, dim: int) -> torch.Tensor:
    x64 = x.to(_F64)
    top = x64.amax(dim=dim, keepdim=True)
    return x64 - torch.where(torch.isfinite(top), top, 0.0)


def softmax(x: torch.Tensor, dim: int, safe: bool = False) -> torch.Tensor:
    """exp(x - max) / sum(exp(x - max)) along `dim` (`safe`: rows all -inf give 0, not NaN)."""
    e = ew.exp(_shifted(x, dim))
    out = e / _sum(e, (dim,), x.dtype)
    if safe:
        out = torch.where((x == -math.inf).all(dim=dim, keepdim=True), 0.0, out)
    return out.to(x.dtype)


def softmax_backward(grad: torch.Tensor, out: torch.Tensor, dim: int) -> torch.Tensor:
    """y * (g - sum(g * y))."""
    g, y = grad.to(_F64), out.to(_F64)
    return (y * (g - _sum(g * y, (dim,), grad.dtype))).to(grad.dtype)


def log_softmax(x: torch.Tensor, dim: int) -> torch.Tensor:
    """(x - max) - log(sum(exp(x - max)))."""
    shifted = _shifted(x, dim)
    return (shifted - ew.log(_sum(ew.exp(shifted), (dim,), x.dtype))).to(x.dtype)


def log_softmax_backward(grad: torch.Tensor, out: torch.Tensor, dim: int) -> torch.Tensor:
    """g - exp(y) * sum(g)."""
    g = grad.to(_F64)
    return (g - ew.exp(out.to(_F64)) * _sum(g, (dim,), grad.dtype)).to(grad.dtype)


def _nll_weights(x, target, weight, ignore_index):
    safe = torch.where(target == ignore_index, 0, target)
    w = torch.ones(target.shape, dtype=_F64, device=x.device)
    if weight is not None:
        w = weight.to(_F64)[safe]
    return safe, torch.where(target == ignore_index, 0.0, w)


def nll_loss(x, target, weight, reduction: int, ignore_index: int):
    """aten.nll_loss_forward: (loss, total weight); reduction 0 none, 1 mean, 2 sum."""
    safe, w = _nll_weights(x, target, weight, ignore_index)
    rows = x.to(_F64) if x.dim() > 1 else x.to(_F64).unsqueeze(0)
    picked = -rows.gather(1, safe.reshape(-1, 1)).reshape(target.shape) * w
    total = exact_sum(w, None, False, _F64, x.dtype)
    if reduction == 0:
        return picked.to(x.dtype), torch.zeros((), dtype=x.dtype, device=x.device)
    loss = exact_sum(picked, None, False, _F64, x.dtype)
    if reduction == 1:
        loss = loss / total
    return loss.to(x.dtype), total.to(x.dtype)


def nll_loss_backward(grad, x, target, weight, reduction: int, ignore_index: int, total):
    """aten.nll_loss_backward: -w * g (divided by the total weight for the mean) at each target."""
    safe, w = _nll_weights(x, target, weight, ignore_index)
    g = grad.to(_F64)
    value = -(w * g) if reduction == 0 else -(w * g)
    if reduction == 1:
        value = value / total.to(_F64)
    rows = torch.zeros(x.shape if x.dim() > 1 else (1, x.shape[0]), dtype=_F64, device=x.device)
    rows.scatter_(1, safe.reshape(-1, 1), value.reshape(-1, 1))
    return rows.reshape(x.shape).to(x.dtype)


def layer_norm(x, shape, weight, bias, eps: float):
    """aten.native_layer_norm: (out, mean, rstd) over the last len(shape) dimensions."""
    dims = tuple(range(x.dim() - len(shape), x.dim()))
    n = math.prod(shape)
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
    fast = native.chansum(expr, x, y, m, s, w, _beta(terms, 1), slices_for(like))
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
    fast = native.chanmap(expr, x, y, m, s, w, b, p1, p2, dtype)
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
    gi = None
    if mask[0]:
        if train:
            p1 = _chan_sum(3, x, grad, None, None, w, x.dtype) / n
            p2 = _chan_sum(4, x, grad, mean, invstd, w, x.dtype) / n
            gi = _chan_map(1, x, grad, mean, invstd, w, None, p1, p2, x.dtype)
        else:
            gi = _chan_map(2, x, grad, None, invstd, w, None, None, None, x.dtype)
    gw = _chan_sum(2, x, grad, mean, invstd, None, x.dtype).to(x.dtype) if mask[1] else None
    gb = _chan_sum(0, grad, None, None, None, None, x.dtype).to(x.dtype) if mask[2] else None
    return gi, gw, gb


def group_norm(x, weight, bias, n, c, hw, groups, eps):
    """aten.native_group_norm: (out, mean, rstd), the statistics shaped (N, groups)."""
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


def _as_2d(x, weight, stride, padding, dilation):
    """A 1-d convolution's operands and settings as a 2-d one's (height 1)."""
    if x.dim() == 3:
        return x.unsqueeze(2), weight.unsqueeze(2), (1, *stride), (0, *padding), (1, *dilation)
    if x.dim() != 4:
        raise Unsupported("only 1-d and 2-d convolutions are portable")
    return x, weight, tuple(stride), tuple(padding), tuple(dilation)


def _columns(x, weight, stride, padding, dilation):
    kernel = weight.shape[-2:]
    return F.unfold(x, kernel, dilation=dilation, padding=padding, stride=stride)


def _out_size(size, k, s, p, d):
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


def convolution(x, weight, bias, stride, padding, dilation, transposed, out_pad, groups):
    """aten.convolution (not transposed): columns of the input times the weight, exactly."""
    if transposed:
        raise Unsupported("transposed convolutions are not portable yet")
    squeeze = x.dim() == 3
    x4, w4, stride, padding, dilation = _as_2d(x, weight, stride, padding, dilation)
    n, cout = x4.shape[0], w4.shape[0]
    cols = _columns(x4, w4, stride, padding, dilation)
    k, cg = cols.shape[1] // groups, cout // groups
    length = cols.shape[-1]
    w = w4.reshape(groups, cg, k)
    parts = []
    for g in range(groups):  # (cg, k) @ (k, n * L): each output column scaled over its k inputs
        columns = cols[:, g * k : (g + 1) * k].permute(1, 0, 2).reshape(k, n * length)
        if bias is not None:
            b = bias[g * cg : (g + 1) * cg].reshape(cg, 1)
            part = exact_addmm(b, w[g], columns, x.dtype)
        else:
            part = exact_matmul(w[g], columns, x.dtype)
        parts.append(part.reshape(cg, n, length))
    out = torch.cat(parts, 0).permute(1, 0, 2).contiguous()  # NCHW, as torch's kernels give
    hw = [
        _out_size(x4.shape[i + 2], w4.shape[i + 2], stride[i], padding[i], dilation[i])
        for i in (0, 1)
    ]
    out = out.reshape(n, cout, *hw)
    return out.squeeze(2) if squeeze else out


def convolution_backward(
    go, x, weight, bias_sizes, stride, padding, dilation, transposed, out_pad, groups, mask
):
    """aten.convolution_backward: (grad input, grad weight, grad bias), each exact."""
    if transposed:
        raise Unsupported("transposed convolutions are not portable yet")
    squeeze = x.dim() == 3
    x4, w4, stride, padding, dilation = _as_2d(x, weight, stride, padding, dilation)
    go4 = go.unsqueeze(2) if squeeze else go
    n, cout, kernel = x4.shape[0], w4.shape[0], tuple(w4.shape[-2:])
    cg = cout // groups
    g = go4.reshape(n, groups, cg, -1)
    gi = gw = gb = None
    if mask[2]:
        gb = exact_sum(go4, (0, 2, 3), False, go.dtype)
    if mask[1]:
        cols = _columns(x4, w4, stride, padding, dilation)
        k = cols.shape[1] // groups
        a = g.permute(1, 2, 0, 3).reshape(groups, cg, -1)
        b = cols.reshape(n, groups, k, -1).permute(1, 0, 3, 2).reshape(groups, -1, k)
        gw = exact_matmul(a, b, weight.dtype).reshape(weight.shape)
    if mask[0]:
        k = w4.shape[1] * kernel[0] * kernel[1]
        wt = w4.reshape(groups, cg, k).transpose(1, 2)  # (groups, k, cg)
        size = tuple(x4.shape[-2:])

        def form(a, b):  # the columns' gradient, folded back onto the input (sums of overlaps)
            cols = torch.matmul(a.unsqueeze(0), b).reshape(n, groups * k, -1)
            return F.fold(cols, size, kernel, dilation=dilation, padding=padding, stride=stride)

        def scale(ua, ub):
            return ua.reshape(()) * ub.reshape(n, 1, 1, 1)

        terms = cg * kernel[0] * kernel[1]
        gi = exact_bilinear(wt, g, form, None, (1, 2, 3), terms, x.dtype, scale=scale)
        gi = gi.squeeze(2) if squeeze else gi
    if squeeze and gw is not None:
        gw = gw.squeeze(2)
    return gi, gw, gb


def embedding_backward(grad, indices, num_weights: int, padding_idx: int, by_freq: bool):
    """aten.embedding_dense_backward: each row's gradients added up exactly (index_add of
    integer slices), divided by the index's count when scaled by frequency."""
    rows = grad.reshape(-1, grad.shape[-1])
    idx = indices.reshape(-1)
    keep = idx != padding_idx
    rows, idx = rows[keep], idx[keep]

    def form(a, b):  # a: one-hot rows chosen by idx (never built), b: the gradient rows
        out = torch.zeros(num_weights, b.shape[-1], dtype=_F64, device=b.device)
        return out.index_add_(0, idx, b * a)

    def scale(ua, ub):
        return ua * ub.reshape(1, -1)

    ones = torch.ones(rows.shape[0], 1, dtype=_F64, device=grad.device)
    counts = torch.bincount(idx, minlength=num_weights).to(_F64).reshape(-1, 1)
    out = exact_bilinear(
        ones, rows, form, None, (0,), max(1, rows.shape[0]), _F64, scale, grad.dtype
    )
    if by_freq:
        out = out / torch.clamp(counts, min=1.0)
    return out.to(grad.dtype)
