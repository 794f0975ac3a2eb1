"""Portable kernels for operations that add up elements of one tensor with coefficients 0 and 1:
running sums, average pooling and its backward, accumulating scatters and index_put.

Each is computed as torch computes it, on float64 slices of integers (exact.split): a sum of
integers below 2**53 is exact in any order, so torch's own kernel gives the same bits on every
machine, and the slices' results are scaled (exact) and rounded once. A division that follows
(an average) is one IEEE operation after the exact sum.
"""

from __future__ import annotations

import math

import torch

from twice.portable import native
from twice.portable.arithmetic.exact import beta_for, exact_cumsum, slices_for, split
from twice.portable.dispatch.table import PortableUnsupported, kernel
from twice.portable.ops.math import floating

__all__ = ["exact_linear"]

_F64 = torch.float64
aten = torch.ops.aten


def exact_linear(x: torch.Tensor, form, dims, terms: int, precision) -> torch.Tensor:
    """`form(x)` in float64 for a `form` that adds elements of `x` (coefficients 0 or 1, at most
    `terms` in any output), exact: on integer slices of `x` on grids fixed by its largest
    magnitude over `dims` (all when None; the grid's unit must broadcast through `form`), with
    infinities and NaNs placed where IEEE addition in any order puts them."""
    if slices_for(precision) == 1:  # one slice, cut by the compiled kernel where it applies
        parts = native.split_rows(x, dims, beta_for(terms, 1))
        if parts:
            ints, unit = parts[0]
            return _scaled(form(ints), unit)
    x64 = x.to(_F64)
    finite = torch.isfinite(x64)
    total = None
    clean = torch.where(finite, x64, 0.0)
    for ints, unit in split(clean, dims, slices_for(precision), beta_for(terms, 1)):
        term = (form(ints) + 0.0) * unit
        total = term if total is None else total + term
    if not bool(finite.all()):
        positive = form((x64 == math.inf).to(_F64))
        negative = form((x64 == -math.inf).to(_F64))
        nan = form(torch.isnan(x64).to(_F64))
        total = torch.where(positive > 0, math.inf, total)
        total = torch.where(negative > 0, -math.inf, total)
        total = torch.where((nan > 0) | ((positive > 0) & (negative > 0)), math.nan, total)
    return total


def _scaled(total: torch.Tensor, unit: torch.Tensor) -> torch.Tensor:
    """(total + 0.0) * unit (an exact zero is +0: exact.py's ZERO_SIGN), in place where `total`
    is a tensor of its own that the product does not widen: the same values, and two passes
    over fresh memory fewer."""
    own = total.dtype == _F64 and total._base is None
    own = own and torch._debug_has_internal_overlap(total) == 0
    if own and torch.broadcast_shapes(total.shape, unit.shape) == total.shape:
        return total.add_(0.0).mul_(unit)
    return (total + 0.0) * unit


@kernel("cumsum.default")
def _cumsum(x, dim, *, dtype=None):
    floating(x)
    out_dtype = dtype or (x.dtype if x.is_floating_point() else torch.int64)
    return exact_cumsum(x, dim, out_dtype)


@kernel("cumsum_.default")
def _cumsum_(x, dim, *, dtype=None):
    return x.copy_(_cumsum(x, dim, dtype=dtype))


def _window_dims(x, spatial: int) -> tuple[int, ...]:
    return tuple(range(x.dim() - spatial, x.dim()))


def _pool_divisors(ones, pool, divisor_override):
    """The divisor torch uses for each output of an average pooling: `divisor_override`, or
    recovered exactly from torch's average of ones (n/d for small integers n, d) and the number
    n of elements each window holds."""
    if divisor_override:
        return float(divisor_override)
    held = pool(ones, 1)
    average = pool(ones, None)
    return torch.where(held > 0, torch.round(held / torch.where(average > 0, average, 1.0)), 1.0)


def _avg_pool(x, spatial, torch_pool, kernel_size, stride, padding, ceil_mode, pad, divisor):
    floating(x)

    def pool(t, override):
        return torch_pool(t, kernel_size, stride, padding, ceil_mode, pad, override)

    terms = (
        math.prod(kernel_size) if isinstance(kernel_size, (list, tuple)) else kernel_size**spatial
    )
    dims = _window_dims(x, spatial)
    sums = exact_linear(x, lambda t: pool(t, 1), dims, max(1, terms), x.dtype)
    ones = torch.ones((1,) * (x.dim() - spatial) + tuple(x.shape[-spatial:]), dtype=_F64)
    return (sums / _pool_divisors(ones, pool, divisor)).to(x.dtype)


def _register_avg_pool(spatial, forward, backward):
    @kernel(f"avg_pool{spatial}d.default")
    def pool(x, kernel_size, stride=(), padding=0, ceil_mode=False, pad=True, divisor=None):
        return _avg_pool(x, spatial, forward, kernel_size, stride, padding, ceil_mode, pad, divisor)

    @kernel(f"avg_pool{spatial}d_backward.default")
    def pool_backward(grad, x, kernel_size, stride, padding, ceil_mode, pad, divisor):
        return _avg_pool_backward(
            grad, x, spatial, forward, backward, kernel_size, stride, padding, ceil_mode, pad,
            divisor,
        )  # fmt: skip


def _avg_pool_backward(
    grad, x, spatial, forward, backward, kernel_size, stride, padding, ceil_mode, pad, divisor
):
    """Each input's gradient is the sum of the gradients of the windows holding it, each divided
    by its window's divisor: one division, then an exact sum (torch's backward with divisor 1)."""
    floating(grad, x)

    def pool(t, override):
        return forward(t, kernel_size, stride, padding, ceil_mode, pad, override)

    ones = torch.ones((1,) * (x.dim() - spatial) + tuple(x.shape[-spatial:]), dtype=_F64)
    shared = grad.to(_F64) / _pool_divisors(ones, pool, divisor)
    like = torch.empty_strided(x.shape, x.stride(), dtype=_F64, device=x.device)  # its layout

    def spread(t):
        return backward(t, like, kernel_size, stride, padding, ceil_mode, pad, 1)

    terms = (
        math.prod(kernel_size) if isinstance(kernel_size, (list, tuple)) else kernel_size**spatial
    )
    return exact_linear(shared, spread, _window_dims(grad, spatial), max(1, terms), x.dtype).to(
        x.dtype
    )


_register_avg_pool(2, aten.avg_pool2d.default, aten.avg_pool2d_backward.default)
_register_avg_pool(3, aten.avg_pool3d.default, aten.avg_pool3d_backward.default)


# Accumulating writes: the values added exactly (one grid over all of them), then the sum added
# to the destination's value and rounded once.


def _accumulate(self, values, write):
    floating(self, values)
    if values.numel() == 0:
        return self.clone()
    zeros = torch.zeros(self.shape, dtype=_F64, device=self.device)
    added = exact_linear(
        values, lambda t: write(zeros, t), None, max(1, values.numel()), self.dtype
    )
    return (self.to(_F64) + added).to(self.dtype)


@kernel("index_put.default", "_unsafe_index_put.default")
def _index_put(self, indices, values, accumulate=False):
    if not accumulate:
        return aten.index_put.default(self, indices, values, False)
    values = values.expand(self[tuple(indices)].shape) if values.dim() == 0 else values
    return _accumulate(self, values, lambda z, t: aten.index_put.default(z, indices, t, True))


@kernel("index_put_.default")
def _index_put_(self, indices, values, accumulate=False):
    if not accumulate:
        return aten.index_put_.default(self, indices, values, False)
    return self.copy_(_index_put(self, indices, values, True))


@kernel("index_add.default")
def _index_add(self, dim, index, source, *, alpha=1):
    if alpha != 1:
        source = torch.mul(source, alpha)
    return _accumulate(self, source, lambda z, t: aten.index_add.default(z, dim, index, t))


@kernel("index_add_.default")
def _index_add_(self, dim, index, source, *, alpha=1):
    return self.copy_(_index_add(self, dim, index, source, alpha=alpha))


@kernel("scatter_add.default")
def _scatter_add(self, dim, index, src):
    used = src[tuple(slice(0, n) for n in index.shape)] if src.dim() else src
    return _accumulate(self, used, lambda z, t: aten.scatter_add.default(z, dim, index, t))


@kernel("scatter_add_.default")
def _scatter_add_(self, dim, index, src):
    return self.copy_(_scatter_add(self, dim, index, src))


def _scatter_reduce(self, dim, index, src, reduce, *, include_self=True):
    """scatter_reduce's kernel but for prod (rules.py, which registers it): amax and amin are
    exact as torch computes them; sum and mean add exactly (the mean's count includes the
    destination's own value when include_self)."""
    floating(self, src)
    if reduce in ("amax", "amin"):
        return aten.scatter_reduce.two(self, dim, index, src, reduce, include_self=include_self)
    if reduce not in ("sum", "mean"):
        raise PortableUnsupported(f"scatter_reduce with reduce={reduce!r}")
    used = src[tuple(slice(0, n) for n in index.shape)] if src.dim() else src
    base = self
    if not include_self:
        hit = torch.zeros(self.shape, dtype=torch.bool).scatter(dim, index, True)
        base = torch.where(hit, torch.zeros_like(self), self)
    total = _accumulate(base, used, lambda z, t: aten.scatter_add.default(z, dim, index, t))
    if reduce == "sum":
        return total
    counts = torch.zeros(self.shape, dtype=_F64).scatter_add(
        dim, index, torch.ones(index.shape, dtype=_F64)
    )
    counts = counts + (1.0 if include_self else 0.0)
    return torch.where(counts > 0, total.to(_F64) / counts.clamp(min=1), self.to(_F64)).to(
        self.dtype
    )


def _sum_backward(func, single=None):
    """A backward whose every input gradient is a sum of output gradients with coefficient 1
    (a maximum's, a padding's): torch's own kernel on exact integer slices of the gradient, or
    on the gradient itself where `single(*rest)` says each input receives at most one of them
    (0 + g is g on any kernel, in any order)."""

    def run(grad, *rest):
        floating(grad)
        if grad.numel() == 0 or (single is not None and single(*rest)):
            return func(grad, *rest)
        wide = [
            r.to(_F64) if isinstance(r, torch.Tensor) and r.is_floating_point() else r for r in rest
        ]

        def spread(t):
            return func(t, *wide)

        return exact_linear(grad, spread, None, grad.numel(), grad.dtype).to(grad.dtype)

    return run


def _disjoint_windows(dims: int):
    """Whether max pooling's windows (`dims`-d) never overlap: each input is then the maximum
    of at most one window, and its gradient at most one output's."""

    def single(x, kernel_size, stride, padding, dilation, ceil_mode, indices) -> bool:
        def each(values):
            values = list(values) or list(kernel_size)  # no stride: the kernel's size
            return values * dims if len(values) == 1 else values

        kernel, steps, spread = each(kernel_size), each(stride), each(dilation)
        return all((k - 1) * d + 1 <= s for k, s, d in zip(kernel, steps, spread, strict=True))

    return single


for _dims in (2, 3):
    _name = f"max_pool{_dims}d_with_indices_backward"
    kernel(f"{_name}.default")(
        _sum_backward(getattr(aten, _name).default, _disjoint_windows(_dims))
    )

for _name in (
    "adaptive_max_pool2d_backward",
    "adaptive_max_pool3d_backward",
    "fractional_max_pool2d_backward",
    "fractional_max_pool3d_backward",
    *(f"{kind}_pad{d}d_backward" for kind in ("replication", "reflection") for d in (1, 2, 3)),
):
    kernel(f"{_name}.default")(_sum_backward(getattr(aten, _name).default))


@kernel("put.default")
def _put(self, index, source, accumulate=False):
    if not accumulate:
        return aten.put.default(self, index, source, False)
    return _accumulate(self, source, lambda z, t: aten.put.default(z, index, t, True))


@kernel("put_.default")
def _put_(self, index, source, accumulate=False):
    return self.copy_(_put(self, index, source, accumulate))


@kernel("cumprod.default")
def _cumprod(x, dim, *, dtype=None):
    """Each running product is the previous one times the next element, in float64: an order
    the definition fixes, one rounding per step."""
    floating(x)
    out = dtype or (x.dtype if x.is_floating_point() else torch.int64)
    return torch.cumprod(x.to(_F64), dim).to(out)


@kernel("cumprod_.default")
def _cumprod_(x, dim, *, dtype=None):
    return x.copy_(_cumprod(x, dim, dtype=dtype))
