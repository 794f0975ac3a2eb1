"""Triangular factorizations and solves whose bits depend only on their inputs: Cholesky, LU
with partial pivoting, triangular solves, all in float64 on (batched) matrices.

LAPACK's results depend on its blocking, its BLAS and the instruction set. Here every entry of a
factor or a solution is one exact inner product (arithmetic/exact: the entry's right-hand side
minus the products already known, exact then rounded once to float64), then one division or
square root (twice's). The loops run over the matrix's columns or rows, a count fixed by the
shape; each batch element is computed by the same elementwise steps, so its bits do not depend
on the batch it is in. Pivots follow one rule: the largest magnitude, the first index on ties.
"""

from __future__ import annotations

import torch

from twice.portable.arithmetic import elementwise as ew
from twice.portable.arithmetic.exact import exact_matmul

__all__ = [
    "minus_product",
    "cholesky",
    "solve_triangular",
    "lu_factor",
    "permutation",
    "lu_solve",
    "det_from_lu",
]

_F64 = torch.float64


def minus_product(c: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """c - a @ b for float64 (batched) matrices, exact then rounded once: one exact product of
    [c a] and [I; -b]."""
    if a.shape[-1] == 0:
        return c.clone()
    batch = torch.broadcast_shapes(c.shape[:-2], a.shape[:-2], b.shape[:-2])
    c = c.expand(*batch, *c.shape[-2:])
    a = a.expand(*batch, *a.shape[-2:])
    b = b.expand(*batch, *b.shape[-2:])
    eye = torch.eye(c.shape[-1], dtype=_F64).expand(*batch, c.shape[-1], c.shape[-1])
    return exact_matmul(torch.cat([c, a], -1), torch.cat([eye, -b], -2), _F64)


def cholesky(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(L, info) with L lower triangular and L L^T = a, from a's lower triangle (float64,
    (..., n, n)), column by column. info (int32) is the order of the first leading minor that
    is not positive definite (0 where none is), as LAPACK's; such a column and those after it
    hold NaN."""
    n = a.shape[-1]
    low = torch.zeros_like(a)
    info = torch.zeros(a.shape[:-2], dtype=torch.int32)
    for j in range(n):
        col = minus_product(a[..., j:, j : j + 1], low[..., j:, :j], low[..., j : j + 1, :j].mT)
        d = col[..., 0, 0]
        bad = ~(d > 0)
        info = torch.where(bad & (info == 0), j + 1, info)
        root = ew.sqrt(torch.where(bad, torch.nan, d))
        low[..., j, j] = root
        low[..., j + 1 :, j] = col[..., 1:, 0] / root.unsqueeze(-1)
    return low, info


def solve_triangular(
    a: torch.Tensor, b: torch.Tensor, upper: bool, unit: bool = False
) -> torch.Tensor:
    """x with a x = b for triangular a (..., n, n) and b (..., n, k), float64, row by row
    (forward for lower, backward for upper), each row one exact inner product then one
    division. Only a's triangle is read; `unit` takes its diagonal as ones."""
    n = a.shape[-1]
    batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    a = a.expand(*batch, n, n)
    x = b.expand(*batch, *b.shape[-2:]).clone()
    for i in range(n - 1, -1, -1) if upper else range(n):
        done = slice(i + 1, n) if upper else slice(0, i)
        row = minus_product(x[..., i : i + 1, :], a[..., i : i + 1, done], x[..., done, :])
        if not unit:
            row = row / a[..., i : i + 1, i : i + 1]
        x[..., i : i + 1, :] = row
    return x


def _swap_rows(x: torch.Tensor, k: int, other: torch.Tensor) -> torch.Tensor:
    """x with row k and row `other` (per batch element, int64 (...)) exchanged (a gather)."""
    rows = torch.arange(x.shape[-2])
    other = other.unsqueeze(-1)
    index = torch.where(rows == k, other, torch.where(rows == other, k, rows))
    return x.gather(-2, index.unsqueeze(-1).expand(x.shape))


def lu_factor(a: torch.Tensor, pivot: bool = True):
    """(LU, pivots, info) of float64 a (..., m, n) as LAPACK's getrf lays them out (L unit lower
    below the diagonal, U on and above it, pivots 1-based int32, info the first zero pivot's
    order), by Crout's order: column k of L, then row k of U, each entry one exact inner product.
    The pivot of column k is the first row of largest magnitude from k down."""
    m, n = a.shape[-2:]
    lu = a.clone()
    steps = min(m, n)
    pivots = torch.empty(*a.shape[:-2], steps, dtype=torch.int32)
    info = torch.zeros(a.shape[:-2], dtype=torch.int32)
    for k in range(steps):
        col = minus_product(lu[..., k:, k : k + 1], lu[..., k:, :k], lu[..., :k, k : k + 1])
        lu[..., k:, k : k + 1] = col
        if pivot:
            best = col[..., 0].abs().nan_to_num(nan=torch.inf).argmax(-1) + k
            lu = _swap_rows(lu, k, best)
            pivots[..., k] = (best + 1).to(torch.int32)
        else:
            pivots[..., k] = k + 1
        head = lu[..., k, k]
        zero = head == 0
        info = torch.where(zero & (info == 0), k + 1, info)
        below = lu[..., k + 1 :, k]
        lu[..., k + 1 :, k] = torch.where(zero.unsqueeze(-1), below, below / head.unsqueeze(-1))
        if k + 1 < n:
            lu[..., k : k + 1, k + 1 :] = minus_product(
                lu[..., k : k + 1, k + 1 :], lu[..., k : k + 1, :k], lu[..., :k, k + 1 :]
            )
    return lu, pivots, info


def permutation(pivots: torch.Tensor, m: int) -> torch.Tensor:
    """The row order (int64 (..., m)) LAPACK's sequential swaps give: P^T b is b[order]."""
    order = torch.arange(m).expand(*pivots.shape[:-1], m).clone()
    for i in range(pivots.shape[-1]):
        order = _swap_rows(order.unsqueeze(-1), i, pivots[..., i].long() - 1).squeeze(-1)
    return order


def _rows(x: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    return x.gather(-2, order.unsqueeze(-1).expand(*order.shape, x.shape[-1]))


def lu_solve(lu: torch.Tensor, pivots: torch.Tensor, b: torch.Tensor, adjoint: bool = False):
    """x with A x = b (A^T x = b where `adjoint`), A = P L U given by (lu, pivots) (float64,
    (..., n, n)) and b (..., n, k)."""
    n = lu.shape[-1]
    batch = torch.broadcast_shapes(lu.shape[:-2], b.shape[:-2], pivots.shape[:-1])
    lu = lu.expand(*batch, n, n)
    b = b.expand(*batch, *b.shape[-2:])
    order = permutation(pivots.expand(*batch, pivots.shape[-1]), n)
    if not adjoint:
        y = solve_triangular(lu, _rows(b, order), upper=False, unit=True)
        return solve_triangular(lu, y, upper=True)
    y = solve_triangular(lu.mT, b, upper=False)
    z = solve_triangular(lu.mT, y, upper=True, unit=True)
    return torch.empty_like(z).scatter_(-2, order.unsqueeze(-1).expand(z.shape), z)


def det_from_lu(lu: torch.Tensor, pivots: torch.Tensor):
    """(sign of the permutation, U's diagonal): the determinant is their product."""
    swaps = (pivots.long() != torch.arange(1, pivots.shape[-1] + 1)).sum(-1)
    sign = 1.0 - 2.0 * (swaps % 2).to(_F64)
    return sign, lu.diagonal(dim1=-2, dim2=-1)
