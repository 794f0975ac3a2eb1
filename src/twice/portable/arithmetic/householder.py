"""Householder QR and the products with its reflectors (geqrf, orgqr, ormqr's arithmetic) whose
bits depend only on their inputs, in float64 on (batched) matrices, in LAPACK's conventions.

Column k's reflector is LAPACK's (dlarfg): beta = -sign(alpha) |x|, tau = (beta - alpha)/beta,
v = x / (alpha - beta) with v[0] = 1, tau = 0 where x below its head is zero. |x| is the square
root (twice's) of one ordered sum of squares (arithmetic/ordered.py); applying
H = I - tau v v^T to a matrix C takes w = v^T C as ordered inner products, then each entry
C - v (tau w) as one product subtracted, each step one rounding. Columns are taken in order,
a count fixed by the shape.
"""

from __future__ import annotations

import torch

from twice.portable.arithmetic import elementwise as ew
from twice.portable.arithmetic.exact import exact_matmul
from twice.portable.arithmetic.factor import minus_product

__all__ = ["dot", "geqrf", "reflect_left", "reflect_right", "orgqr", "ormqr"]

_F64 = torch.float64


def dot(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """sum over the last dimension of x * y in its order (float64, arithmetic/ordered.py)."""
    return exact_matmul(x.unsqueeze(-2), y.unsqueeze(-1), _F64)[..., 0, 0]


def reflect_left(c: torch.Tensor, v: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
    """(I - tau v v^T) c for c (..., r, p), v (..., r), tau (...)."""
    w = exact_matmul(v.unsqueeze(-2), c, _F64)  # (..., 1, p)
    return minus_product(c, v.unsqueeze(-1), w * tau[..., None, None])


def reflect_right(c: torch.Tensor, v: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
    """c (I - tau v v^T) for c (..., p, r), v (..., r), tau (...)."""
    w = exact_matmul(c, v.unsqueeze(-1), _F64)  # (..., p, 1)
    return minus_product(c, w * tau[..., None, None], v.unsqueeze(-2))


def geqrf(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(R and the reflectors below it, tau) of float64 a (..., m, n), as LAPACK's geqrf."""
    m, n = a.shape[-2:]
    a = a.clone()
    steps = min(m, n)
    tau = torch.zeros(*a.shape[:-2], steps, dtype=_F64)
    for k in range(steps):
        x = a[..., k:, k]
        alpha = x[..., 0]
        tail = dot(x[..., 1:], x[..., 1:])
        norm = ew.sqrt(dot(x, x))
        beta = torch.where(alpha >= 0, -norm, norm)
        still = tail == 0  # nothing below the head: H = I, as dlarfg
        beta = torch.where(still, alpha, beta)
        t = torch.where(still, 0.0, (beta - alpha) / beta)
        scale = torch.where(still, 1.0, alpha - beta)
        v = torch.cat([torch.ones_like(alpha).unsqueeze(-1), x[..., 1:] / scale.unsqueeze(-1)], -1)
        if k + 1 < n:
            a[..., k:, k + 1 :] = reflect_left(a[..., k:, k + 1 :], v, t)
        a[..., k, k] = beta
        a[..., k + 1 :, k] = v[..., 1:]
        tau[..., k] = t
    return a, tau


def _reflector(a: torch.Tensor, k: int) -> torch.Tensor:
    """Column k's reflector from geqrf's layout: 1 at row k, the stored part below."""
    ones = torch.ones(a.shape[:-2], dtype=_F64).unsqueeze(-1)
    return torch.cat([ones, a[..., k + 1 :, k]], -1)


def orgqr(a: torch.Tensor, tau: torch.Tensor, columns: int | None = None) -> torch.Tensor:
    """The first `columns` (a's width by default) columns of H_1 ... H_k, k = tau's length:
    LAPACK's orgqr (householder_product), accumulated from the last reflector back."""
    m = a.shape[-2]
    columns = a.shape[-1] if columns is None else columns
    batch = torch.broadcast_shapes(a.shape[:-2], tau.shape[:-1])
    a = a.expand(*batch, *a.shape[-2:])
    tau = tau.expand(*batch, tau.shape[-1])
    q = torch.eye(m, columns, dtype=_F64).expand(*batch, m, columns).clone()
    for k in range(tau.shape[-1] - 1, -1, -1):
        q[..., k:, :] = reflect_left(q[..., k:, :], _reflector(a, k), tau[..., k])
    return q


def ormqr(a, tau, c, left: bool, transpose: bool) -> torch.Tensor:
    """Q c, Q^T c, c Q or c Q^T (LAPACK's ormqr) for Q = H_1 ... H_k from (a, tau)."""
    batch = torch.broadcast_shapes(a.shape[:-2], tau.shape[:-1], c.shape[:-2])
    a = a.expand(*batch, *a.shape[-2:])
    tau = tau.expand(*batch, tau.shape[-1])
    c = c.expand(*batch, *c.shape[-2:]).clone()
    steps = range(tau.shape[-1])
    forward = left == transpose  # Q^T c and c Q apply H_1 first
    for k in steps if forward else reversed(steps):
        v = _reflector(a, k)
        if left:
            c[..., k:, :] = reflect_left(c[..., k:, :], v, tau[..., k])
        else:
            c[..., :, k:] = reflect_right(c[..., :, k:], v, tau[..., k])
    return c
