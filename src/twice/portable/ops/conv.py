"""Convolutions in portable mode, forward and backward, 1-d to 3-d, ordinary and transposed:
the input's windows cut into integers, times the weight's, exactly (exact.py), each output
rounded once; a float64 forward and weight gradient are the ordered product of the columns
(ordered.py: each output's sum in the window's order).

The forward is `weight @ columns`, the weight cut into slices once and each column of the input
on its own grid: an output's bits depend on its window and the weight alone. The input's
gradient is the weight's transpose times the output's gradient, folded back onto the input,
each sample on its own grid. The weight's gradient sums over every sample and position on grids
fixed over the whole batch. The compiled kernels (native_conv) multiply a few columns at a time
in cache: the same integers and exact sums as the torch steps, so the same bits. A transposed
convolution is the input gradient of the ordinary one; 3-d ones go through the 2-d (conv3d.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from twice.portable import native
from twice.portable.arithmetic.exact import (
    Repeated,
    beta_for,
    exact_bilinear,
    exact_matmul,
    exact_sum,
    integer_matmul,
    slices_for,
    unit_for,
)
from twice.portable.native import conv as native_conv
from twice.portable.ops import conv3d, transposed_conv
from twice.portable.ops.conv3d import out_size as _out_size
from twice.portable.ops.nn import Unsupported

__all__ = ["convolution", "convolution_backward", "COLUMN_CHUNK", "WHOLE_WEIGHT_GRAD"]


def _expanded(x, *settings):
    """One value per spatial dimension (aten takes one for all: "valid" padding is `[0]`)."""
    return [tuple(s) * (x.dim() - 2) if len(s) == 1 else tuple(s) for s in settings]


def _as_2d(x, weight, stride, padding, dilation):
    """A 1-d convolution's operands and settings as a 2-d one's (height 1)."""
    if x.dim() == 3:
        return x.unsqueeze(2), weight.unsqueeze(2), (1, *stride), (0, *padding), (1, *dilation)
    if x.dim() != 4:
        raise Unsupported("only 1-d, 2-d and 3-d convolutions are portable")
    return x, weight, tuple(stride), tuple(padding), tuple(dilation)


def _columns(x, weight, stride, padding, dilation):
    """The input's windows as a (C * kh * kw, N * Ho * Wo) matrix (unfold's rows, the batch and
    positions as columns), in one copy of a strided view of the padded input."""
    xp = F.pad(x, (padding[1], padding[1], padding[0], padding[0]))
    windows = _windows(xp, weight.shape[-2:], stride, dilation)
    c, kh, kw, n, ho, wo = windows.shape
    return windows.reshape(c * kh * kw, n * ho * wo)


def _window_amax(x, kernel, stride, padding, dilation) -> torch.Tensor:
    """The largest magnitude of each row of the columns (channel, offset) over every sample and
    position, in float64, without unfolding them: the samples' largest magnitudes first, then
    each offset's over the windows of the padded result."""
    top = F.pad(x.abs().amax(dim=0), (padding[1], padding[1], padding[0], padding[0]))
    rows = _windows(top.unsqueeze(0), kernel, stride, dilation).amax(dim=(3, 4, 5))
    return rows.reshape(top.shape[0], -1).to(torch.float64)


def _windows(xp, kernel, stride, dilation):
    """The padded input's windows as a (C, kh, kw, N, Ho, Wo) view."""
    kh, kw = kernel
    n, c, hp, wp = xp.shape
    ho, wo = (
        _out_size(hp, kh, stride[0], 0, dilation[0]),
        _out_size(wp, kw, stride[1], 0, dilation[1]),
    )
    sn, sc, sh, sw = xp.stride()
    return xp.as_strided(
        (c, kh, kw, n, ho, wo),
        (sc, sh * dilation[0], sw * dilation[1], sn, sh * stride[0], sw * stride[1]),
    )


def _fold(cols, size, kernel, dilation, padding, stride):
    """F.fold of columns of integers held in float64: each kernel offset's slice added onto the
    padded input in one strided add (exact in any order: the sums stay below 2**53), much
    faster than col2im in float64."""
    n, kh, kw = cols.shape[0], kernel[0], kernel[1]
    c = cols.shape[1] // (kh * kw)
    ho = _out_size(size[0], kh, stride[0], padding[0], dilation[0])
    wo = _out_size(size[1], kw, stride[1], padding[1], dilation[1])
    parts = cols.reshape(n, c, kh, kw, ho, wo)
    out = cols.new_zeros(n, c, size[0] + 2 * padding[0], size[1] + 2 * padding[1])
    for i in range(kh):
        for j in range(kw):
            h0, w0 = i * dilation[0], j * dilation[1]
            window = out[
                :, :, h0 : h0 + stride[0] * (ho - 1) + 1 : stride[0],
                w0 : w0 + stride[1] * (wo - 1) + 1 : stride[1],
            ]  # fmt: skip
            window += parts[:, :, i, j]
    return out[:, :, padding[0] : padding[0] + size[0], padding[1] : padding[1] + size[1]]


COLUMN_CHUNK = 1 << 22
"""How many column elements a convolution unfolds at a time where the compiled kernels that
need no columns do not apply (32 MB of float64 integers; the input's gradient twice as many):
large enough that each product spreads over threads. Each output, and each sample's input
gradient, comes from its own columns, and the weight's gradient is one exact sum: no bit
depends on the chunk (tests vary it)."""

WHOLE_WEIGHT_GRAD = 1 << 21
"""Up to how many column elements the weight's gradient is one product of the whole columns
(faster for small convolutions than fixing the grids first); above, it goes by chunks."""


def _chunks(n: int, per_sample: int) -> list[tuple[int, int]]:
    step = max(1, COLUMN_CHUNK // max(1, per_sample))
    return [(lo, min(n, lo + step)) for lo in range(0, n, step)]


def convolution(x, weight, bias, stride, padding, dilation, transposed, out_pad, groups):
    """aten.convolution: columns of the input times the weight, exactly, in cache or a few
    samples at a time (the weight cut into slices once); transposed: transposed_conv.py."""
    stride, padding, dilation, out_pad = _expanded(x, stride, padding, dilation, out_pad)
    if x.numel() == 0 or weight.numel() == 0:  # no product: empty, or the bias alone (a copy)
        settings = (stride, padding, dilation, transposed, out_pad, groups)
        return torch.ops.aten.convolution.default(x, weight, bias, *settings)
    if transposed:
        settings = (stride, padding, dilation, out_pad, groups)
        return transposed_conv.forward(x, weight, bias, *settings, _PLANAR)
    if x.dim() == 5:  # the column route in 3-d
        return conv3d.convolution(x, weight, bias, stride, padding, dilation, groups, convolution)
    squeeze = x.dim() == 3
    x4, w4, stride, padding, dilation = _as_2d(x, weight, stride, padding, dilation)
    n, cout = x4.shape[0], w4.shape[0]
    size, k_hw = x4.shape[2:], w4.shape[2:]
    hw = [_out_size(size[i], k_hw[i], stride[i], padding[i], dilation[i]) for i in (0, 1)]
    length, cg = hw[0] * hw[1], cout // groups
    k = w4.shape[1] * w4.shape[2] * w4.shape[3]
    w = w4.reshape(groups, cg, k)
    left = [Repeated(w[g], x.dtype, "left") for g in range(groups)]
    out = torch.empty(n, cout, length, dtype=x.dtype, device=x.device)
    geometry = (tuple(w4.shape[-2:]), stride, padding, dilation, hw)
    done = set()
    for g in range(groups):  # the whole batch at once, with no columns in memory
        if native_conv.forward(x4, geometry, (g * w4.shape[1], w4.shape[1]), left[g], out, g * cg):
            if bias is not None:
                bias_g = bias[g * cg : (g + 1) * cg].reshape(cg, 1).to(x.dtype)
                out[:, g * cg : (g + 1) * cg] += bias_g  # torch.add's rounding, as below
            done.add(g)
    for lo, hi in _chunks(n, groups * k * length) if len(done) < groups else ():
        cols = None
        for g in range(groups):  # (cg, k) @ (k, samples * L): each column scaled over its k
            if g in done:
                continue
            if cols is None:
                cols = _columns(x4[lo:hi], w4, stride, padding, dilation)
            part = left[g](cols[g * k : (g + 1) * k])
            if bias is not None:
                part = torch.add(part, bias[g * cg : (g + 1) * cg].reshape(cg, 1).to(x.dtype))
            out[lo:hi, g * cg : (g + 1) * cg] = part.reshape(cg, hi - lo, length).transpose(0, 1)
    out = out.reshape(n, cout, *hw)
    return out.squeeze(2) if squeeze else out


def convolution_backward(
    go, x, weight, bias_sizes, stride, padding, dilation, transposed, out_pad, groups, mask
):
    """aten.convolution_backward: (grad input, grad weight, grad bias), each exact."""
    stride, padding, dilation, out_pad = _expanded(x, stride, padding, dilation, out_pad)
    if x.numel() == 0 or go.numel() == 0 or weight.numel() == 0:  # no product: zeros, empties
        settings = (stride, padding, dilation, transposed, out_pad, groups, mask)
        return torch.ops.aten.convolution_backward.default(go, x, weight, bias_sizes, *settings)
    if transposed:
        settings = (stride, padding, dilation, groups, mask)
        return transposed_conv.backward(go, x, weight, *settings, _PLANAR)
    if x.dim() == 5:
        settings = (stride, padding, dilation, groups, mask)
        return conv3d.convolution_backward(go, x, weight, *settings, _PLANAR)
    squeeze = x.dim() == 3
    x4, w4, stride, padding, dilation = _as_2d(x, weight, stride, padding, dilation)
    go4 = go.unsqueeze(2) if squeeze else go
    n, cout = x4.shape[0], w4.shape[0]
    cg = cout // groups
    g = go4.reshape(n, groups, cg, -1)
    gi = gw = gb = None
    if mask[2]:
        gb = exact_sum(go4, (0, 2, 3), False, go.dtype)
    if mask[1]:
        gw = _weight_grad(g, x4, w4, stride, padding, dilation, weight.dtype)
        if gw is None:
            cols = _columns(x4, w4, stride, padding, dilation)
            k = cols.shape[0] // groups
            a = g.permute(1, 2, 0, 3).reshape(groups, cg, -1)
            b = cols.reshape(groups, k, -1).transpose(1, 2)  # (groups, N * L, k), read in place
            gw = exact_matmul(a, b, weight.dtype)
        gw = gw.reshape(weight.shape)
    if mask[0]:
        gi = _input_grad(g, w4, tuple(x4.shape[-2:]), stride, padding, dilation, x.dtype)
        gi = gi.squeeze(2) if squeeze else gi
    if squeeze and gw is not None:
        gw = gw.squeeze(2)
    return gi, gw, gb


def _input_grad(g, w4, size, stride, padding, dilation, dtype):
    """The input's gradient: the weight's transpose times the output's gradient, folded back
    onto the input (sums of overlaps), each sample on its own grid and the weight on one. At
    stride 1 the forward kernel in cache (`native_conv.input_grad`, many input channels) or
    torch's own float64 kernel (`_torch_input_grad`) takes the integer product; else, a few
    samples at a time, it is folded, scaled and rounded in one compiled pass, or, where the
    compiled kernels do not apply, `exact_bilinear` takes the same steps one by one."""
    n, groups, cg, _ = g.shape
    kernel = tuple(w4.shape[-2:])
    k = w4.shape[1] * kernel[0] * kernel[1]
    wt = w4.reshape(groups, cg, k).transpose(1, 2)  # (groups, k, cg)
    terms = cg * kernel[0] * kernel[1]
    beta = beta_for(terms, 2)
    whole = slices_for(dtype) == 1 and native.split_rows(wt, None, beta)

    def form(a, b):
        cols = integer_matmul(a.unsqueeze(0), b).reshape(b.shape[0], groups * k, -1)
        return _fold(cols, size, kernel, dilation, padding, stride)

    def scale(ua, ub):
        return ua.reshape(()) * ub.reshape(-1, 1, 1, 1)

    if whole:
        for route in (native_conv.input_grad, _torch_input_grad):
            fast = route(g, whole[0], w4.shape, size, stride, padding, dilation, beta, dtype)
            if fast is not None:
                return fast
    gi = torch.empty(g.shape[0], groups * w4.shape[1], *size, dtype=dtype, device=g.device)
    for lo, hi in _chunks(n, groups * k * g.shape[-1] // 2):
        part = whole and native.split_rows(g[lo:hi], (1, 2, 3), beta)
        if part:
            (ints_w, unit_w), (ints_g, unit_g) = whole[0], part[0]
            cols = _integer_columns(ints_w, ints_g)
            part = native_conv.fold_scaled(
                cols, size, kernel, stride, padding, dilation, unit_w, unit_g.reshape(-1), dtype
            )
        if part is None or part is False:
            part = exact_bilinear(wt, g[lo:hi], form, None, (1, 2, 3), terms, dtype, scale=scale)
        gi[lo:hi] = part
    return gi


# Below this many output positions a sample, the samples' columns are one matrix product: a
# product per sample is too narrow to run at the float64 rate (float64 products timed side by
# side, 2 threads, AMD EPYC with AVX-512: one product took 0.13x to 0.73x the time at 1 to 64
# positions, DCGAN's and strided shapes; 0.93x to 1.30x from 256)
ONE_PRODUCT_BELOW = 256


def _integer_columns(ints_w, ints_g):
    """The integer columns weight^T @ gradient, (samples, groups * k, positions), for weight
    integers (groups, k, cg) and gradient integers (samples, groups, cg, positions): exact sums
    of integers, so one product over every sample's positions and one per sample are the same
    values, and the faster is taken. (Not always the same sign of a zero sum, which BLAS sets
    by where it starts: the fold adds every sum onto +0.0, exact.py's ZERO_SIGN.)"""
    m, groups, cg, positions = ints_g.shape
    if positions >= ONE_PRODUCT_BELOW:
        return integer_matmul(ints_w.unsqueeze(0), ints_g).reshape(m, -1, positions)
    wide = ints_g.permute(1, 2, 0, 3).reshape(groups, cg, m * positions)
    cols = integer_matmul(ints_w, wide).reshape(groups, -1, m, positions)
    return cols.permute(2, 0, 1, 3).reshape(m, -1, positions)


_BACKENDS = getattr(torch._C, "_ConvBackend", None)
_SUMS_OF_PRODUCTS = tuple(
    getattr(_BACKENDS, name) for name in ("Slow2d", "SlowDilated2d") if hasattr(_BACKENDS, name)
)


def _backend(*args):
    """torch's choice of convolution kernel for these arguments, or None where this torch does
    not say (a private function: its absence or another signature only keeps the fold)."""
    try:
        return torch._C._select_conv_backend(*args)
    except (AttributeError, TypeError, RuntimeError):
        return None


def _torch_input_grad(g, weight_part, shape, size, stride, padding, dilation, beta, dtype):
    """`_input_grad`'s integer product by torch's own float64 convolution backward, where torch
    picks a kernel made of matrix products and column sums (Slow2d, SlowDilated2d: each sum of
    integers below 2**53 is exact in any order, so its result is the fold's, bit for bit), then
    scaled and rounded as the fold is. Its products run one sample per thread: for stride 1,
    0.46x to 0.96x the time of the chunked product and fold here; for stride 2, 1.2x to 1.8x, so
    strided convolutions keep the fold. None where it does not apply (a stride, torch would pick
    another kernel, a value is not finite, no compiled kernels)."""
    n, groups, cg, _ = g.shape
    if any(step != 1 for step in stride):
        return None
    ints_w, unit_w = weight_part
    like = native.empty((n, groups * shape[1], *size), torch.float64)
    ints_w = ints_w.transpose(1, 2).reshape(shape)  # back to (cout, cin / groups, kh, kw)
    zeros = [0, 0]
    backend = _backend(
        like, ints_w, None, list(stride), list(padding), list(dilation), False, zeros, groups, None
    )
    if backend is None or backend not in _SUMS_OF_PRODUCTS or not g.is_cpu:
        return None
    part = native.split_rows(g, (1, 2, 3), beta)
    if not part:
        return None
    ints_g, unit_g = part[0]
    out_hw = [_out_size(size[i], shape[2 + i], stride[i], padding[i], dilation[i]) for i in (0, 1)]
    ints_g = ints_g.reshape(n, groups * cg, *out_hw)
    total, _, _ = torch.ops.aten.convolution_backward(
        ints_g, like, ints_w, None, list(stride), list(padding), list(dilation), False, zeros,
        groups, [True, False, False],
    )  # fmt: skip
    total = total.reshape(n, groups * shape[1], -1)  # scaled and rounded: a fold of 1x1 windows
    return native_conv.fold_scaled(
        total, size, (1, 1), (1, 1), (0, 0), (1, 1), unit_w, unit_g.reshape(-1), dtype
    )


def _weight_grad(g, x4, w4, stride, padding, dilation, dtype):
    """The weight's gradient, the sum over every sample and position of the output gradient
    times the input's window: each operand's unit fixed first over the whole batch (an output
    channel's gradients; a window offset's inputs, its columns' row), the integer products (in
    cache for one group, else a few samples' columns at a time) add exactly into one float64
    sum, scaled and rounded once: `exact_matmul` of the whole columns, bit for bit. None where
    no compiled route applies (groups and columns of up to WHOLE_WEIGHT_GRAD elements, float64
    results, values that are not finite): the caller takes the whole product."""
    n, groups, cg, length = g.shape
    kh, kw = w4.shape[-2:]
    k = w4.shape[1] * kh * kw
    small = groups * k * n * length <= WHOLE_WEIGHT_GRAD  # one product of the columns is faster
    if (small and groups != 1) or slices_for(dtype) != 1 or not native.usable(g, x4):
        return None
    amax_a = g.abs().amax(dim=(0, 3)).to(torch.float64).reshape(groups * cg)
    amax_b = _window_amax(x4, (kh, kw), stride, padding, dilation).reshape(groups * k)
    if not bool(torch.isfinite(amax_a).all()) or not bool(torch.isfinite(amax_b).all()):
        return None
    beta = beta_for(n * length, 2)
    unit_a, unit_b = unit_for(amax_a, beta), unit_for(amax_b, beta)
    total = None
    out_hw = [
        _out_size(x4.shape[2 + i], (kh, kw)[i], stride[i], padding[i], dilation[i]) for i in (0, 1)
    ]
    if groups == 1:  # the whole batch's product with no columns in memory
        ints_a = native.split_given(
            g.reshape(n, cg, length).transpose(0, 1).reshape(cg, -1), unit_a
        )
        geometry = ((kh, kw), stride, padding, dilation, out_hw)
        total = None if ints_a is None else native_conv.weight_grad(x4, geometry, ints_a, unit_b)
        if total is not None:
            return native.scaled(total, unit_a.reshape(cg, 1), unit_b.reshape(1, k), dtype, None)
    if small:
        return None
    for lo, hi in _chunks(n, groups * k * length):
        a = g[lo:hi].permute(1, 2, 0, 3).reshape(groups * cg, -1)
        ints_a = native.split_given(a, unit_a)
        ints_b = native_conv.columns_given(
            x4[lo:hi], (kh, kw), stride, padding, dilation, out_hw, unit_b
        )
        if ints_b is None:
            cols = _columns(x4[lo:hi], w4, stride, padding, dilation)
            ints_b = native.split_given(cols, unit_b)
        part = integer_matmul(ints_a.reshape(groups, cg, -1), ints_b.reshape(groups, k, -1).mT)
        total = part if total is None else total.add_(part)
    units = unit_a.reshape(groups, cg, 1), unit_b.reshape(groups, 1, k)
    return native.scaled(total, *units, dtype, None)


_PLANAR = (convolution, convolution_backward)  # what conv3d and transposed_conv call back
