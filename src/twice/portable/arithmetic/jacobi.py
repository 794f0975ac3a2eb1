"""Symmetric eigendecomposition and singular value decomposition by Jacobi rotations, whose bits
depend only on their inputs: float64, a fixed number of sweeps, a fixed order of pairs.

LAPACK's eigh and svd iterate until their own tests pass, through blocked code whose rounding
follows the BLAS and instruction set. Here each sweep visits every pair of columns once, in the
round-robin order of a tournament (n/2 disjoint pairs at a time, all rotated at once: every
batch element takes the same steps), and the number of sweeps depends on the size alone.
Rotations are applied with separate IEEE multiplies and adds; the sums a rotation's angle
needs (a column's squared norm, two columns' inner product) are ordered float64 sums.
Results are sorted as torch returns them (eigenvalues ascending, singular values descending;
ties keep their order), and each vector's sign is fixed by one rule: its component of largest
magnitude (the first on ties) is positive.
"""

from __future__ import annotations

import math

import torch

from twice.portable.arithmetic import elementwise as ew
from twice.portable.arithmetic.exact import exact_matmul

__all__ = ["sweeps_for", "rounds", "eigh", "svd", "fix_signs"]

_F64 = torch.float64


def sweeps_for(n: int) -> int:
    """Sweeps for an n-column problem: Jacobi converges quadratically once the off-diagonal
    is small; this leaves several sweeps of margin over what float64 needs."""
    return 10 + 2 * max(1, math.ceil(math.log2(max(n, 2))))


def rounds(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The pairs (p < q) of indices 0..N-1 (N = n rounded up to even), as N-1 rounds of N/2
    disjoint pairs (the circle method): every pair once per sweep."""
    size = n + n % 2
    players = list(range(size))
    out = []
    for _ in range(size - 1):
        pairs = [(players[i], players[size - 1 - i]) for i in range(size // 2)]
        p = torch.tensor([min(a, b) for a, b in pairs])
        q = torch.tensor([max(a, b) for a, b in pairs])
        out.append((p, q))
        players = [players[0], players[-1], *players[1:-1]]
    return out


def _rotation(zeta: torch.Tensor, zero: torch.Tensor):
    """(c, s) with t = sign(zeta) / (|zeta| + sqrt(1 + zeta^2)) the smaller root; the identity
    where the pair is already orthogonal (`zero`)."""
    big = zeta.abs() > 1e150  # zeta^2 would overflow: t = 1 / (2 zeta)
    safe = torch.where(big | zero, 0.0, zeta)
    t = torch.where(safe >= 0, 1.0, -1.0) / (safe.abs() + ew.sqrt(1.0 + safe * safe))
    t = torch.where(big, 0.5 / torch.where(zero, 1.0, zeta), t)
    t = torch.where(zero, 0.0, t)
    c = 1.0 / ew.sqrt(1.0 + t * t)
    return c, c * t


def _rotate_columns(x: torch.Tensor, p, q, c, s) -> torch.Tensor:
    """x with columns p, q replaced by c x_p - s x_q and s x_p + c x_q (c, s per pair)."""
    xp, xq = x[..., :, p], x[..., :, q]
    c, s = c.unsqueeze(-2), s.unsqueeze(-2)
    out = x.clone()
    out[..., :, p] = c * xp - s * xq
    out[..., :, q] = s * xp + c * xq
    return out


def _pad(x: torch.Tensor, rows: int, cols: int, eye: bool = False) -> torch.Tensor:
    """x padded with zeros to (rows, cols) (ones on the new diagonal where `eye`)."""
    r, c = x.shape[-2:]
    out = torch.zeros(*x.shape[:-2], rows, cols, dtype=_F64)
    out[..., :r, :c] = x
    if eye:
        for i in range(min(r, c), min(rows, cols)):
            out[..., i, i] = 1.0
    return out


def fix_signs(vectors: torch.Tensor) -> torch.Tensor:
    """Each column times the sign that makes its component of largest magnitude (the first on
    ties) positive."""
    if vectors.numel() == 0:
        return vectors
    index = vectors.abs().argmax(-2, keepdim=True)
    lead = vectors.gather(-2, index)
    return vectors * torch.where(lead < 0, -1.0, 1.0)


def eigh(a: torch.Tensor, vectors: bool = True):
    """(eigenvalues ascending, eigenvectors as columns or None) of symmetric float64 a
    (..., n, n), by cyclic two-sided Jacobi."""
    n = a.shape[-1]
    size = n + n % 2
    work = _pad(a, size, size)
    v = _pad(torch.eye(n, dtype=_F64).expand(a.shape), size, size, eye=True)
    schedule = rounds(n)
    for _ in range(sweeps_for(n) if n > 1 else 0):
        for p, q in schedule:
            apq = work[..., p, q]
            zero = apq == 0
            zeta = (work[..., q, q] - work[..., p, p]) / (2.0 * torch.where(zero, 1.0, apq))
            c, s = _rotation(zeta, zero)
            work = _rotate_columns(work, p, q, c, s)
            work = _rotate_columns(work.mT, p, q, c, s).mT
            if vectors:
                v = _rotate_columns(v, p, q, c, s)
    values = work.diagonal(dim1=-2, dim2=-1)[..., :n]
    values, order = torch.sort(values, dim=-1, stable=True)
    if not vectors:
        return values, None
    v = v[..., :n, :n].gather(-1, order.unsqueeze(-2).expand(*a.shape))
    return values, fix_signs(v)


def _gram(x: torch.Tensor, p, q):
    """(|x_p|^2, |x_q|^2, x_p . x_q) per pair, each an ordered float64 sum."""
    xp, xq = x[..., :, p].mT.unsqueeze(-2), x[..., :, q].mT.unsqueeze(-2)
    both = torch.cat([xp, xq], -2)  # (..., pairs, 2, m)
    gram = exact_matmul(both, both.mT, _F64)
    return gram[..., 0, 0], gram[..., 1, 1], gram[..., 0, 1]


def svd(a: torch.Tensor, full: bool, vectors: bool = True):
    """(U, S, V) of float64 a (..., m, n) with a = U diag(S) V^T, S descending, by one-sided
    Jacobi on a's columns (on a^T's where m < n). U is (m, m) where `full`, else (m, k)."""
    m, n = a.shape[-2:]
    if m < n:
        u, s, v = svd(a.mT, full, vectors)
        return (v, s, u) if vectors else (None, s, None)
    size = n + n % 2
    work = _pad(a, m, size)
    v = _pad(torch.eye(n, dtype=_F64).expand(*a.shape[:-2], n, n), size, size, eye=True)
    schedule = rounds(n)
    for _ in range(sweeps_for(n) if n > 1 else 0):
        for p, q in schedule:
            alpha, beta, gamma = _gram(work, p, q)
            zero = gamma == 0
            zeta = (beta - alpha) / (2.0 * torch.where(zero, 1.0, gamma))
            c, s = _rotation(zeta, zero)
            work = _rotate_columns(work, p, q, c, s)
            if vectors:
                v = _rotate_columns(v, p, q, c, s)
    work = work[..., :, :n]
    cols = work.mT.unsqueeze(-2)
    sigma = ew.sqrt(exact_matmul(cols, cols.mT, _F64)[..., 0, 0])
    sigma, order = torch.sort(sigma, dim=-1, descending=True, stable=True)
    if not vectors:
        return None, sigma, None
    work = work.gather(-1, order.unsqueeze(-2).expand(work.shape))
    v = v[..., :n, :n].gather(-1, order.unsqueeze(-2).expand(*a.shape[:-2], n, n))
    u = work / torch.where(sigma == 0, 1.0, sigma).unsqueeze(-2)
    if m:
        flip = torch.where(u.gather(-2, u.abs().argmax(-2, keepdim=True)) < 0, -1.0, 1.0)
        u, v = u * flip, v * flip
    if full or bool((sigma == 0).any()):
        u = _complete(u, sigma, m if full else n)
    return u, sigma, v


def _complete(u: torch.Tensor, sigma: torch.Tensor, columns: int) -> torch.Tensor:
    """u's columns for nonzero singular values, then orthonormal columns (from a Householder
    QR of u) up to `columns`: the null space's basis, fixed by u alone."""
    from twice.portable.arithmetic import householder as hh

    m, k = u.shape[-2:]
    kept = torch.where((sigma == 0).unsqueeze(-2), 0.0, u)
    packed, tau = hh.geqrf(kept)
    q = fix_signs(hh.orgqr(packed, tau, columns))
    head = torch.where((sigma == 0).unsqueeze(-2), q[..., :, :k], kept)
    return torch.cat([head, q[..., :, k:]], -1)
