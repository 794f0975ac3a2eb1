"""The compiled steps of a float64 exact product (csrc/exact.c: p_split3, p_slices,
p_combine3), where they apply: an operand's three slices in one pass, laid out for the product
(or its second and third slices from its first), and the six slice products' scaled sum, rounded
once, in another, each in the torch route's IEEE operations (so the same bits; tests compare the
two routes).

As in __init__.py, each function returns None where the kernel does not apply, and exact.py then
takes the torch steps.
"""

from __future__ import annotations

import torch

from twice.portable import native
from twice.portable.native import buffer

__all__ = ["slices", "combine3", "left3", "right3"]


def _split3(x: torch.Tensor, axis: int, beta: int):
    """p_split3 of contiguous float64 `x` (2-d or a batch of matrices) along `axis`: (slices,
    units) in its layout, or False where a value is not finite."""
    rows, cols = x.shape[-2:]
    outer = x.numel() // max(1, rows * cols)
    batch = tuple(x.shape[:-2])
    shape = (*batch, 3, rows, cols) if axis == 0 else (3, *batch, rows, cols)
    out = native.empty(shape, torch.float64)
    units = native.empty((*batch, rows if axis == 0 else cols), torch.float64)
    finite = native.module().p_split3(
        src=buffer(x), outer=outer, rows=rows, cols=cols, beta=beta, axis=axis,
        out=buffer(out), units=buffer(units),
    )  # fmt: skip
    return (out, units) if finite else False


def _applies(x: torch.Tensor) -> bool:
    return native.usable(x) and x.dtype == torch.float64 and x.dim() in (2, 3) and x.numel() > 0


def left3(a: torch.Tensor, beta: int):
    """The left operand's three slices, split per row, as one tensor (..., 3, rows, cols) (a
    view where `a` is a transposed matrix), and the rows' first units (..., rows); None where
    the kernel does not apply, False where a value is not finite."""
    if not _applies(a):
        return None
    flipped = a.transpose(-1, -2)
    if not a.is_contiguous() and flipped.is_contiguous():  # split per column of a^T
        parts = _split3(flipped, 1, beta)
        return parts and (parts[0].transpose(-1, -2).movedim(0, -3), parts[1])
    return _split3(a.contiguous(), 0, beta)


def right3(b: torch.Tensor, beta: int):
    """The right operand's three slices, split per column, each (..., rows, cols) (views where
    `b` is a transposed matrix), and the columns' first units (..., cols); None or False as
    left3."""
    if not _applies(b):
        return None
    flipped = b.transpose(-1, -2)
    if not b.is_contiguous() and flipped.is_contiguous():  # split per row of b^T
        parts = _split3(flipped, 0, beta)
        return parts and ([parts[0].select(-3, q).transpose(-1, -2) for q in range(3)], parts[1])
    parts = _split3(b.contiguous(), 1, beta)
    return parts and (list(parts[0].unbind(0)), parts[1])


def slices(x: torch.Tensor, ints: torch.Tensor, unit: torch.Tensor, beta: int):
    """exact.split's second and third slices of float64 `x` (2-d or a batch of matrices) from
    its first (`ints` on `unit`, which broadcasts against x): [ints2, ints3], or None."""
    if not native.usable(x, ints, unit) or x.dtype != torch.float64 or x.dim() not in (2, 3):
        return None
    if ints.shape != x.shape or x.numel() == 0:
        return None
    x3, ints3 = x.contiguous().reshape(-1, *x.shape[-2:]), ints.contiguous()
    full = unit.to(torch.float64).expand(x.shape)  # a view: the strides say where units repeat
    full = full.unsqueeze(0) if x.dim() == 2 else full
    second, third = native.empty(x.shape, torch.float64), native.empty(x.shape, torch.float64)
    native.module().p_slices(
        src=buffer(x3), ints=buffer(ints3), blocks=x3.shape[0], rows=x3.shape[1],
        cols=x3.shape[2], unit=native.strided(full), unit_block_stride=full.stride(0),
        unit_row_stride=full.stride(1), unit_col_stride=full.stride(2), step=2.0**-beta,
        second=buffer(second), third=buffer(third),
    )  # fmt: skip
    return [second, third]


def combine3(products, unit_a, unit_b, out_dtype, step):
    """exact._fast_matmul3's sum of its three stacked integer products (each (..., 3 - q, rows,
    cols)), each level's products added exactly, then the levels times step**level (2**-beta)
    in order (scaling.levels_added), then times the rows' first units
    unit_a (..., rows) and the columns' unit_b (..., cols) (SCALE), rounded once (p_combine3);
    or None."""
    first, second, third = (p.contiguous() for p in products)
    rows, cols = third.shape[-2:]
    blocks = third.numel() // max(1, rows * cols)
    if not native.usable(first, second, third, unit_a, unit_b) or out_dtype not in native.KINDS:
        return None
    if third.dim() < 3 or (first.numel(), second.numel()) != (3 * third.numel(), 2 * third.numel()):
        return None
    out = native.empty((*third.shape[:-3], rows, cols), out_dtype)
    native.module().p_combine3(
        first=buffer(first), second=buffer(second), third=buffer(third), blocks=blocks,
        rows=rows, cols=cols, unit_a=buffer(unit_a.contiguous()),
        unit_b=buffer(unit_b.contiguous()), out=buffer(out), step=step,
    )  # fmt: skip
    return out
