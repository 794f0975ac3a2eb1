"""Portable kernels for grid sampling (`grid_sampler_2d`, `grid_sampler_3d`) and their
gradients: bilinear (trilinear), nearest and bicubic sampling with zeros, border and reflection
padding, in torch's formulas.

Grid sampling is not separable: every output reads its own few taps (the corners around its
source point, or the nearest input, or bicubic's 4x4), so the forward is each output's terms,
weights and products by IEEE operations in float64, added in one fixed order and rounded once.
The input's gradient adds each output's gradient times its tap's weight into the tap: an exact
accumulation (linear.py's route for index_put), each sample and channel on its own grid. The
grid's gradient is torch's formula in float64, its sum over channels and taps exact.
"""

from __future__ import annotations

import math

import torch

from twice.portable.arithmetic.exact import exact_sum
from twice.portable.dispatch.table import PortableUnsupported, kernel
from twice.portable.ops.linear import exact_linear
from twice.portable.ops.math import floating

__all__ = ["grid_sample", "grid_sample_backward"]

_F64 = torch.float64
_BILINEAR, _NEAREST, _BICUBIC = 0, 1, 2
_ZEROS, _BORDER, _REFLECTION = 0, 1, 2
_A = -0.75  # torch's bicubic coefficient


def _clip(x, size):
    """(the coordinate clamped to [0, size - 1], its derivative: 0 where clamped)."""
    inside = (x > 0) & (x < size - 1)
    return torch.clamp(x, 0.0, size - 1.0), inside.to(_F64)


def _reflect(x, twice_low: int, twice_high: int):
    """torch's reflect_coordinates: x reflected about the edges low and high until inside,
    with its derivative (+1 or -1)."""
    if twice_low == twice_high:
        return torch.zeros_like(x), torch.zeros_like(x)
    low, span = twice_low / 2, (twice_high - twice_low) / 2
    x = x - low
    sign = torch.where(x < 0, -1.0, 1.0)
    x = x.abs()
    extra = torch.fmod(x, span)  # exact in IEEE arithmetic
    even = torch.fmod(torch.floor(x / span), 2.0) == 0
    return torch.where(even, extra + low, span - extra + low), torch.where(even, sign, -sign)


def _pad(x, size: int, padding: int, align_corners: bool):
    """torch's compute_coordinates: (the coordinate after border or reflection padding, its
    derivative)."""
    grad = torch.ones_like(x)
    if padding == _REFLECTION:
        twice = (0, 2 * (size - 1)) if align_corners else (-1, 2 * size - 1)
        x, grad = _reflect(x, *twice)
    if padding in (_BORDER, _REFLECTION):
        x, clipped = _clip(x, size)
        grad = grad * clipped
    return x, grad


def _unnormalize(coord, size: int, align_corners: bool):
    """(the grid's coordinate in [-1, 1] as an input position, the derivative's factor)."""
    if align_corners:
        return ((coord + 1.0) / 2.0) * (size - 1), (size - 1) / 2
    return ((coord + 1.0) * size - 1.0) / 2.0, size / 2


def _cubic(t):
    """torch's bicubic coefficients at fraction t and their derivatives in t, negated (torch's
    get_cubic_coefficients_grad)."""

    def near(x):
        return ((_A + 2.0) * x - (_A + 3.0)) * x * x + 1.0

    def far(x):
        return ((_A * x - 5.0 * _A) * x + 8.0 * _A) * x - 4.0 * _A

    weights = [far(t + 1.0), near(t), near(1.0 - t), far(2.0 - t)]
    x = [-1.0 - t, -t, 1.0 - t, 2.0 - t]
    grads = [
        (-3.0 * _A * x[0] - 10.0 * _A) * x[0] - 8.0 * _A,
        (-3.0 * (_A + 2.0) * x[1] - 2.0 * (_A + 3.0)) * x[1],
        (3.0 * (_A + 2.0) * x[2] - 2.0 * (_A + 3.0)) * x[2],
        (3.0 * _A * x[3] - 10.0 * _A) * x[3] + 8.0 * _A,
    ]
    return weights, grads


def _taps(grid, sizes, mode: int, padding: int, align_corners: bool):
    """Each output's taps, in torch's order: [(flat input index, inside, weight, [d weight /
    d coordinate k])] over (N, P) outputs (weight None: a copy), and the coordinates' factors."""
    d = grid.shape[-1]
    coords = grid.reshape(grid.shape[0], -1, d).to(_F64)
    spatial = [sizes[d - 1 - k] for k in range(d)]  # coordinate k (x, y, z) reads axis -1 - k
    strides = [math.prod(spatial[:k]) for k in range(d)]
    source, mults = [], []
    for k in range(d):
        position, mult = _unnormalize(coords[..., k], spatial[k], align_corners)
        if mode != _BICUBIC:
            position, grad = _pad(position, spatial[k], padding, align_corners)
            mult = grad * mult
        source.append(position)
        mults.append(mult)

    def tap(positions, weight, grads):
        index, inside = 0, None
        for k, p in enumerate(positions):
            if mode == _BICUBIC:
                p = torch.trunc(_pad(p, spatial[k], padding, align_corners)[0])
            ok = (p >= 0) & (p <= spatial[k] - 1)
            inside = ok if inside is None else inside & ok
            index = index + torch.where(ok, p, 0.0).to(torch.int64) * strides[k]
        return index, inside, weight, grads

    if mode == _NEAREST:
        return [tap([torch.round(s) for s in source], None, None)], mults
    low = [torch.floor(s) for s in source]
    if mode == _BICUBIC:
        (wx, gx), (wy, gy) = _cubic(source[0] - low[0]), _cubic(source[1] - low[1])
        taps = [
            tap(
                [low[0] - 1.0 + j, low[1] - 1.0 + i],
                wx[j] * wy[i],
                [-gx[j] * wy[i], -wx[j] * gy[i]],
            )
            for i in range(4)
            for j in range(4)
        ]
        return taps, mults
    taps = []
    for corner in range(2**d):
        high = [(corner >> k) & 1 for k in range(d)]
        factors = [source[k] - low[k] if high[k] else low[k] + 1.0 - source[k] for k in range(d)]
        weight = math.prod(factors[1:], start=factors[0])
        grads = []
        for k in range(d):
            others = [factors[m] for m in range(d) if m != k]
            product = math.prod(others[1:], start=others[0])
            grads.append(product if high[k] else -product)
        taps.append(tap([low[k] + high[k] for k in range(d)], weight, grads))
    return taps, mults


def _read(flat, index):
    """The input's values at `index` (N, P) for every channel: (N, C, P)."""
    return flat.gather(2, index.unsqueeze(1).expand(-1, flat.shape[1], -1))


def grid_sample(x, grid, mode: int, padding: int, align_corners: bool):
    """grid_sampler_2d/3d: each output's taps added in order in float64, rounded once."""
    floating(x, grid)
    if mode == _BICUBIC and grid.shape[-1] != 2:
        raise PortableUnsupported("bicubic grid sampling in 3-d")
    n, c = x.shape[:2]
    flat = x.reshape(n, c, -1)
    taps, _ = _taps(grid, x.shape[2:], mode, padding, align_corners)
    out = None
    for index, inside, weight, _ in taps:
        value = _read(flat, index)
        if weight is None:
            term = torch.where(inside.unsqueeze(1), value, torch.zeros((), dtype=x.dtype))
        else:
            term = torch.where(inside.unsqueeze(1), value.to(_F64) * weight.unsqueeze(1), 0.0)
        out = term if out is None else out + term
    return out.to(x.dtype).reshape(n, c, *grid.shape[1:-1])


def grid_sample_backward(grad, x, grid, mode, padding, align_corners, output_mask):
    """grid_sampler_2d/3d_backward: (the input's gradient, exact sums of the outputs' gradients
    times their taps' weights; the grid's, torch's formula with exact sums over channels and
    taps)."""
    floating(grad, x, grid)
    if mode == _BICUBIC and grid.shape[-1] != 2:
        raise PortableUnsupported("bicubic grid sampling in 3-d")
    n, c = x.shape[:2]
    flat = x.reshape(n, c, -1)
    g = grad.reshape(n, c, -1).to(_F64)
    taps, mults = _taps(grid, x.shape[2:], mode, padding, align_corners)
    grad_input = grad_grid = None
    if output_mask[0]:
        grad_input = _input_grad(g, taps, x)
    if output_mask[1]:
        if mode == _NEAREST:
            grad_grid = torch.zeros_like(grid)
        else:
            parts = []
            for k, mult in enumerate(mults):
                terms = [
                    torch.where(
                        inside.unsqueeze(1),
                        _read(flat, index).to(_F64) * grads[k].unsqueeze(1) * g,
                        0.0,
                    )
                    for index, inside, _, grads in taps
                ]
                total = exact_sum(torch.stack(terms, dim=1), (1, 2), False, _F64)
                parts.append(mult * total)
            grad_grid = torch.stack(parts, dim=-1).to(grid.dtype).reshape(grid.shape)
    return grad_input, grad_grid


def _input_grad(g, taps, x):
    """Each output's gradient times its taps' weights, added into the taps exactly (each
    sample and channel on its own grid), rounded once."""
    n, c = x.shape[:2]
    values = torch.cat(
        [
            torch.where(inside.unsqueeze(1), g if weight is None else g * weight.unsqueeze(1), 0.0)
            for index, inside, weight, _ in taps
        ],
        dim=2,
    )
    index = torch.cat([index for index, _, _, _ in taps], dim=1)
    index = index.unsqueeze(1).expand(-1, c, -1)
    zeros = torch.zeros(n, c, math.prod(x.shape[2:]), dtype=_F64, device=x.device)
    if values.numel() == 0:
        return zeros.to(x.dtype).reshape(x.shape)

    def spread(t):
        return zeros.scatter_add(2, index, t)

    total = exact_linear(values, spread, (2,), max(1, values.shape[2]), x.dtype)
    return total.to(x.dtype).reshape(x.shape)


for _d in (2, 3):
    kernel(f"grid_sampler_{_d}d.default")(grid_sample)
    kernel(f"grid_sampler_{_d}d_backward.default")(grid_sample_backward)
