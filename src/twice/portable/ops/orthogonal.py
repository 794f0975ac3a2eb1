"""Portable kernels for the Householder QR family: geqrf, linalg_qr, householder_product
(orgqr), ormqr and least squares (arithmetic/householder.py's algorithms, in float64, each
result rounded once to its dtype), in LAPACK's layouts and sign conventions."""

from __future__ import annotations

import torch

from twice.portable.arithmetic import factor
from twice.portable.arithmetic import householder as hh
from twice.portable.dispatch.table import kernel
from twice.portable.ops.linalg import as64

__all__ = ["least_squares"]

_F64 = torch.float64


@kernel("geqrf.default")
def _geqrf(a):
    (a64,) = as64(a)
    out, tau = hh.geqrf(a64)
    return out.to(a.dtype), tau.to(a.dtype)


@kernel("linalg_qr.default")
def _qr(a, mode="reduced"):
    (a64,) = as64(a)
    m, n = a.shape[-2:]
    k = min(m, n)
    packed, tau = hh.geqrf(a64)
    if mode == "complete":
        q, r = hh.orgqr(packed, tau, m), packed.triu()
    else:
        r = packed[..., :k, :].triu()
        q = hh.orgqr(packed[..., :, :k], tau, k) if mode == "reduced" else torch.empty(0)
    return q.to(a.dtype), r.to(a.dtype)


@kernel("linalg_householder_product.default", "orgqr.default")
def _householder_product(a, tau):
    a64, tau64 = as64(a, tau)
    return hh.orgqr(a64, tau64).to(a.dtype)


@kernel("ormqr.default")
def _ormqr(a, tau, c, left=True, transpose=False):
    a64, tau64, c64 = as64(a, tau, c)
    return hh.ormqr(a64, tau64, c64, left, transpose).to(c.dtype)


def least_squares(a64: torch.Tensor, b64: torch.Tensor):
    """(x, squared residuals or None) minimising |a x - b| for full-rank float64 a (..., m, n),
    b (..., m, p) by Householder QR: R^-1 Q^T b where m >= n (the residuals: the squares of
    Q^T b's last m - n rows, one exact sum), else the least-norm Q [R^-T b; 0] from a^T's QR."""
    m, n = a64.shape[-2:]
    batch = torch.broadcast_shapes(a64.shape[:-2], b64.shape[:-2])
    a64 = a64.expand(*batch, m, n)
    b64 = b64.expand(*batch, *b64.shape[-2:])
    if m >= n:
        packed, tau = hh.geqrf(a64)
        y = hh.ormqr(packed, tau, b64, left=True, transpose=True)
        x = factor.solve_triangular(packed[..., :n, :n], y[..., :n, :], upper=True)
        rest = y[..., n:, :]
        residuals = hh.dot(rest.mT, rest.mT)
        return x, residuals if m > n else None
    packed, tau = hh.geqrf(a64.mT)
    z = factor.solve_triangular(packed[..., :m, :m].mT, b64, upper=False)
    z = torch.cat([z, torch.zeros(*batch, n - m, z.shape[-1], dtype=_F64)], -2)
    return hh.ormqr(packed, tau, z, left=True, transpose=False), None
