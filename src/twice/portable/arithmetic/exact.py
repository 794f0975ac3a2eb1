"""Sums and matrix products whose bits depend only on their inputs: exact, then rounded once.

A reduction's bits depend on the order of its additions, and that order follows the thread count,
the vector width, the BLAS code path and the device. Here each operand is cut into slices of
integers on a grid fixed by the operand's largest magnitude along the reduced dimension (the
bits below the last slice are dropped, a choice that depends on the values alone). Every slice is
a float64 tensor of integers small enough that any sum of the products the reduction forms stays
below 2**53: every partial sum is exact, in any order, with or without fused multiply-adds. So
torch's own fastest kernels (BLAS, vectorised sums, and on the GPU cuBLAS) compute them, and the
result is the same everywhere. The slices' results are scaled by powers of two (exact) and added
in one fixed order in float64, then rounded once to the output dtype (at any range: scaling.py).

A product at float64 precision is not exact but ordered (ordered.py: six slice products would
cost six times torch's arithmetic); sums and other bilinear forms stay exact in float64 too.

Accuracy: a float32 result takes one slice (slices_for: at least 21 bits of each operand below
its row's largest magnitude in a product of up to 2048 terms, 29 in a sum), a float64 result
three. A product's error is bounded by the row's largest magnitude times the column's, not by
the sum of its terms' magnitudes: where a row and a column each mix magnitudes far apart, a
whole sum can be dropped (`[[2**30, 1]] @ [[2**-30], [1]]` is 0 in float32); docs/portable.md
has the figures.
Non-finite inputs give what IEEE arithmetic gives in any order: NaN where a NaN, an inf times
zero or infinities of both signs meet, otherwise the infinity.

ZERO_SIGN: an exact sum that is zero is +0. The sign IEEE arithmetic gives a sum of zeros
depends on the order and on where an accumulator starts (a BLAS kernel that starts from +0 or
from its first product, chosen by the shape and the instruction set), so every integer product
or sum is taken as `value + 0.0` before it is scaled, here and in the compiled kernels.
"""

from __future__ import annotations

import math

import torch
from torch._prims_common import canonicalize_dim

from twice.portable import native
from twice.portable.arithmetic import scaling
from twice.portable.arithmetic.ordered import ordered_matmul
from twice.portable.native import products as native_products

__all__ = [
    "exact_matmul",
    "integer_matmul",
    "exact_addmm",
    "exact_sum",
    "exact_cumsum",
    "exact_bilinear",
    "Repeated",
    "slices_for",
    "split",
    "beta_for",
    "unit_for",
]

_F64 = torch.float64
_MANTISSA = 53  # float64 keeps integers exact below 2**53


def slices_for(dtype: torch.dtype) -> int:
    """How many integer slices an operand is cut into for a result of `dtype`: one for float32
    (at least 21 bits below each row's largest magnitude in a product, 29 in a sum of up to 2**24
    terms: what a float32 result can hold), three for a float64 sum (a float64 matrix product
    is ordered.py's)."""
    return 3 if dtype == torch.float64 else 1


def beta_for(terms: int, factors: int) -> int:
    """Bits per slice so that `terms` products of `factors` slice integers sum exactly."""
    room = _MANTISSA - max(1, math.ceil(math.log2(max(terms, 2))))
    return max(
        1, min(50, room // factors)
    )  # below 2**51: the C kernels round by adding 1.5 * 2**52


def split(x: torch.Tensor, dims: tuple[int, ...] | None, count: int, beta: int) -> list:
    """`count` slices of float64 `x`: (integers, unit) pairs with `x` ~= sum(integers * unit).

    The unit of the first slice is 2**(e - beta), where 2**e bounds the largest magnitude over
    `dims` (all dimensions when None), so each slice's integers stay within 2**beta; each next
    slice holds the previous one's remainder on a grid 2**beta finer. Every step is exact."""
    mag = x.abs()
    unit = unit_for(mag.amax() if dims is None else mag.amax(dim=dims, keepdim=True), beta)
    parts, rest = [], x
    for index in range(count):
        ints = _slice_of(rest, unit)
        parts.append((ints, unit))
        if index + 1 < count:
            rest = rest - ints * unit
            unit = unit * (2.0**-beta)
    return parts


def _slice_of(rest: torch.Tensor, unit: torch.Tensor) -> torch.Tensor:
    """round(rest / unit): a slice's integers; a unit that underflowed to 0 (a grid below the
    smallest subnormal, for values near it) holds nothing, never 0 / 0."""
    return torch.where(unit > 0, torch.round(rest / unit), 0.0)


def unit_for(amax: torch.Tensor, beta: int) -> torch.Tensor:
    """The first slice's unit, 2**(e - beta), for values whose largest magnitude is `amax`
    (float64, finite), 2**e bounding it, never below 2**-1022: what `split` and the compiled
    kernel give."""
    _, exponent = torch.frexp(amax)
    return scaling.pow2(torch.clamp(exponent.to(torch.int64) - beta, min=-1022))


def _slices(x: torch.Tensor, dims, count: int, beta: int):
    """split(x) (the compiled kernel's where it applies), or None where x holds inf or NaN."""
    if count == 1:
        parts = native.split_rows(x, dims, beta)
        if parts is not None:
            return parts or None
    x64 = x.to(torch.float64)
    if not bool(torch.isfinite(x64).all()):
        return None
    return split(x64, dims, count, beta)


def exact_bilinear(
    a, b, form, a_dims, b_dims, terms: int, out_dtype, scale=None, precision=None
) -> torch.Tensor:
    """`form(a, b)` for a bilinear `form` made of products and sums (a matrix product, a product
    followed by a sum over a batch), computed exactly on slices and rounded once to `out_dtype`.

    `a_dims`/`b_dims` are the dimensions each operand's scale is taken over (those the form
    reduces); `terms` bounds how many products any output sums. The scales must broadcast
    through `form` as an outer product: `form(a * sa, b * sb) == form(a, b) * sa' * sb'`, which
    holds when each scale is constant over the reduced dimensions. Otherwise `scale(unit_a,
    unit_b)` gives the output's scale (a form that sums over whole-tensor scales, say)."""
    if a.numel() == 0 or b.numel() == 0:  # nothing to add: zeros (or an empty result)
        return form(a.to(torch.float64), b.to(torch.float64)).to(out_dtype)
    scale = scale or form
    count = slices_for(precision or out_dtype)
    beta = beta_for(terms * count, 2)
    sa = _slices(a, a_dims, count, beta)
    sb = _slices(b, b_dims, count, beta) if sa is not None else None
    if sa is None or sb is None:
        a64, b64 = a.to(torch.float64), b.to(torch.float64)
        return _nonfinite_bilinear(
            a64, b64, form, a_dims, b_dims, terms, out_dtype, scale, precision or out_dtype
        )
    step = 2.0**-beta
    levels = (  # products whose slices' units multiply to the same power
        [form(sa[p][0], sb[level - p][0]) for p in range(level + 1)] for level in range(count)
    )
    total = scaling.levels_added(levels, step)
    wide = _F64 in (a.dtype, b.dtype)
    return scaling.scaled(total, sa[0][1], sb[0][1], scale, wide).to(out_dtype)


def _nonfinite_bilinear(
    a, b, form, a_dims, b_dims, terms, out_dtype, scale, precision
) -> torch.Tensor:
    """The IEEE result where infinities or NaNs are among the operands: the finite part exactly,
    then NaN or an infinity wherever a product that reaches an output is one (counted exactly,
    with the form itself on 0/1 tensors)."""
    finite_a, finite_b = torch.isfinite(a), torch.isfinite(b)
    value = exact_bilinear(
        torch.where(finite_a, a, 0.0),
        torch.where(finite_b, b, 0.0),
        form,
        a_dims,
        b_dims,
        terms,
        torch.float64,
        scale,
        precision,
    )

    def count(x, y):
        return form(x.to(torch.float64), y.to(torch.float64))

    inf_a, inf_b = torch.isinf(a), torch.isinf(b)
    pos_a, pos_b, neg_a, neg_b = a > 0, b > 0, a < 0, b < 0
    nan = count(torch.isnan(a), torch.ones_like(b, dtype=torch.bool))
    nan = nan + count(torch.ones_like(a, dtype=torch.bool), torch.isnan(b))
    nan = nan + count(inf_a, b == 0) + count(a == 0, inf_b)
    positive = count(inf_a & pos_a, pos_b) + count(pos_a, inf_b & pos_b)
    positive = positive + count(inf_a & neg_a, neg_b) + count(neg_a, inf_b & neg_b)
    negative = count(inf_a & pos_a, neg_b) + count(pos_a, inf_b & neg_b)
    negative = negative + count(inf_a & neg_a, pos_b) + count(neg_a, inf_b & pos_b)
    out = torch.where(positive > 0, math.inf, value)
    out = torch.where(negative > 0, -math.inf, out)
    out = torch.where((nan > 0) | ((positive > 0) & (negative > 0)), math.nan, out)
    return out.to(out_dtype)


def exact_matmul(a: torch.Tensor, b: torch.Tensor, out_dtype=None, precision=None) -> torch.Tensor:
    """`a @ b` for (batched) matrices (torch.matmul broadcasting) at the precision of `precision`
    (the dtype the result ends in; `out_dtype` by default): exact then rounded once, or at
    float64 precision ordered.py's fixed order (then rounded to `out_dtype`)."""
    out_dtype = out_dtype or a.dtype
    if (precision or out_dtype) == _F64:
        return ordered_matmul(a, b).to(out_dtype)
    fast = _fast_matmul(a, b, out_dtype)
    if fast is not None:
        return fast
    return exact_bilinear(
        a, b, integer_matmul, (-1,), (-2,), max(1, a.shape[-1]), out_dtype, precision=precision
    )


def integer_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """torch.matmul of float64 slices of integers (every partial sum exact, as this module cuts
    them): the exact sums, one value whatever computes them, so by the faster of the compiled
    kernel and torch's own product (native/products.py: integer_product)."""
    return native_products.integer_product(a, b)


def _fast_matmul(a, b, out_dtype):
    """One slice of each operand split by the C kernel, one float64 product, scaled and rounded
    by the C kernel: exact_bilinear's steps for the common case, or None."""
    if a.dim() != b.dim() or a.dim() not in (2, 3) or a.numel() == 0 or b.numel() == 0:
        return None
    if a.dim() == 3 and a.shape[0] != b.shape[0]:
        return None
    beta = beta_for(max(1, a.shape[-1]), 2)
    sa = native.split_rows(a, (-1,), beta)
    if not sa:
        return None
    sb = native.split_rows(b, (-2,), beta)
    if not sb:
        return None
    return _scaled_product(sa[0], sb[0], out_dtype)


def _scaled_product(part_a, part_b, out_dtype):
    """The integer product of one slice of each operand, scaled by their units and rounded once
    by the C kernel."""
    (ints_a, unit_a), (ints_b, unit_b) = part_a, part_b
    return native.scaled(integer_matmul(ints_a, ints_b), unit_a, unit_b, out_dtype)


class Repeated:
    """One operand of many products, cut into slices once: `Repeated(w, dtype, "right")(a)`
    is `exact_matmul(a, w, dtype)` and `Repeated(w, dtype, "left")(b)` is `exact_matmul(w, b,
    dtype)`, bit for bit, as the slicing of an operand depends on that operand alone (a
    recurrent layer's weight at every time step, a convolution's weight for every batch of
    columns)."""

    def __init__(self, operand: torch.Tensor, out_dtype, side: str) -> None:
        self.operand, self.out_dtype, self.right = operand, out_dtype, side == "right"
        self.parts = None
        if operand.dim() != 2:
            return
        self.beta = beta_for(max(1, operand.shape[0 if self.right else 1]), 2)
        if slices_for(out_dtype) == 1 and operand.numel():
            parts = native.split_rows(operand, (-2,) if self.right else (-1,), self.beta)
            self.parts = parts[0] if parts else None

    def __call__(self, other: torch.Tensor) -> torch.Tensor:
        if self.parts is not None and other.dim() == 2 and other.numel():
            found = native.split_rows(other, (-1,) if self.right else (-2,), self.beta)
            if found:
                pair = (found[0], self.parts) if self.right else (self.parts, found[0])
                return _scaled_product(*pair, self.out_dtype)
        if self.right:
            return exact_matmul(other, self.operand, self.out_dtype)
        return exact_matmul(self.operand, other, self.out_dtype)


def exact_addmm(bias, a, b, out_dtype) -> torch.Tensor:
    """a @ b rounded to `out_dtype`, then bias added (one more rounding): the bits of `mm`
    followed by `add`, so that a linear layer gives the same bits whichever of the two forms
    torch picks for it (the batch's shape decides), and a sample's output does not depend on
    the batch it is in."""
    return torch.add(exact_matmul(a, b, out_dtype), bias.to(out_dtype))


def exact_sum(
    x: torch.Tensor, dims=None, keepdim: bool = False, out_dtype=None, precision=None
) -> torch.Tensor:
    """The sum of `x` over `dims` (all when None), exact then rounded once to `out_dtype`, at
    the precision of `precision` (by default the output's dtype, or the input's where the output
    is float64: an intermediate result)."""
    out_dtype = out_dtype or x.dtype
    precision = precision or (x.dtype if out_dtype == torch.float64 else out_dtype)
    dims = (
        tuple(range(x.dim())) if dims is None else tuple(canonicalize_dim(x.dim(), d) for d in dims)
    )
    if x.dim() == 0 or x.numel() == 0:
        return x.to(torch.float64).sum(dim=dims, keepdim=keepdim).to(out_dtype)
    count, beta = slices_for(precision), beta_for(math.prod(x.shape[d] for d in dims), 1)
    fast = native.row_sums(x, dims, beta, count, keepdim)
    if fast is not None and fast is not False:
        return fast.to(out_dtype)
    x64 = x.to(torch.float64)
    if fast is False or not bool(torch.isfinite(x64).all()):
        return _nonfinite_sum(x64, dims, keepdim, precision).to(out_dtype)
    total = None
    for ints, unit in split(x64, dims, count, beta):
        unit = unit if keepdim else unit.squeeze(dims)
        term = (ints.sum(dim=dims, keepdim=keepdim) + 0.0) * unit
        total = term if total is None else total + term
    return total.to(out_dtype)


def _nonfinite_sum(x: torch.Tensor, dims, keepdim: bool, precision) -> torch.Tensor:
    finite = torch.isfinite(x)
    value = exact_sum(torch.where(finite, x, 0.0), dims, keepdim, torch.float64, precision)
    positive = (x == math.inf).sum(dim=dims, keepdim=keepdim)
    negative = (x == -math.inf).sum(dim=dims, keepdim=keepdim)
    nan = torch.isnan(x).sum(dim=dims, keepdim=keepdim)
    out = torch.where(positive > 0, math.inf, value)
    out = torch.where(negative > 0, -math.inf, out)
    return torch.where((nan > 0) | ((positive > 0) & (negative > 0)), math.nan, out)


def exact_cumsum(x: torch.Tensor, dim: int, out_dtype=None) -> torch.Tensor:
    """The running sums of `x` along `dim`, each exact then rounded once to `out_dtype`: the
    slices' integers are summed in int64-sized float64 (below 2**53), so any scan order gives
    the same bits."""
    out_dtype = out_dtype or x.dtype
    dim = canonicalize_dim(x.dim(), dim)
    if x.dim() == 0 or x.numel() == 0:
        return x.to(out_dtype).clone()
    x64 = x.to(torch.float64)
    finite = torch.isfinite(x64)
    clean = torch.where(finite, x64, 0.0)
    count = slices_for(out_dtype if out_dtype != torch.float64 else x.dtype)
    total = None
    for ints, unit in split(clean, (dim,), count, beta_for(x.shape[dim], 1)):
        term = (torch.cumsum(ints, dim) + 0.0) * unit
        total = term if total is None else total + term
    if not bool(finite.all()):
        positive = torch.cumsum((x64 == math.inf).to(torch.int64), dim)
        negative = torch.cumsum((x64 == -math.inf).to(torch.int64), dim)
        nan = torch.cumsum(torch.isnan(x64).to(torch.int64), dim)
        total = torch.where(positive > 0, math.inf, total)
        total = torch.where(negative > 0, -math.inf, total)
        total = torch.where((nan > 0) | ((positive > 0) & (negative > 0)), math.nan, total)
    return total.to(out_dtype)
