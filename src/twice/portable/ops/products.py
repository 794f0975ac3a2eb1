"""Portable kernels for matrix products: mm, bmm, addmm, baddbmm, addbmm, mv, addmv, dot, all
exact then rounded once (exact.py), in float64 each sum in one order (ordered.py); mm with a CSR
operand through sparse.py. A bias or a
scaled input is added after the product is rounded, as the separate operations torch's
decompositions spell, so a linear layer has the same bits whichever form torch picks for it."""

from __future__ import annotations

import torch

from twice.portable.arithmetic.exact import exact_addmm, exact_matmul
from twice.portable.dispatch.table import kernel
from twice.portable.ops import sparse
from twice.portable.ops.math import floating

_F64 = torch.float64


def _affine(product, bias, beta, alpha, dtype):
    """alpha product + beta bias as the separate operations torch's decomposition of addmm
    spells (the product already rounded to `dtype`)."""
    if alpha != 1:
        product = torch.mul(product, alpha)
    if beta == 0:
        return product
    return torch.add(product, bias if beta == 1 else torch.mul(bias, beta))


@kernel("mm.default", "bmm.default", "matmul.default", sparse=True)
def _mm(a, b):
    if a.layout is not torch.strided or b.layout is not torch.strided:
        return sparse.csr_mm(a, b)  # a CSR matrix times a dense one; other layouts refused
    floating(a, b)
    if not a.is_floating_point():
        return torch.matmul(a, b)
    return exact_matmul(a, b)


@kernel("addmm.default", "baddbmm.default")
def _addmm(bias, a, b, beta=1, alpha=1):
    floating(bias, a, b)
    if beta == 1 and alpha == 1:
        return exact_addmm(bias, a, b, a.dtype)
    return _affine(exact_matmul(a, b, a.dtype), bias, beta, alpha, a.dtype)


@kernel("addbmm.default")
def _addbmm(self, batch1, batch2, *, beta=1, alpha=1):
    """beta self + alpha sum_i batch1_i @ batch2_i: the sum over the batch is one product (exact;
    float64: ordered, batch after batch) of the batches laid side by side."""
    floating(self, batch1, batch2)
    b, n, m = batch1.shape
    left = batch1.permute(1, 0, 2).reshape(n, b * m)
    right = batch2.reshape(b * m, batch2.shape[-1])
    product = exact_matmul(left, right, self.dtype)
    if alpha != 1:
        product = torch.mul(product, alpha)
    if beta == 0:
        return product.expand_as(self).clone() if product.shape != self.shape else product
    base = self if beta == 1 else torch.mul(self, beta)
    return torch.add(base, product)


@kernel("mv.default")
def _mv(a, v):
    floating(a, v)
    return exact_matmul(a, v.unsqueeze(-1)).squeeze(-1)


@kernel("addmv.default")
def _addmv(bias, a, v, beta=1, alpha=1):
    product = exact_matmul(a, v.unsqueeze(-1), a.dtype).squeeze(-1)
    return _affine(product, bias, beta, alpha, a.dtype)


@kernel("dot.default", "vdot.default")
def _dot(a, b):
    floating(a, b)
    return exact_matmul(a.unsqueeze(0), b.unsqueeze(-1)).reshape(())


@kernel("addr.default")
def _addr(self, vec1, vec2, *, beta=1, alpha=1):
    """beta self + alpha vec1 vec2^T: each product one multiplication (no sums)."""
    floating(self, vec1, vec2)
    outer = torch.mul(vec1.unsqueeze(1), vec2.unsqueeze(0))
    return _affine(outer, self, beta, alpha, outer.dtype)
