"""Portable kernels for products with a sparse compressed (CSR) matrix: its product with a dense
matrix on either side (`mm`) and `sampled_addmm`, each output the exact sum of its products,
rounded once; and the selections of a CSR tensor (to_dense, sparse_mask), exact where it holds
each position once.

Torch's CPU kernels add a row's products one after another with fused multiply-adds where the
instruction set has them, so their bits follow the machine. Here a CSR matrix that holds each
position once (its column indices strictly increase along each row, `distinct`) is placed in a
dense matrix, and the product is exact.py's: the positions it does not store are zeros, which
add nothing to an exact sum of finite terms. Where the dense operand holds an infinity or a NaN,
a stored zero and a position not stored would differ (0 * inf is NaN; torch skips the position
it does not store), so such a product is refused by name, as is a batched or a CSC, BSR or BSC
operand. sampled_addmm is alpha * (mat1 @ mat2) + beta * self at self's positions, each product
and the sum rounded on its own (torch's CPU kernel fuses the last two where it can).
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


def distinct(x: torch.Tensor) -> bool:
    """Whether x is a 2-d CSR matrix that holds each position once (column indices strictly
    increasing along each row)."""
    if x.layout is not torch.sparse_csr or x.dim() != 2 or x.dense_dim() != 0:
        return False
    key = _rows(x) * max(1, x.shape[1]) + x.col_indices()
    return bool((key.diff() > 0).all())


def dense_of(x: torch.Tensor) -> torch.Tensor:
    """A CSR matrix's values placed in a dense one (exact: one value a position), or refused."""
    if not distinct(x):
        why = "a CSR matrix that may hold a position twice" if x.dim() == 2 else "a batched CSR"
        raise PortableUnsupported(f"{why} tensor: torch would add its duplicates")
    return aten._to_dense.default(x)


def csr_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b where one is a CSR matrix and the other a dense one: exact, rounded once."""
    strided = torch.strided
    if {a.layout, b.layout} != {torch.sparse_csr, strided} or a.dim() != 2 or b.dim() != 2:
        raise PortableUnsupported(f"a product of {a.layout} and {b.layout} tensors")
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
    values = x.values()
    if x._nnz() == 0 or mat1.numel() == 0 or mat2.numel() == 0:
        scaled = torch.mul(values, beta)
    else:
        product = exact_matmul(mat1, mat2, x.dtype)[_rows(x), x.col_indices()]
        scaled = torch.add(torch.mul(product, alpha), torch.mul(values, beta))
    return torch.sparse_csr_tensor(
        x.crow_indices().clone(), x.col_indices().clone(), scaled.to(x.dtype), x.shape
    )
