"""Portable kernels for products with a sparse compressed (CSR or CSC) matrix: its product with a
dense matrix on either side (`mm`) and `sampled_addmm`, each output the portable product's sum
of its products (exact on the operands' slices: docs/portable.md's precision), rounded once, in
float64 added in order (ordered.py);
and the selections of a CSR tensor (to_dense, sparse_mask), exact where it holds each position
once.

Torch's CPU kernels add a row's products one after another with fused multiply-adds where the
instruction set has them, so their bits follow the machine. Here a CSR matrix that holds each
position once (its column indices strictly increase along each row, `distinct`) is placed in a
dense matrix, and the product is exact.py's: the positions it does not store are zeros, which
add nothing to an exact sum of finite terms. Where the dense operand holds an infinity or a NaN,
a stored zero and a position not stored would differ (0 * inf is NaN; torch skips the position
it does not store), so such a product is refused by name, as is a batched, a BSR or a BSC
operand, and one of more than 2**24 positions (placing it would take more memory than its
product is worth; torch's kernel reads only what it stores). A CSC matrix (autograd's transpose
of a CSR one) is placed as the transpose of its CSR transpose. sampled_addmm is
alpha * (mat1 @ mat2) + beta * self at self's positions, each product and the sum rounded on
its own (torch's CPU kernel fuses the last two where it can).
"""

from __future__ import annotations

import torch

from twice.portable.arithmetic.exact import exact_matmul
from twice.portable.dispatch.table import PortableUnsupported, kernel

__all__ = ["distinct", "csr_mm", "sampled_addmm", "dense_of"]

aten = torch.ops.aten


def _rows(x: torch.Tensor) -> torch.Tensor:
    """The row of each stored value of a 2-d CSR matrix."""
    return torch.repeat_interleave(torch.arange(x.shape[0]), x.crow_indices().diff())


_PLACED = 1 << 24  # the most positions a matrix placed densely may have (128 MiB in float64)


def distinct(x: torch.Tensor) -> bool:
    """Whether x is a 2-d CSR matrix that holds each position once (column indices in range and
    strictly increasing along each row)."""
    if x.layout is not torch.sparse_csr or x.dim() != 2 or x.dense_dim() != 0:
        return False
    cols = x.col_indices()
    if x._nnz() and not bool(((cols >= 0) & (cols < x.shape[1])).all()):
        return False
    key = _rows(x) * max(1, x.shape[1]) + cols
    return bool((key.diff() > 0).all())


def dense_of(x: torch.Tensor) -> torch.Tensor:
    """A CSR matrix's values (a CSC one's, as its transpose's) placed in a dense one (exact: one
    value a position), or refused: one that may hold a position twice, or too large to place."""
    if x.layout is torch.sparse_csc and x.dim() == 2:
        return dense_of(x.t()).t()  # the transpose of a CSC matrix is a CSR one, no copy
    if not distinct(x):
        if x.dim() != 2:
            raise PortableUnsupported(f"a {x.dim()}-d {x.layout} tensor")
        raise PortableUnsupported("a CSR matrix that may hold a position twice (torch adds them)")
    if x.shape[0] * x.shape[1] > _PLACED:
        raise PortableUnsupported(
            f"a {x.shape[0]}x{x.shape[1]} CSR matrix: too large to place densely for an exact "
            "product"
        )
    return aten._to_dense.default(x)


def csr_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b where one is a CSR matrix and the other a dense one: exact_matmul's."""
    strided, compressed = torch.strided, (torch.sparse_csr, torch.sparse_csc)
    if strided not in (a.layout, b.layout) or {a.layout, b.layout} - {strided, *compressed}:
        raise PortableUnsupported(f"a product of {a.layout} and {b.layout} tensors")
    if a.layout is b.layout or a.dim() != 2 or b.dim() != 2:
        raise PortableUnsupported(f"a product of {a.dim()}-d {a.layout} and {b.layout} tensors")
    torch._check(
        a.dtype == b.dtype, lambda: f"expected mat1 and mat2 of one dtype: {a.dtype}, {b.dtype}"
    )
    (m, k), (k2, n) = a.shape, b.shape
    torch._check(
        k == k2, lambda: f"mat1 and mat2 shapes cannot be multiplied ({m}x{k} and {k2}x{n})"
    )
    dense = b if b.layout is strided else a
    if dense.is_floating_point() and not bool(torch.isfinite(dense).all()):
        raise PortableUnsupported(
            "a CSR product whose dense operand holds an infinity or a NaN (torch skips the "
            "positions the sparse one does not store)"
        )
    left = a if a.layout is strided else dense_of(a)
    right = b if b.layout is strided else dense_of(b)
    return exact_matmul(left, right, torch.result_type(a, b))


@kernel("sparse_sampled_addmm.default", sparse=True)
def sampled_addmm(x, mat1, mat2, *, beta=1, alpha=1):
    """alpha * (mat1 @ mat2) + beta * x at x's positions (a CSR matrix of x's pattern)."""
    if not distinct(x) or mat1.dim() != 2 or mat2.dim() != 2:
        raise PortableUnsupported("sampled_addmm of a batched CSR tensor or one with duplicates")
    torch._check(
        mat1.dtype == mat2.dtype == x.dtype,
        lambda: f"sampled_addmm: expected one dtype, got {x.dtype}, {mat1.dtype}, {mat2.dtype}",
    )
    shapes = (x.shape[0], mat1.shape[1], x.shape[1])
    torch._check(
        (mat1.shape[0], mat2.shape[0], mat2.shape[1]) == shapes,
        lambda: f"sampled_addmm: {tuple(mat1.shape)} @ {tuple(mat2.shape)} is not {tuple(x.shape)}",
    )
    values = x.values()
    if x._nnz() == 0 or mat1.numel() == 0 or mat2.numel() == 0:
        scaled = torch.mul(values, beta)
    else:
        product = exact_matmul(mat1, mat2, x.dtype)[_rows(x), x.col_indices()]
        scaled = torch.add(torch.mul(product, alpha), torch.mul(values, beta))
    crow, col = (t.to(torch.int64, copy=True) for t in (x.crow_indices(), x.col_indices()))
    return torch.sparse_csr_tensor(crow, col, scaled.to(x.dtype), x.shape)  # int64, as torch
