"""The compiled steps of a float64 exact product (csrc/exact.c: p_slices, p_combine3), where
they apply: an operand's second and third slices from its first in one pass, and the six slice
products' scaled sum, rounded once, in another, each in the torch route's IEEE operations (so
the same bits; tests compare the two routes).

As in __init__.py, each function returns None where the kernel does not apply, and exact.py then
takes the torch steps.
"""

from __future__ import annotations

import torch

from twice.portable import native
from twice.portable.native import buffer

__all__ = ["slices", "combine3"]


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


def combine3(products, unit_a, units_b, out_dtype):
    """exact._fast_matmul3's sum of its three stacked integer products, each level scaled by
    unit_a times that level's right unit, rounded once (p_combine3); or None."""
    first, second, third = products
    if not native.usable(first, second, third, unit_a, *units_b) or out_dtype not in native.KINDS:
        return None
    if third.dim() not in (2, 3):
        return None
    rows, cols = third.shape[-2:]
    blocks = third.numel() // max(1, rows * cols)
    if first.numel() != 3 * third.numel() or second.numel() != 2 * third.numel():
        return None
    ua = unit_a.to(torch.float64).expand(*third.shape[:-1], 1).contiguous()
    ub = torch.stack([u.to(torch.float64).expand(*third.shape[:-2], 1, cols) for u in units_b], -3)
    out = native.empty(third.shape, out_dtype)
    native.module().p_combine3(
        first=buffer(first.contiguous()), second=buffer(second.contiguous()),
        third=buffer(third.contiguous()), blocks=blocks, rows=rows, cols=cols,
        unit_a=buffer(ua), unit_b=buffer(ub.contiguous()), out=buffer(out),
    )  # fmt: skip
    return out
