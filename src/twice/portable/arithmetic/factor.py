"""Triangular factorizations and solves whose bits depend only on their inputs: Cholesky, LU
with partial pivoting, triangular solves, the symmetric indefinite LDL^T (Bunch-Kaufman), all
in float64 on (batched) matrices.

LAPACK's results depend on its blocking, its BLAS and the instruction set. Here every entry of a
factor or a solution is one float64 inner product in a fixed order (arithmetic/ordered: the
entry's right-hand side, then each product already known taken away in order), then one division
or square root (twice's). The loops run over the matrix's columns or rows, a count fixed by the
shape; each batch element is computed by the same elementwise steps, so its bits do not depend
on the batch it is in. Pivots follow one rule: the largest magnitude, the first index on ties.

LDL^T follows LAPACK's sytrf (lower): Bunch-Kaufman's choice of a 1x1 or 2x2 pivot, LAPACK's
compact layout of L and D and its pivot encoding, so ldl_solve (and a reader of the pivots)
takes them as LAPACK's. Its columns are computed left-looking (as sytrf's blocked dlasyf does),
each updated column one ordered product; its pivot choices differ from LAPACK's
only where its rounding does. Each matrix of a batch is factored on its own (the pivots decide
the steps).
"""

from __future__ import annotations

import math

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
    "ldl_factor",
    "ldl_solve",
]

_F64 = torch.float64


def minus_product(c: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """c - a @ b for float64 (batched) matrices: c, then each product a_ik b_kj taken away in
    k's order (one float64 product of [c a] and [1; -b] in ordered.py's order, a column at a
    time where b has more than one)."""
    if a.shape[-1] == 0:
        return c.clone()
    batch = torch.broadcast_shapes(c.shape[:-2], a.shape[:-2], b.shape[:-2])
    rows, cols, inner = c.shape[-2], c.shape[-1], a.shape[-1]
    if rows == 0 or cols == 0:
        return c.expand(*batch, rows, cols).clone()
    c = c.expand(*batch, rows, cols)
    a = a.expand(*batch, rows, inner)
    b = b.expand(*batch, inner, cols)
    if cols == 1:  # one column (the factorizations' column updates): one product
        one = _ONE.expand(*batch, 1, 1)
        return exact_matmul(torch.cat([c, a], -1), torch.cat([one, -b], -2), _F64)
    left = torch.cat([c.mT.unsqueeze(-1), a.unsqueeze(-3).expand(*batch, cols, rows, inner)], -1)
    right = torch.cat([_ONE.expand(*batch, cols, 1, 1), -b.mT.unsqueeze(-1)], -2)
    return exact_matmul(left, right, _F64).squeeze(-1).mT  # (..., rows, cols)


_ONE = torch.ones(1, 1, dtype=_F64)


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
    (forward for lower, backward for upper), each row one ordered inner product then one
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
    order), by Crout's order: column k of L, then row k of U, each entry one ordered inner product.
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


_ALPHA = (1.0 + math.sqrt(17.0)) / 8.0  # Bunch-Kaufman's bound (IEEE sqrt: correctly rounded)


def _first_max(v: torch.Tensor) -> tuple[int, float]:
    """The first index of v's largest magnitude (LAPACK's idamax: NaN never wins) and it."""
    mags = v.abs()
    index = int(mags.nan_to_num(nan=-1.0).argmax())
    return index, float(mags[index])


class _Sytrf:
    """One matrix's factorization: working rows in the order of the interchanges so far
    (`order`: the original row of each), L's and W's (= L D's) columns with every interchange
    applied, as dlasyf keeps them within its panel."""

    def __init__(self, a: torch.Tensor) -> None:
        n = self.n = a.shape[-1]
        lower = torch.ones(n, n, dtype=torch.bool).tril()
        self.s = torch.where(lower, a, a.mT)  # the symmetric matrix the lower triangle holds
        self.order = torch.arange(n)
        self.low = torch.zeros(n, n, dtype=_F64)  # L's columns (and D's 2x2 off-diagonals)
        self.w = torch.zeros(n, n, dtype=_F64)
        self.pivots = torch.zeros(n, dtype=torch.int32)
        self.info = 0

    def column(self, j: int, k: int) -> torch.Tensor:
        """Working column j of the trailing matrix after k steps, rows k..n-1: one ordered
        product (minus_product)."""
        rows = self.order[k:]
        a = self.s[rows, self.order[j]].unsqueeze(-1)
        return minus_product(a, self.low[k:, :k], self.w[j : j + 1, :k].mT)[:, 0]

    def swap(self, i: int, j: int, k: int) -> None:
        """Interchange working rows (and columns) i and j, in the columns done (0..k-1)."""
        for t in (self.order, self.low, self.w):
            t[[i, j]] = t[[j, i]]

    def step(self, k: int) -> int:
        """Pivot step k (a 1x1 or a 2x2 block, as dsytf2 chooses); returns its size."""
        col = self.column(k, k)
        absakk = float(col[0].abs())
        imax, colmax = (k + 1 + (m := _first_max(col[1:]))[0], m[1]) if k + 1 < self.n else (k, 0.0)
        if max(absakk, colmax) == 0.0 or math.isnan(absakk):
            self.info = self.info or k + 1  # a zero (or NaN) column: kept as it is
            self.w[k:, k], self.low[k:, k] = col, col
            self.pivots[k] = k + 1
            return 1
        kp, kstep = k, 1
        if not absakk >= _ALPHA * colmax:
            other = self.column(imax, k)  # the trailing matrix's column (and row) imax
            rest = torch.cat([other[: imax - k], other[imax - k + 1 :]])
            rowmax = _first_max(rest)[1]
            if absakk >= _ALPHA * colmax * (colmax / rowmax):
                pass
            elif float(other[imax - k].abs()) >= _ALPHA * rowmax:
                kp = imax
            else:
                kp, kstep = imax, 2
        last = k + kstep - 1
        if kp != last:
            self.swap(last, kp, k)
        if kstep == 1:
            col = self.column(k, k) if kp != k else col
            self.w[k:, k] = col
            self.low[k, k] = col[0]
            self.low[k + 1 :, k] = col[1:] / col[0]
            self.pivots[k] = kp + 1
            return 1
        c0, c1 = self.column(k, k), self.column(k + 1, k)
        self.w[k:, k], self.w[k:, k + 1] = c0, c1
        d21 = c0[1]  # dlasyf's arithmetic for the two columns of L
        d11, d22 = c1[1] / d21, c0[0] / d21
        t = 1.0 / (d11 * d22 - 1.0)
        d21 = t / d21
        self.low[k, k], self.low[k + 1, k], self.low[k + 1, k + 1] = c0[0], c0[1], c1[1]
        self.low[k + 2 :, k] = d21 * (d11 * c0[2:] - c1[2:])
        self.low[k + 2 :, k + 1] = d21 * (d22 * c1[2:] - c0[2:])
        self.pivots[k] = self.pivots[k + 1] = -(kp + 1)
        return 2

    def run(self):
        k = 0
        while k < self.n:
            k += self.step(k)
        # LAPACK's layout: each column of L without the interchanges of the steps after it
        # (dlasyf's "partially undoing the interchanges in columns 1:k-1")
        j = self.n - 1
        while j >= 0:
            jj, jp = j, int(self.pivots[j])
            if jp < 0:
                jp, j = -jp, j - 1
            j -= 1
            if jp - 1 != jj and j >= 0:
                rows = [jp - 1, jj]
                self.low[rows, : j + 1] = self.low[rows[::-1], : j + 1]
        return self.low, self.pivots, self.info


def ldl_factor(a: torch.Tensor):
    """(LD, pivots, info) of symmetric float64 a (..., n, n), read from its lower triangle, in
    LAPACK's sytrf layout (lower): D's 1x1 and 2x2 blocks on the diagonal (and subdiagonal), L
    unit lower below them, the upper triangle zero; pivots 1-based int32, negative for both
    rows of a 2x2 block; info the first step whose column was zero (int32)."""
    n, batch = a.shape[-1], a.shape[:-2]
    count = math.prod(batch) if n else 0
    parts = [_Sytrf(m).run() for m in a.reshape(count, n, n)]
    if not parts:
        empty = torch.zeros(*batch, n, dtype=torch.int32)
        return torch.zeros_like(a), empty, torch.zeros(batch, dtype=torch.int32)
    ld = torch.stack([p[0] for p in parts])
    pivots = torch.stack([p[1] for p in parts])
    info = torch.tensor([p[2] for p in parts], dtype=torch.int32)
    return ld.reshape(a.shape), pivots.reshape(*batch, n), info.reshape(batch)


def _ldl_solve_one(ld: torch.Tensor, pivots: list[int], b: torch.Tensor) -> torch.Tensor:
    """dsytrs (lower) for one matrix: b's rows interchanged and solved step by step, each
    update one ordered product (minus_product)."""
    n, x = ld.shape[-1], b.clone()

    def exchange(i, j):
        if i != j:
            x[[i, j]] = x[[j, i]]

    k = 0
    while k < n:  # L D y = P^T b
        if pivots[k] > 0:
            exchange(k, pivots[k] - 1)
            x[k + 1 :] = minus_product(x[k + 1 :], ld[k + 1 :, k : k + 1], x[k : k + 1])
            x[k] = x[k] / ld[k, k]
            k += 1
            continue
        if k + 1 >= n or pivots[k + 1] != pivots[k]:
            raise RuntimeError(f"ldl_solve: pivot {k + 1} opens a 2x2 block that does not close")
        exchange(k + 1, -pivots[k] - 1)
        x[k + 2 :] = minus_product(x[k + 2 :], ld[k + 2 :, k : k + 2], x[k : k + 2])
        akm1k = ld[k + 1, k]
        akm1, ak = ld[k, k] / akm1k, ld[k + 1, k + 1] / akm1k
        denom = akm1 * ak - 1.0
        bkm1, bk = x[k] / akm1k, x[k + 1] / akm1k
        x[k], x[k + 1] = (ak * bkm1 - bk) / denom, (akm1 * bk - bkm1) / denom
        k += 2
    k = n - 1
    while k >= 0:  # L^T P^T x = y
        first = k - 1 if pivots[k] < 0 else k
        x[first : k + 1] = minus_product(
            x[first : k + 1], ld[k + 1 :, first : k + 1].mT, x[k + 1 :]
        )
        exchange(k, abs(pivots[k]) - 1)
        k = first - 1
    return x


def ldl_solve(ld: torch.Tensor, pivots: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """x with A x = b, A = P L D L^T P^T given by ldl_factor's (LD, pivots) (float64,
    (..., n, n)) and b (..., n, k), broadcast over the batch."""
    n = ld.shape[-1]
    batch = torch.broadcast_shapes(ld.shape[:-2], pivots.shape[:-1], b.shape[:-2])
    shape = (*batch, *b.shape[-2:])
    if n == 0 or math.prod(shape) == 0:
        return torch.zeros(shape, dtype=_F64)
    lds = ld.expand(*batch, n, n).reshape(-1, n, n)
    pivs = pivots.expand(*batch, n).reshape(-1, n)
    bs = b.expand(shape).reshape(-1, *b.shape[-2:])
    return torch.stack(
        [_ldl_solve_one(m, p.tolist(), c) for m, p, c in zip(lds, pivs, bs)]
    ).reshape(shape)
