"""Convolutions with three spatial dimensions in portable mode, forward and backward: the
input's windows unfolded exactly (a copy), times the weight's, exactly (exact.py), each output
rounded once.

conv.py's column route in 3-d (conv.py sends 5-d operands here, and its transposed convolution,
the input gradient of an ordinary one, reaches them through it). The forward is `weight @
columns`, the weight cut into slices once and each column (one window) on its own grid: an
output's bits depend on its window and the weight alone, not on the batch. The input's gradient
is the weight's transpose times the output's gradient, each sample on its own grid, folded back
onto the input (integers: exact in any order). The weight's gradient is one exact product of the
output gradient and the whole batch's columns, each operand's grids fixed over the batch.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from twice.portable.arithmetic.exact import Repeated, exact_bilinear, exact_matmul, exact_sum

__all__ = ["convolution", "convolution_backward", "COLUMN_CHUNK"]

_F64 = torch.float64

COLUMN_CHUNK = 1 << 22
"""How many column elements are unfolded at a time (32 MB of float64), as conv.COLUMN_CHUNK:
each output, and each sample's input gradient, comes from its own columns, so no bit depends
on it (tests vary it)."""


def _out_size(size, k, s, p, d):
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


def _out_sizes(x, kernel, stride, padding, dilation) -> list[int]:
    return [
        _out_size(x.shape[2 + i], kernel[i], stride[i], padding[i], dilation[i]) for i in range(3)
    ]


def _chunks(n: int, per_sample: int) -> list[tuple[int, int]]:
    step = max(1, COLUMN_CHUNK // max(1, per_sample))
    return [(lo, min(n, lo + step)) for lo in range(0, n, step)]


def _columns(x, kernel, stride, padding, dilation):
    """The input's windows as a (C * kd * kh * kw, N * Do * Ho * Wo) matrix, in one copy of a
    strided view of the padded input."""
    xp = F.pad(x, (padding[2], padding[2], padding[1], padding[1], padding[0], padding[0]))
    n, c = xp.shape[:2]
    sizes = _out_sizes(xp, kernel, stride, (0, 0, 0), dilation)
    sn, sc, *spatial = xp.stride()
    windows = xp.as_strided(
        (c, *kernel, n, *sizes),
        (sc, *(spatial[i] * dilation[i] for i in range(3)), sn,
         *(spatial[i] * stride[i] for i in range(3))),
    )  # fmt: skip
    return windows.reshape(c * math.prod(kernel), n * math.prod(sizes))


def _fold(cols, size, kernel, stride, padding, dilation):
    """F.fold in 3-d of columns (N, C * kd * kh * kw, Do * Ho * Wo) of integers held in float64:
    each kernel offset's slice added onto the padded input in one strided add (exact in any
    order: the sums stay below 2**53)."""
    n = cols.shape[0]
    c = cols.shape[1] // math.prod(kernel)
    outs = [_out_size(size[i], kernel[i], stride[i], padding[i], dilation[i]) for i in range(3)]
    parts = cols.reshape(n, c, *kernel, *outs)
    out = cols.new_zeros(n, c, *(size[i] + 2 * padding[i] for i in range(3)))
    for i in range(kernel[0]):
        for j in range(kernel[1]):
            for k in range(kernel[2]):
                starts = (i * dilation[0], j * dilation[1], k * dilation[2])
                window = out[
                    (slice(None), slice(None))
                    + tuple(
                        slice(starts[a], starts[a] + stride[a] * (outs[a] - 1) + 1, stride[a])
                        for a in range(3)
                    )
                ]
                window += parts[:, :, i, j, k]
    return out[
        (slice(None), slice(None))
        + tuple(slice(padding[a], padding[a] + size[a]) for a in range(3))
    ]


def convolution(x, weight, bias, stride, padding, dilation, groups):
    """aten.convolution for 5-d operands (not transposed): each group's weight times the
    columns of a few samples at a time, exactly, plus the bias (one addition)."""
    n, cout = x.shape[0], weight.shape[0]
    kernel = tuple(weight.shape[2:])
    sizes = _out_sizes(x, kernel, stride, padding, dilation)
    length, cg = math.prod(sizes), cout // groups
    k = weight.shape[1] * math.prod(kernel)
    w = weight.reshape(groups, cg, k)
    left = [Repeated(w[g], x.dtype, "left") for g in range(groups)]
    out = torch.empty(n, cout, length, dtype=x.dtype, device=x.device)
    for lo, hi in _chunks(n, groups * k * length):
        cols = _columns(x[lo:hi], kernel, stride, padding, dilation)
        for g in range(groups):  # (cg, k) @ (k, samples * L): each column on its own grid
            part = left[g](cols[g * k : (g + 1) * k])
            if bias is not None:
                part = torch.add(part, bias[g * cg : (g + 1) * cg].reshape(cg, 1).to(x.dtype))
            out[lo:hi, g * cg : (g + 1) * cg] = part.reshape(cg, hi - lo, length).transpose(0, 1)
    return out.reshape(n, cout, *sizes)


def convolution_backward(go, x, weight, stride, padding, dilation, groups, mask):
    """aten.convolution_backward for 5-d operands (not transposed): (grad input, grad weight,
    grad bias), each exact then rounded once."""
    n, cout = x.shape[0], weight.shape[0]
    kernel = tuple(weight.shape[2:])
    cg = cout // groups
    g = go.reshape(n, groups, cg, -1)
    gi = gw = gb = None
    if mask[2]:
        gb = exact_sum(go, (0, 2, 3, 4), False, go.dtype)
    if mask[1]:  # grids fixed over the whole batch: an output channel's, a window offset's
        cols = _columns(x, kernel, stride, padding, dilation)
        k = cols.shape[0] // groups
        a = g.permute(1, 2, 0, 3).reshape(groups, cg, -1)
        b = cols.reshape(groups, k, -1).transpose(1, 2)
        gw = exact_matmul(a, b, weight.dtype).reshape(weight.shape)
    if mask[0]:
        gi = _input_grad(g, weight, tuple(x.shape[2:]), stride, padding, dilation, x.dtype)
    return gi, gw, gb


def _input_grad(g, weight, size, stride, padding, dilation, dtype):
    """The input's gradient: the weight's transpose (one grid) times the output's gradient
    (each sample on its own grid), folded back onto the input, a few samples at a time. Those
    grids are coarse (a whole sample's, the whole weight's), so each operand is cut into
    float64's three slices: one slice's 23 bits below the largest magnitude lost too much of a
    small output of a transposed convolution (the OpInfo's samples: 1.3 times the tolerance)."""
    n, groups, cg, length = g.shape
    kernel = tuple(weight.shape[2:])
    k = weight.shape[1] * math.prod(kernel)
    wt = weight.reshape(groups, cg, k).transpose(1, 2)  # (groups, k, cg)

    def form(a, b):
        cols = torch.matmul(a.unsqueeze(0), b).reshape(b.shape[0], groups * k, -1)
        return _fold(cols, size, kernel, stride, padding, dilation)

    def scale(ua, ub):
        return ua.reshape(()) * ub.reshape(-1, 1, 1, 1, 1)

    terms = cg * math.prod(kernel)
    gi = torch.empty(n, groups * weight.shape[1], *size, dtype=dtype, device=g.device)
    for lo, hi in _chunks(n, groups * k * length // 2):
        gi[lo:hi] = exact_bilinear(
            wt, g[lo:hi], form, None, (1, 2, 3), terms, dtype, scale=scale, precision=_F64
        )
    return gi
