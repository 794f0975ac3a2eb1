"""Convolutions with three spatial dimensions in portable mode, forward and backward, through
conv.py's 2-d convolution and its compiled kernels (conv.py sends 5-d operands here, and its
transposed convolution, the input gradient of an ordinary one, reaches them through it).

Each output depth's input planes become channels (`_slabs`, one copy) and the weight's depth
joins its input channels: one 2-d convolution then forms every output from the same products
as the 3-d one, exactly, rounded once (float64: in order), each window on its own, so its bits
depend on its window and the weight alone, not on the batch. The weight's gradient is the 2-d
one of the same planes (one sum over the whole batch). At stride 1 the input's gradient is a
forward convolution of the output gradient (conv_transpose's identity); at other strides the
weight's transpose times the output's gradient, each sample on its own grid, is folded back
onto the input as integers (exact in any order), then rounded once.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from twice.portable.arithmetic.exact import exact_bilinear, exact_sum, integer_matmul

__all__ = ["convolution", "convolution_backward", "out_size", "COLUMN_CHUNK"]

_F64 = torch.float64

COLUMN_CHUNK = 1 << 22
"""How many column elements are unfolded at a time (32 MB of float64), as conv.COLUMN_CHUNK:
each output, and each sample's input gradient, comes from its own columns, so no bit depends
on it (tests vary it)."""


def out_size(size, k, s, p, d):
    """A convolution's output length along one dimension."""
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


def _out_sizes(x, kernel, stride, padding, dilation) -> list[int]:
    return [
        out_size(x.shape[2 + i], kernel[i], stride[i], padding[i], dilation[i]) for i in range(3)
    ]


def _chunks(n: int, per_sample: int) -> list[tuple[int, int]]:
    step = max(1, COLUMN_CHUNK // max(1, per_sample))
    return [(lo, min(n, lo + step)) for lo in range(0, n, step)]


def _fold(cols, size, kernel, stride, padding, dilation):
    """F.fold in 3-d of columns (N, C * kd * kh * kw, Do * Ho * Wo) of integers held in float64:
    each kernel offset's slice added onto the padded input in one strided add (exact in any
    order: the sums stay below 2**53)."""
    n = cols.shape[0]
    c = cols.shape[1] // math.prod(kernel)
    outs = [out_size(size[i], kernel[i], stride[i], padding[i], dilation[i]) for i in range(3)]
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


def _slabs(x, kd: int, stride: int, padding: int, dilation: int) -> torch.Tensor:
    """The input's depth windows as planes: (N * Do, C * kd, H, W), each output depth's kd
    input planes (depth padding included) as channels, channel-major, in one copy."""
    xp = F.pad(x, (0, 0, 0, 0, padding, padding))
    n, c, depth, h, w = xp.shape
    out = out_size(depth, kd, stride, 0, dilation)
    sn, sc, sd, sh, sw = xp.stride()
    windows = xp.as_strided((n, out, c, kd, h, w), (sn, sd * stride, sc, sd * dilation, sh, sw))
    return windows.reshape(n * out, c * kd, h, w)


def convolution(x, weight, bias, stride, padding, dilation, groups, planar):
    """aten.convolution for 5-d operands (not transposed) as one 2-d convolution (`planar`,
    conv.convolution): each output depth's input planes become channels, the weight's depth
    joins its input channels, so every output is the same sum of the same products, exact and
    rounded once by the compiled 2-d kernels (its window and the weight alone give its bits)."""
    n, cout, kd = x.shape[0], weight.shape[0], weight.shape[2]
    slabs = _slabs(x, kd, stride[0], padding[0], dilation[0])
    planes = weight.reshape(cout, -1, *weight.shape[3:])
    out = planar(slabs, planes, bias, stride[1:], padding[1:], dilation[1:], False, (0, 0), groups)
    return out.reshape(n, -1, *out.shape[1:]).transpose(1, 2).contiguous()


def convolution_backward(go, x, weight, stride, padding, dilation, groups, mask, planar):
    """aten.convolution_backward for 5-d operands (not transposed): (grad input, grad weight,
    grad bias), each exact then rounded once (`planar`: conv's 2-d convolution and its
    backward). The weight's gradient is the 2-d one of the planes: the same products summed
    over the whole batch. At stride 1 the input's gradient is the forward convolution of the
    padded output gradient by the flipped, transposed weight (conv_transpose's identity); at
    other strides the columns are folded back (`_input_grad`)."""
    cout, kd = weight.shape[0], weight.shape[2]
    gi = gw = gb = None
    if mask[2]:
        gb = exact_sum(go, (0, 2, 3, 4), False, go.dtype)
    if mask[1]:
        slabs = _slabs(x, kd, stride[0], padding[0], dilation[0])
        go2 = go.transpose(1, 2).reshape(-1, cout, *go.shape[3:])
        planes = weight.reshape(cout, -1, *weight.shape[3:])
        settings = (stride[1:], padding[1:], dilation[1:], False, (0, 0), groups)
        gw = planar[1](go2, slabs, planes, None, *settings, [False, True, False])[1]
        gw = gw.reshape(weight.shape)
    if mask[0] and tuple(stride) == (1, 1, 1):
        size = tuple(x.shape[2:])
        gi = _input_grad_forward(go, weight, size, padding, dilation, groups, planar[0])
    elif mask[0]:
        g = go.reshape(go.shape[0], groups, cout // groups, -1)
        gi = _input_grad(g, weight, tuple(x.shape[2:]), stride, padding, dilation, x.dtype)
    return gi, gw, gb


def _input_grad_forward(go, weight, size, padding, dilation, groups, planar):
    """At stride 1: the output gradient padded by dilation (k - 1) - padding (cropped where
    that is negative), convolved with the weight flipped in space and with its channels
    exchanged per group: a forward convolution (each window on its own grid)."""
    kernel = weight.shape[2:]
    pads = []
    for i in reversed(range(3)):
        before = dilation[i] * (kernel[i] - 1) - padding[i]
        after = size[i] - (go.shape[2 + i] + before - dilation[i] * (kernel[i] - 1))
        pads += [before, after]
    padded = F.pad(go, pads)
    cout, cin = weight.shape[0], weight.shape[1]
    flipped = weight.flip(2, 3, 4).reshape(groups, cout // groups, cin, *kernel)
    turned = flipped.transpose(1, 2).reshape(groups * cin, cout // groups, *kernel)
    ones, zeros = (1, 1, 1), (0, 0, 0)
    return convolution(padded, turned, None, ones, zeros, dilation, groups, planar)


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
        cols = integer_matmul(a.unsqueeze(0), b).reshape(b.shape[0], groups * k, -1)
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
