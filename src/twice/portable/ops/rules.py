"""Portable kernels for operations made exact, or fixed in order, by a rule of their own:
`allclose`, `linspace` with tensor bounds, `renorm`, `index_reduce`, `scatter_reduce` with
`prod`, and `histogram`.

A product of many terms depends on their order: `prod` reductions multiply each destination's
terms in float64 in the order of their source positions, one round per rank (a destination
meets at most one term per round), then round once. A histogram's weights are added exactly.
"""

from __future__ import annotations

import math

import torch
from torch._prims_common import canonicalize_dim

from twice.portable.dispatch.table import KERNELS, PortableUnsupported, kernel
from twice.portable.ops import sparse
from twice.portable.ops.functions import _linspace, _logspace
from twice.portable.ops.linear import _accumulate, _scatter_reduce
from twice.portable.ops.math import floating

__all__ = ["bin_of", "ordered_product"]

_F64 = torch.float64
aten = torch.ops.aten


@kernel("allclose.default")
def _allclose(a, b, rtol=1e-05, atol=1e-08, equal_nan=False):
    """|a - b| <= atol + rtol |b| in float64, infinities close only to themselves."""
    floating(a, b)
    a64, b64 = torch.broadcast_tensors(a.to(_F64), b.to(_F64))
    close = (a64 - b64).abs() <= float(atol) + float(rtol) * b64.abs()
    close = torch.where(torch.isinf(a64) | torch.isinf(b64), a64 == b64, close)
    both_nan = torch.isnan(a64) & torch.isnan(b64)
    close = torch.where(both_nan, equal_nan, close & ~torch.isnan(a64) & ~torch.isnan(b64))
    return bool(close.all())


def _number(value):
    """A bound given as a 0-d tensor, as the number it holds."""
    return value.item() if isinstance(value, torch.Tensor) else value


@kernel("linspace.Tensor_Tensor", "linspace.Tensor_Scalar", "linspace.Scalar_Tensor")
def _linspace_tensors(start, end, steps, **options):
    """linspace with a 0-d tensor for a bound: the scalar kernel on its value."""
    return _linspace(_number(start), _number(end), steps, **options)


@kernel("logspace.Tensor_Tensor", "logspace.Tensor_Scalar", "logspace.Scalar_Tensor")
def _logspace_tensors(start, end, steps, base=10.0, **options):
    """logspace with a 0-d tensor for a bound: the scalar kernel on its value."""
    return _logspace(_number(start), _number(end), steps, base, **options)


@kernel("renorm.default")
def _renorm(x, p, dim, maxnorm):
    """Each slice along `dim` scaled by maxnorm / (norm + 1e-7) where its p-norm exceeds
    maxnorm (torch's formula), the norm by the portable vector norm."""
    floating(x)
    n = x.dim()
    torch._check(n > 1, lambda: f"renorm: input needs at least 2 dimensions, got {n} dimensions")
    dims = [d for d in range(x.dim()) if d != canonicalize_dim(x.dim(), dim)]
    norm = KERNELS["linalg_vector_norm.default"](x, p, dims, True).to(_F64)
    factor = torch.where(norm > float(maxnorm), float(maxnorm) / (norm + 1e-7), 1.0)
    return (x.to(_F64) * factor).to(x.dtype)


@kernel("renorm_.default")
def _renorm_(x, p, dim, maxnorm):
    return x.copy_(_renorm(x, p, dim, maxnorm))


def ordered_product(base: torch.Tensor, destination: torch.Tensor, values: torch.Tensor):
    """base (float64, flat) with each values[i] multiplied into base[destination[i]], a
    destination's terms in the order of i: round r multiplies every destination's r-th term."""
    order = torch.sort(destination, stable=True)
    sorted_destination = order.values
    first = torch.ones_like(sorted_destination, dtype=torch.bool)
    first[1:] = sorted_destination[1:] != sorted_destination[:-1]
    position = torch.arange(sorted_destination.numel())
    start = torch.cummax(torch.where(first, position, 0), 0).values
    rank = torch.empty_like(position)
    rank[order.indices] = position - start
    out = base.clone()
    for r in range(int(rank.max()) + 1 if rank.numel() else 0):
        chosen = rank == r
        where = destination[chosen]
        out[where] = out[where] * values[chosen]
    return out


def _scatter_prod(self, dim, index, src, include_self):
    """scatter_reduce's prod: the destination's own value first (include_self), then the
    source's terms in source order."""
    flat_target = torch.arange(self.numel()).view(self.shape)
    destination = torch.gather(flat_target, dim, index).reshape(-1)
    used = src[tuple(slice(0, n) for n in index.shape)].reshape(-1).to(_F64)
    base = self.reshape(-1).to(_F64)
    if not include_self:
        hit = torch.zeros(self.numel(), dtype=torch.bool)
        hit[destination] = True
        base = torch.where(hit, 1.0, base)
    return ordered_product(base, destination, used).view(self.shape).to(self.dtype)


@kernel("scatter_reduce.two")
def _scatter_reduce_all(self, dim, index, src, reduce, *, include_self=True):
    if reduce == "prod":
        floating(self, src)
        return _scatter_prod(self, dim, index, src, include_self)
    return _scatter_reduce(self, dim, index, src, reduce, include_self=include_self)


@kernel("scatter_reduce_.two")
def _scatter_reduce_all_(self, dim, index, src, reduce, *, include_self=True):
    return self.copy_(_scatter_reduce_all(self, dim, index, src, reduce, include_self=include_self))


@kernel("index_reduce.default")
def _index_reduce(self, dim, index, source, reduce, *, include_self=True):
    """index_reduce as scatter_reduce with the index spread along `dim` over the source."""
    floating(self, source)
    if reduce not in ("prod", "mean", "amax", "amin"):
        raise PortableUnsupported(f"index_reduce with reduce={reduce!r}")
    if self.dim() == 0:
        self, source = self.reshape(1), source.reshape(1)
        return _index_reduce(self, 0, index, source, reduce, include_self=include_self)[0]
    dim = canonicalize_dim(self.dim(), dim)
    shape = [1] * source.dim()
    shape[dim] = -1
    spread = index.reshape(shape).expand(source.shape)
    return _scatter_reduce_all(self, dim, spread, source, reduce, include_self=include_self)


@kernel("index_reduce_.default")
def _index_reduce_(self, dim, index, source, reduce, *, include_self=True):
    return self.copy_(_index_reduce(self, dim, index, source, reduce, include_self=include_self))


def bin_of(edges64: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """Each value's bin as torch's binary search finds it (its upper bound among the edges,
    minus one, the last edge in the last bin), for edges out of order too, where torch's bins
    are what its search gives: searchsorted halves the range as std::upper_bound does."""
    position = torch.searchsorted(edges64, values.to(_F64).contiguous(), right=True) - 1
    last = edges64.numel() - 2
    return torch.where(position > last, last, position)


def _histogram(x, edges, weight, density):
    """Counts (or weights added exactly) per bin: bin i holds edges[i] <= v < edges[i+1], the
    last bin its right edge too; values outside the first and last edge and NaN count nowhere
    (edges out of order: the bins torch's binary search gives, bin_of)."""
    flat = x.reshape(-1)
    edges64 = edges.to(_F64)
    bins = edges.numel() - 1
    position = bin_of(edges64, flat)
    inside = (flat >= edges64[0]) & (flat <= edges64[-1])  # NaN: nowhere
    slot = torch.where(inside, position, bins)  # a spare bin for the rest, dropped
    values = torch.ones_like(flat, dtype=_F64) if weight is None else weight.reshape(-1).to(_F64)
    values = torch.where(inside, values, 0.0)
    zeros = torch.zeros(bins + 1, dtype=_F64)
    hist = _accumulate(zeros, values, lambda z, t: z.scatter_add(0, slot, t))[:bins].to(_F64)
    if density:
        widths = edges64[1:] - edges64[:-1]
        hist = hist / (_exact_total(hist) * widths)
    return hist.to(x.dtype), edges


def _exact_total(values: torch.Tensor) -> float:
    zero = torch.zeros(1, dtype=_F64)
    index = torch.zeros(values.numel(), dtype=torch.int64)
    return float(_accumulate(zero, values, lambda z, t: z.scatter_add(0, index, t))[0])


@kernel("histogram.bin_ct")
def _histogram_count(x, bins=100, *, range=None, weight=None, density=False):  # noqa: A002
    """Edges by the portable linspace over the range (the data's own when none is given,
    widened by 1/2 either side where it is one value, as torch's)."""
    floating(x, weight)
    if range is not None:
        low, high = float(range[0]), float(range[1])
    elif x.numel():
        low, high = float(x.min()), float(x.max())
    else:
        low, high = 0.0, 1.0  # torch's edges for no data
    if low == high:
        low, high = low - 0.5, high + 0.5
    if not (math.isfinite(low) and math.isfinite(high)):
        raise ValueError(f"range of [{low}, {high}] is not finite")
    edges = _linspace(low, high, bins + 1, dtype=x.dtype)
    return _histogram(x, edges, weight, density)


@kernel("histc.default")
def _histc(x, bins=100, min=0, max=0):  # noqa: A002
    """histc as a histogram over [min, max] (the data's range where they are equal)."""
    floating(x)
    low, high = float(min), float(max)
    if low == high and x.numel():
        low, high = float(x.min()), float(x.max())
    if low == high:
        low, high = low - 0.5, high + 0.5
    return _histogram(x, _linspace(low, high, bins + 1, dtype=x.dtype), None, False)[0]


@kernel("histogram.bins_tensor")
def _histogram_edges(x, bins, *, weight=None, density=False):
    floating(x, weight)
    return _histogram(x, bins, weight, density)


@kernel("_to_dense.default", sparse=True)
def _to_dense(x, dtype=None, masked_grad=None):
    """A sparse tensor made dense: its values placed, exact where each position has one value (a
    coalesced COO tensor, what to_sparse gives); duplicates would be added, in torch's order."""
    if x.layout is torch.sparse_csr:
        return sparse.dense_of(x).to(dtype or x.dtype)  # refused where it may hold duplicates
    if x.layout != torch.sparse_coo or not x.is_coalesced():
        raise PortableUnsupported(f"to_dense of a {x.layout} tensor that may hold duplicates")
    return aten._to_dense.default(x, dtype, masked_grad)


@kernel("sparse_mask.default", sparse=True)
def _sparse_mask(x, mask):
    """x's values at mask's positions: a selection, exact where x holds one value a position (a
    strided tensor, or a coalesced COO one)."""
    held_once = x.is_coalesced() if x.layout is torch.sparse_coo else sparse.distinct(x)
    if x.layout != torch.strided and not held_once:
        raise PortableUnsupported(f"sparse_mask of a {x.layout} tensor that may hold duplicates")
    return aten.sparse_mask.default(x, mask)
