"""Portable kernels for reductions over contiguous segments (`segment_reduce` and its backward)
and for multi-dimensional histograms (`histogramdd`'s three parts).

A segment's sum is exact (rounded once; a mean is that sum divided by the length, one division),
its maximum and minimum are exact (a zero's sign by IEEE maximum/minimum, not by position), and
its product multiplies in float64 in the segment's order. A histogram's bin is found by exact
comparisons with its edges and its counts or weights are added exactly.
"""

from __future__ import annotations

import builtins
import math

import torch
from torch._prims_common import canonicalize_dim

from twice.portable.dispatch.table import PortableUnsupported, kernel
from twice.portable.ops.functions import _linspace
from twice.portable.ops.linear import _accumulate, exact_linear
from twice.portable.ops.math import floating
from twice.portable.ops.rules import bin_of, ordered_product

_F64 = torch.float64


def _segment_index(data, axis, lengths, offsets):
    """(each element's segment along `axis`, broadcast to data's shape, with elements outside
    every segment sent to a spare segment S; the offsets (batch..., S + 1))."""
    if offsets is None:
        if lengths is None:
            raise PortableUnsupported("segment_reduce without lengths or offsets")
        ends = torch.cumsum(lengths.to(torch.int64), -1)  # integers: exact in any order
        offsets = torch.cat([torch.zeros_like(ends[..., :1]), ends], -1)
    offsets = offsets.to(torch.int64)
    count = offsets.shape[-1] - 1
    positions = torch.arange(data.shape[axis]).expand(*offsets.shape[:-1], data.shape[axis])
    segment = torch.searchsorted(offsets.contiguous(), positions.contiguous(), right=True) - 1
    valid = (positions >= offsets[..., :1]) & (positions < offsets[..., -1:])
    segment = torch.where(valid, segment, count)
    segment = segment.reshape(*segment.shape, *([1] * (data.dim() - axis - 1)))
    return segment.expand(data.shape), offsets


def _base(data, axis, count, fill):
    shape = list(data.shape)
    shape[axis] = count + 1
    return torch.full(shape, fill, dtype=_F64)


def _rounded(value, dtype) -> float:
    """The initial value as torch holds it: rounded to the data's dtype."""
    return float(torch.tensor(float(value), dtype=_F64).to(dtype))


def _extreme(data64, axis, index, base, reduce):
    """amax/amin of each segment with the base's value included: NaN when any is NaN, a zero's
    sign +0 for a maximum holding +0 (-0 for a minimum holding -0)."""
    op = "amax" if reduce == "max" else "amin"
    out = (base + 0.0).scatter_reduce(axis, index, data64 + 0.0, op, include_self=True)
    nan = (
        torch.isnan(base)
        .to(_F64)
        .scatter_reduce(axis, index, torch.isnan(data64).to(_F64), "amax", include_self=True)
    )
    wanted = (
        (lambda t: (t == 0) & ~torch.signbit(t))
        if reduce == "max"
        else (lambda t: (t == 0) & torch.signbit(t))
    )
    held = (
        wanted(base)
        .to(_F64)
        .scatter_reduce(axis, index, wanted(data64).to(_F64), "amax", include_self=True)
    )
    zero = torch.where(held > 0, 0.0, -0.0) if reduce == "max" else torch.where(held > 0, -0.0, 0.0)
    out = torch.where(out == 0, zero, out)
    return torch.where(nan > 0, math.nan, out)


def _exact_sums(data, axis, index, count):
    zeros = _base(data, axis, count, 0.0)
    if data.numel() == 0:
        return zeros
    return exact_linear(
        data,
        lambda t: zeros.scatter_add(axis, index, t),
        None,
        max(1, data.shape[axis]),
        data.dtype,
    )


@kernel("segment_reduce.default")
def _segment_reduce(
    data, reduce, *, lengths=None, indices=None, offsets=None, axis=0, unsafe=False, initial=None
):
    floating(data)
    if not data.is_floating_point() or indices is not None:
        raise PortableUnsupported("segment_reduce with indices or on integers")
    axis = canonicalize_dim(data.dim(), axis)
    index, offsets = _segment_index(data, axis, lengths, offsets)
    count = offsets.shape[-1] - 1
    length = (offsets[..., 1:] - offsets[..., :-1]).to(_F64)
    length = length.reshape(*length.shape, *([1] * (data.dim() - axis - 1)))
    start = None if initial is None else _rounded(initial, data.dtype)
    if reduce in ("sum", "mean"):
        total = _exact_sums(data, axis, index, count).narrow(axis, 0, count)
        total = total if start is None else total + start
        if reduce == "mean":
            empty = math.nan if start is None else start
            total = torch.where(length > 0, total / length.clamp(min=1), empty)
        return total.to(data.dtype)
    if reduce in ("max", "min"):
        fill = start if start is not None else (-math.inf if reduce == "max" else math.inf)
        out = _extreme(data.to(_F64), axis, index, _base(data, axis, count, fill), reduce)
        return out.narrow(axis, 0, count).to(data.dtype)
    if reduce == "prod":
        base = _base(data, axis, count, 1.0 if start is None else start)
        target = torch.arange(base.numel()).view(base.shape)
        destination = torch.gather(target, axis, index).reshape(-1)
        out = ordered_product(base.reshape(-1), destination, data.reshape(-1).to(_F64))
        return out.view(base.shape).narrow(axis, 0, count).to(data.dtype)
    raise PortableUnsupported(f"segment_reduce with reduce={reduce!r}")


def _exclusive_products(destination, values):
    """Each value's destination's other values multiplied in float64: the product of those
    before it (in order) times the product of those after it (in reverse order)."""
    order = torch.sort(destination, stable=True)
    first = torch.ones_like(order.values, dtype=torch.bool)
    first[1:] = order.values[1:] != order.values[:-1]
    position = torch.arange(destination.numel())
    start = torch.cummax(torch.where(first, position, 0), 0).values
    rank = torch.empty_like(position)
    rank[order.indices] = position - start
    size = int(destination.max()) + 1 if destination.numel() else 0
    held = torch.zeros(size, dtype=torch.int64).scatter_add(0, destination, torch.ones_like(rank))
    result = torch.ones_like(values)
    for ranks in (rank, held[destination] - 1 - rank):  # before, then after
        running = torch.ones(size, dtype=_F64)
        for r in range(int(ranks.max()) + 1 if ranks.numel() else 0):
            chosen = ranks == r
            where = destination[chosen]
            result[chosen] = result[chosen] * running[where]
            running[where] = running[where] * values[chosen]
    return result


@kernel("_segment_reduce_backward.default")
def _segment_reduce_backward(
    grad, output, data, reduce, *, lengths=None, offsets=None, axis=0, initial=None
):
    """torch's formula: sum spreads the gradient, mean divides it by the length, max/min give
    it to the elements equal to the result (or NaN), a positive share divided among ties, prod
    gives grad x output / x (the other elements' product where x is 0 or NaN)."""
    floating(grad, data)
    axis = canonicalize_dim(data.dim(), axis)
    index, offsets = _segment_index(data, axis, lengths, offsets)
    count = offsets.shape[-1] - 1

    def spread(t):  # a per-segment tensor at each element; 0 for elements outside segments
        spare = torch.zeros_like(t.narrow(axis, 0, 1))
        return torch.gather(torch.cat([t, spare], axis), axis, index)

    g = spread(grad)
    if reduce == "sum":
        return g.to(data.dtype)
    length = (offsets[..., 1:] - offsets[..., :-1]).to(_F64)
    length = length.reshape(*length.shape, *([1] * (data.dim() - axis - 1))).expand(output.shape)
    if reduce == "mean":
        held = spread(length)
        return torch.where(held > 0, g.to(_F64) / held.clamp(min=1), 0.0).to(data.dtype)
    out = spread(output)
    inside = (
        torch.gather(
            torch.cat([length, torch.zeros_like(length.narrow(axis, 0, 1))], axis), axis, index
        )
        > 0
    )
    if reduce in ("max", "min"):
        chosen = (torch.isnan(data) | (data == out)) & inside
        shares = torch.where(chosen, g, torch.zeros_like(g))
        ties = _base(data, axis, count, 0.0).scatter_add(axis, index, chosen.to(_F64))
        ties = torch.gather(ties, axis, index)
        split = (ties >= 2) & (shares > 0)
        return torch.where(split, shares.to(_F64) / ties.clamp(min=1), shares).to(data.dtype)
    if reduce == "prod":
        plain = g * out / data
        special = (torch.isnan(data) | (data == 0)) & inside
        if bool(special.any()):
            base = _base(data, axis, count, 0.0)
            target = torch.arange(base.numel()).view(base.shape)
            destination = torch.gather(target, axis, index).reshape(-1)
            others = _exclusive_products(destination, data.reshape(-1).to(_F64))
            start = 1.0 if initial is None else _rounded(initial, data.dtype)
            others = (others.view(data.shape) * start).to(data.dtype)
            plain = torch.where(special, g * others, plain)
        return torch.where(inside, plain, torch.zeros_like(plain))
    raise PortableUnsupported(f"segment_reduce backward with reduce={reduce!r}")


def _outer_edges(column, bins, bounds, dtype):
    """One dimension's edges: the portable linspace over the range (the data's own when none is
    given, widened by 1/2 either side where it is one value, as torch's)."""
    if bounds is not None:
        low, high = float(bounds[0]), float(bounds[1])
    elif column.numel():
        low, high = float(column.min()), float(column.max())
    else:
        low, high = 0.0, 1.0
    if low == high:
        low, high = low - 0.5, high + 0.5
    if not (math.isfinite(low) and math.isfinite(high)):
        raise ValueError(f"range of [{low}, {high}] is not finite")
    return _linspace(low, high, bins + 1, dtype=dtype)


@kernel("_histogramdd_bin_edges.default")
def _histogramdd_bin_edges(x, bins, *, range=None, weight=None, density=False):  # noqa: A002
    floating(x, weight)
    dims = x.shape[-1]
    flat = x.reshape(-1, dims)
    counts = list(bins) * dims if len(bins) == 1 else list(bins)
    return [
        _outer_edges(
            flat[:, d], counts[d], None if range is None else range[2 * d : 2 * d + 2], x.dtype
        )
        for d in builtins.range(dims)
    ]


@kernel("_histogramdd_from_bin_tensors.default")
def _histogramdd_from_bin_tensors(x, bins, *, weight=None, density=False):
    """Each element's bin per dimension by exact comparisons with that dimension's edges (the
    last bin holding its right edge); an element outside any dimension's first and last edge,
    or NaN, counts nowhere; density divides by the exact total, then by each dimension's
    widths, as torch."""
    floating(x, weight)
    dims = x.shape[-1]
    flat = x.reshape(-1, dims).to(_F64)
    sizes = [e.numel() - 1 for e in bins]
    total_bins = math.prod(sizes)
    inside = torch.ones(flat.shape[0], dtype=torch.bool)
    slot = torch.zeros(flat.shape[0], dtype=torch.int64)
    for d, edges in enumerate(bins):
        edges64, column = edges.to(_F64), flat[:, d]
        position = bin_of(edges64, column)
        inside &= (column >= edges64[0]) & (column <= edges64[-1])  # NaN: nowhere
        slot = slot * sizes[d] + position.clamp(0, max(sizes[d] - 1, 0))
    slot = torch.where(inside, slot, total_bins)  # a spare bin for the rest, dropped
    values = torch.ones(flat.shape[0], dtype=_F64) if weight is None else weight.reshape(-1)
    values = torch.where(inside, values.to(_F64), 0.0)
    zeros = torch.zeros(total_bins + 1, dtype=_F64)
    hist = _accumulate(zeros, values, lambda z, t: z.scatter_add(0, slot, t))[:total_bins]
    hist = hist.to(_F64).view(sizes)
    if density:
        flat_hist = hist.reshape(-1)
        every = torch.zeros(flat_hist.numel(), dtype=torch.int64)
        one = torch.zeros(1, dtype=_F64)
        hist = hist / float(_accumulate(one, flat_hist, lambda z, t: z.scatter_add(0, every, t))[0])
        for d, edges in enumerate(bins):
            edges64 = edges.to(_F64)
            shape = [1] * dims
            shape[d] = -1
            hist = hist / (edges64[1:] - edges64[:-1]).view(shape)
    return hist.to(x.dtype)


@kernel("_histogramdd_from_bin_cts.default")
def _histogramdd_from_bin_cts(x, bins, *, range=None, weight=None, density=False):  # noqa: A002
    edges = _histogramdd_bin_edges(x, bins, range=range, weight=weight, density=density)
    return _histogramdd_from_bin_tensors(x, edges, weight=weight, density=density)
