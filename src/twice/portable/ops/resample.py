"""Portable kernels for resampling: linear, bilinear, trilinear, bicubic and anti-aliased
interpolation and adaptive average pooling as products with per-axis weight matrices,
nearest-neighbour gradients as exact sums.

Interpolation and adaptive average pooling are separable: along each spatial axis the
output is a fixed matrix W (out x in) times the input, so y = W_h x W_w^T and the input's gradient
is W_h^T g W_w. Both run as exact.py's products (float64 ones in order) with W built once, in the
formulas torch uses for its source indices, so the forward and the backward are each other's
adjoint and every bit depends on the values alone.
"""

from __future__ import annotations

import math

import torch

from twice.portable.arithmetic.exact import exact_matmul
from twice.portable.dispatch.table import kernel
from twice.portable.ops.linear import exact_linear
from twice.portable.ops.math import floating

__all__ = ["linear_weights", "adaptive_weights", "cubic_weights", "aa_weights"]

_F64 = torch.float64
aten = torch.ops.aten


def _onehot(index: torch.Tensor, size: int) -> torch.Tensor:
    return (index.unsqueeze(1) == torch.arange(size).unsqueeze(0)).to(_F64)


def linear_weights(size_in: int, size_out: int, align_corners: bool, scale) -> torch.Tensor:
    """W (size_out x size_in) of linear interpolation along one axis, as torch places sources:
    with aligned corners o (in-1)/(out-1), otherwise (o + 1/2) r - 1/2 clamped at 0, where r is
    1/scale when a scale factor is given and in/out otherwise."""
    o = torch.arange(size_out, dtype=_F64)
    if align_corners:
        ratio = (size_in - 1) / (size_out - 1) if size_out > 1 else 0.0
        source = o * ratio
    else:
        ratio = 1.0 / scale if scale else size_in / size_out
        source = torch.clamp((o + 0.5) * ratio - 0.5, min=0.0)
    low = torch.clamp(torch.floor(source), max=size_in - 1).to(torch.int64)
    high = torch.clamp(low + 1, max=size_in - 1)
    upper = source - low.to(_F64)
    return (1.0 - upper).unsqueeze(1) * _onehot(low, size_in) + upper.unsqueeze(1) * _onehot(
        high, size_in
    )


def _source_scale(size_in: int, size_out: int, align_corners: bool, scale) -> float:
    """torch's area_pixel_compute_scale: input pixels per output pixel."""
    if align_corners:
        return (size_in - 1) / (size_out - 1) if size_out > 1 else 0.0
    return 1.0 / scale if scale and scale > 0 else size_in / size_out


def _cubic(x: torch.Tensor, a: float, near: bool) -> torch.Tensor:
    """Keys' cubic convolution kernel at |x| <= 1 (near) or 1 < |x| < 2, torch's formulas."""
    if near:
        return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
    return ((a * x - 5.0 * a) * x + 8.0 * a) * x - 4.0 * a


def cubic_weights(size_in: int, size_out: int, align_corners: bool, scale) -> torch.Tensor:
    """W (size_out x size_in) of bicubic interpolation along one axis (A = -0.75), as torch
    places sources (not clamped) and takes its four taps (clamped to the edges, where the
    coefficients of one input add up in tap order)."""
    o = torch.arange(size_out, dtype=_F64)
    ratio = _source_scale(size_in, size_out, align_corners, scale)
    source = o * ratio if align_corners else (o + 0.5) * ratio - 0.5
    low = torch.floor(source)
    t = source - low
    coefficients = (
        _cubic(t + 1.0, -0.75, False),
        _cubic(t, -0.75, True),
        _cubic(1.0 - t, -0.75, True),
        _cubic(2.0 - t, -0.75, False),
    )
    rows = None
    for tap, coefficient in enumerate(coefficients):
        index = torch.clamp(low.to(torch.int64) - 1 + tap, 0, size_in - 1)
        term = coefficient.unsqueeze(1) * _onehot(index, size_in)
        rows = term if rows is None else rows + term
    return rows


def _aa_linear(x: float) -> float:
    x = abs(x)
    return 1.0 - x if x < 1.0 else 0.0


def _aa_cubic(x: float) -> float:
    x, a = abs(x), -0.5  # PIL's coefficient, as torch's anti-aliased bicubic
    if x < 1.0:
        return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
    if x < 2.0:
        return ((a * x - 5.0 * a) * x + 8.0 * a) * x - 4.0 * a
    return 0.0


def aa_weights(taps: int, size_in: int, size_out: int, align_corners: bool, scale):
    """W (size_out x size_in) of anti-aliased interpolation along one axis, torch's filter
    (`taps` 2: linear, 4: cubic) widened by the scale when it shrinks, each row normalised to
    sum 1: Python's float64 arithmetic in torch's order."""
    filt = _aa_linear if taps == 2 else _aa_cubic
    ratio = _source_scale(size_in, size_out, align_corners, scale)
    support = taps * 0.5 * ratio if ratio >= 1.0 else taps * 0.5
    widest, inverse = math.ceil(support) * 2 + 1, 1.0 / ratio if ratio >= 1.0 else 1.0
    rows = torch.zeros(size_out, size_in, dtype=_F64)
    for i in range(size_out):
        center = ratio * (i + 0.5)
        start = max(int(center - support + 0.5), 0)
        count = min(max(min(int(center + support + 0.5), size_in) - start, 0), widest)
        values = [filt((j + start - center + 0.5) * inverse) for j in range(count)]
        total = 0.0
        for value in values:
            total += value
        if total != 0.0:
            values = [value / total for value in values]
        rows[i, start : start + count] = torch.tensor(values, dtype=_F64)
    return rows


def adaptive_weights(size_in: int, size_out: int) -> torch.Tensor:
    """W (size_out x size_in) of adaptive average pooling along one axis: row i averages
    [floor(i in/out), ceil((i+1) in/out))."""
    rows = torch.zeros(size_out, size_in, dtype=_F64)
    for i in range(size_out):
        start = (i * size_in) // size_out
        end = -((-(i + 1) * size_in) // size_out)
        rows[i, start:end] = 1.0 / (end - start)
    return rows


def _separable(x: torch.Tensor, wh: torch.Tensor, ww: torch.Tensor) -> torch.Tensor:
    """W_h x W_w^T over the last two axes of x, exact_matmul's products, the first kept in
    float64."""
    n = math.prod(x.shape[:-2])
    flat = x.reshape(n, *x.shape[-2:])
    left = exact_matmul(
        wh.to(_F64).expand(n, *wh.shape).contiguous(), flat, _F64, precision=x.dtype
    )
    right = ww.to(_F64).t().expand(n, ww.shape[1], ww.shape[0]).contiguous()
    out = exact_matmul(left, right, x.dtype)
    return out.reshape(*x.shape[:-2], wh.shape[0], ww.shape[0])


def _scales(scale_factors, index):
    return scale_factors[index] if scale_factors else None


@kernel("upsample_bilinear2d.vec")
def _bilinear_vec(x, output_size, align_corners, scale_factors):
    floating(x)
    if output_size is None:
        output_size = [math.floor(x.shape[-2 + i] * scale_factors[i]) for i in (0, 1)]
    return _bilinear(
        x, output_size, align_corners, _scales(scale_factors, 0), _scales(scale_factors, 1)
    )


@kernel("upsample_bilinear2d.default")
def _bilinear(x, output_size, align_corners, scales_h=None, scales_w=None):
    floating(x)
    wh = linear_weights(x.shape[-2], output_size[0], align_corners, scales_h)
    ww = linear_weights(x.shape[-1], output_size[1], align_corners, scales_w)
    return _separable(x, wh, ww)


@kernel("upsample_bilinear2d_backward.default")
def _bilinear_backward(grad, output_size, input_size, align_corners, scales_h=None, scales_w=None):
    floating(grad)
    wh = linear_weights(input_size[-2], output_size[0], align_corners, scales_h)
    ww = linear_weights(input_size[-1], output_size[1], align_corners, scales_w)
    return _separable(grad, wh.t(), ww.t())


@kernel("_adaptive_avg_pool2d.default")
def _adaptive_avg_pool2d(x, output_size):
    floating(x)
    wh = adaptive_weights(x.shape[-2], output_size[0])
    ww = adaptive_weights(x.shape[-1], output_size[1])
    return _separable(x, wh, ww)


@kernel("_adaptive_avg_pool2d_backward.default")
def _adaptive_avg_pool2d_backward(grad, x):
    floating(grad, x)
    wh = adaptive_weights(x.shape[-2], grad.shape[-2])
    ww = adaptive_weights(x.shape[-1], grad.shape[-1])
    return _separable(grad, wh.t(), ww.t())


def _nearest_backward(func):
    """The gradient of nearest-neighbour upsampling: each input adds up the gradients of the
    outputs that copied it (coefficients 1), exactly."""

    def run(grad, output_size, input_size, *scales):
        floating(grad)
        spatial = len(output_size)
        dims = tuple(range(grad.dim() - spatial, grad.dim()))
        terms = math.prod(-(-o // i) + 1 for o, i in zip(output_size, input_size[-spatial:]))

        def spread(t):
            return func(t, output_size, input_size, *scales)

        return exact_linear(grad, spread, dims, terms, grad.dtype).to(grad.dtype)

    return run


for _name in ("upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d"):
    for _exact in ("", "_"):
        _op = f"{_exact}{_name.replace('nearest', 'nearest_exact') if _exact else _name}"
        _packet = getattr(aten, f"{_op}_backward", None)
        if _packet is not None:
            kernel(f"{_op}_backward.default")(_nearest_backward(_packet.default))


def _along(x: torch.Tensor, axis: int, weights: torch.Tensor, out_dtype, precision):
    """weights (out x in) applied along `axis` of x: one exact_matmul."""
    moved = x.movedim(axis, -1)
    flat = moved.reshape(-1, moved.shape[-1])
    out = exact_matmul(flat, weights.t().contiguous(), out_dtype, precision=precision)
    return out.reshape(*moved.shape[:-1], weights.shape[0]).movedim(-1, axis)


def _three_axes(x, weights, dtype):
    """weights[i] (out x in) along the last three axes in turn, exact_matmul's, the first two
    results kept in float64."""
    out = x
    for position, axis in enumerate((-3, -2, -1)):
        out = _along(out, axis, weights[position], dtype if position == 2 else _F64, dtype)
    return out


def _adaptive3d(x, sizes_out, transpose: bool, dtype):
    weights = []
    for position, axis in enumerate((-3, -2, -1)):
        if transpose:
            weights.append(adaptive_weights(sizes_out[position], x.shape[axis]).t())
        else:
            weights.append(adaptive_weights(x.shape[axis], sizes_out[position]))
    return _three_axes(x, weights, dtype)


@kernel("_adaptive_avg_pool3d.default")
def _adaptive_avg_pool3d(x, output_size):
    floating(x)
    return _adaptive3d(x, list(output_size), False, x.dtype)


@kernel("_adaptive_avg_pool3d_backward.default")
def _adaptive_avg_pool3d_backward(grad, x):
    floating(grad, x)
    return _adaptive3d(grad, list(x.shape[-3:]), True, x.dtype)


@kernel("upsample_linear1d.vec")
def _linear1d_vec(x, output_size, align_corners, scale_factors):
    floating(x)
    if output_size is None:
        output_size = [math.floor(x.shape[-1] * scale_factors[0])]
    return _linear1d(x, output_size, align_corners, _scales(scale_factors, 0))


@kernel("upsample_linear1d.default")
def _linear1d(x, output_size, align_corners, scales=None):
    floating(x)
    w = linear_weights(x.shape[-1], output_size[0], align_corners, scales)
    return _along(x, -1, w, x.dtype, x.dtype)


@kernel("upsample_linear1d_backward.default")
def _linear1d_backward(grad, output_size, input_size, align_corners, scales=None):
    floating(grad)
    w = linear_weights(input_size[-1], output_size[0], align_corners, scales)
    return _along(grad, -1, w.t(), grad.dtype, grad.dtype)


def _sizes(x, output_size, scale_factors, spatial: int) -> list[int]:
    """The output's sizes of a `.vec` overload: given, or the input's times the scale factors."""
    if output_size is not None:
        return list(output_size)
    return [math.floor(x.shape[-spatial + i] * scale_factors[i]) for i in range(spatial)]


def _two_axes(name: str, weights) -> None:
    """Registers `name` (.default, .vec) and its backward for a 2-d interpolation whose matrix
    along an axis is weights(size_in, size_out, align_corners, scale)."""

    @kernel(f"{name}.default")
    def forward(x, output_size, align_corners, scales_h=None, scales_w=None):
        floating(x)
        wh = weights(x.shape[-2], output_size[0], align_corners, scales_h)
        ww = weights(x.shape[-1], output_size[1], align_corners, scales_w)
        return _separable(x, wh, ww)

    @kernel(f"{name}.vec")
    def forward_vec(x, output_size, align_corners, scale_factors):
        sizes = _sizes(x, output_size, scale_factors, 2)
        return forward(x, sizes, align_corners, *(_scales(scale_factors, i) for i in (0, 1)))

    @kernel(f"{name}_backward.default")
    def backward(grad, output_size, input_size, align_corners, scales_h=None, scales_w=None):
        floating(grad)
        wh = weights(input_size[-2], output_size[0], align_corners, scales_h)
        ww = weights(input_size[-1], output_size[1], align_corners, scales_w)
        return _separable(grad, wh.t(), ww.t())


_two_axes("upsample_bicubic2d", cubic_weights)
_two_axes("_upsample_bilinear2d_aa", lambda *sizes: aa_weights(2, *sizes))
_two_axes("_upsample_bicubic2d_aa", lambda *sizes: aa_weights(4, *sizes))


@kernel("upsample_trilinear3d.default")
def _trilinear(x, output_size, align_corners, scales_d=None, scales_h=None, scales_w=None):
    floating(x)
    scales = (scales_d, scales_h, scales_w)
    weights = [
        linear_weights(x.shape[-3 + i], output_size[i], align_corners, scales[i]) for i in range(3)
    ]
    return _three_axes(x, weights, x.dtype)


@kernel("upsample_trilinear3d.vec")
def _trilinear_vec(x, output_size, align_corners, scale_factors):
    sizes = _sizes(x, output_size, scale_factors, 3)
    return _trilinear(x, sizes, align_corners, *(_scales(scale_factors, i) for i in range(3)))


@kernel("upsample_trilinear3d_backward.default")
def _trilinear_backward(
    grad, output_size, input_size, align_corners, scales_d=None, scales_h=None, scales_w=None
):
    floating(grad)
    scales = (scales_d, scales_h, scales_w)
    weights = [
        linear_weights(input_size[-3 + i], output_size[i], align_corners, scales[i]).t()
        for i in range(3)
    ]
    return _three_axes(grad, weights, grad.dtype)
