"""Portable kernels for the spectral decompositions and what is built on them: eigh, eigvalsh,
svd, svdvals (through _linalg_svd), pinv, least squares and the matrix exponential (Jacobi
rotations from arithmetic/jacobi.py, QR from arithmetic/householder.py, products in one order:
ordered.py), in float64, each result rounded once to its dtype."""

from __future__ import annotations

import torch

from twice.portable.arithmetic import elementwise as ew
from twice.portable.arithmetic import jacobi
from twice.portable.arithmetic.exact import exact_matmul, exact_sum
from twice.portable.arithmetic.factor import minus_product
from twice.portable.dispatch.table import kernel
from twice.portable.ops.linalg import as64
from twice.portable.ops.orthogonal import least_squares

__all__ = ["symmetric"]

_F64 = torch.float64
_TAYLOR = 18  # terms of exp's series at |X| <= 1/2: the remainder is below 2**-80


def symmetric(a64: torch.Tensor, uplo: str) -> torch.Tensor:
    """The symmetric matrix LAPACK reads from a's lower ("L") or upper ("U") triangle."""
    low = a64.tril() if uplo.upper() == "L" else a64.triu().mT
    return low + low.tril(-1).mT


@kernel("_linalg_eigh.default")
def _eigh(a, uplo="L", compute_v=True):
    (a64,) = as64(a)
    values, vectors = jacobi.eigh(symmetric(a64, uplo), compute_v)
    vectors = vectors.to(a.dtype) if compute_v else torch.empty(0, dtype=a.dtype)
    return values.to(a.dtype), vectors


@kernel("_linalg_svd.default")
def _svd(a, full_matrices=False, compute_uv=True, driver=None):
    (a64,) = as64(a)
    u, s, v = jacobi.svd(a64, full_matrices, compute_uv)
    if not compute_uv:
        empty = torch.empty(0, dtype=a.dtype)
        return empty, s.to(a.dtype), empty
    return u.to(a.dtype), s.to(a.dtype), v.mT.to(a.dtype)


def _tolerance(values, atol, rtol, dtype, size):
    """max(atol, rtol * the largest |value|) with torch's defaults: rtol = eps * size where
    neither is given, 0 where only a positive atol is."""
    if rtol is None:
        given = atol is not None and bool((torch.as_tensor(atol) > 0).all())
        rtol = 0.0 if given else torch.finfo(dtype).eps * size
    atol = 0.0 if atol is None else atol
    largest = values.abs().amax(-1, keepdim=True) if values.shape[-1] else values.sum(-1, True)
    atol = torch.as_tensor(atol, dtype=_F64).unsqueeze(-1)
    rtol = torch.as_tensor(rtol, dtype=_F64).unsqueeze(-1)
    return torch.maximum(atol, rtol * largest)


@kernel("linalg_pinv.atol_rtol_tensor", "linalg_pinv.atol_rtol_float")
def _pinv(a, *, atol=None, rtol=None, hermitian=False):
    (a64,) = as64(a)
    m, n = a.shape[-2:]
    if hermitian:
        values, q = jacobi.eigh(symmetric(a64, "L"))
        tol = _tolerance(values, atol, rtol, a.dtype, max(m, n))
        inverse = torch.where(values.abs() > tol, 1.0 / values, 0.0)
        out = exact_matmul(q * inverse.unsqueeze(-2), q.mT, _F64)
    else:
        u, s, v = jacobi.svd(a64, False)
        tol = _tolerance(s, atol, rtol, a.dtype, max(m, n))
        inverse = torch.where(s > tol, 1.0 / s, 0.0)
        out = exact_matmul(v * inverse.unsqueeze(-2), u.mT, _F64)
    return out.to(a.dtype)


@kernel("linalg_lstsq.default")
def _lstsq(a, b, rcond=None, *, driver=None):
    """torch's outputs per driver (gelsy by default): the solution, the squared residuals
    (gels, gelsd, gelss, where m > n), the rank (all but gels) and the singular values (gelsd,
    gelss). Full-rank systems are solved by QR (gels, gelsy), the others by the SVD."""
    a64, b64 = as64(a, b)
    driver = driver or "gelsy"
    m, n = a.shape[-2:]
    vector = b.dim() == a.dim() - 1
    if vector:
        b64 = b64.unsqueeze(-1)
    batch = torch.broadcast_shapes(a.shape[:-2], b64.shape[:-2])
    a64, b64 = a64.expand(*batch, m, n), b64.expand(*batch, *b64.shape[-2:])
    rcond = torch.finfo(a.dtype).eps * max(m, n) if rcond is None else rcond
    rank = torch.empty(0, dtype=torch.int64)
    values = torch.empty(0, dtype=a.dtype)
    if driver != "gels":
        _, s, _ = jacobi.svd(a64, False, False)
        kept = s > rcond * s[..., :1] if s.shape[-1] else s > 0
        rank = kept.sum(-1)
    if driver in ("gelsd", "gelss"):
        u, s, v = jacobi.svd(a64, False)
        inverse = torch.where(kept, 1.0 / s, 0.0)
        x = exact_matmul(v * inverse.unsqueeze(-2), exact_matmul(u.mT, b64, _F64), _F64)
        values = s.to(a.dtype)
    else:
        x, _ = least_squares(a64, b64)
    residuals = torch.empty(0, dtype=a.dtype)
    full = driver == "gels" or bool((rank == n).all())
    if driver != "gelsy" and m > n and full:
        r = minus_product(b64, a64, x).mT
        residuals = exact_matmul(r.unsqueeze(-2), r.unsqueeze(-1), _F64)[..., 0, 0]
        residuals = residuals.squeeze(-1) if vector else residuals
        residuals = residuals.to(a.dtype)
    x = x.squeeze(-1) if vector else x
    return x.to(torch.result_type(a, b)), residuals, rank, values


@kernel("linalg_matrix_exp.default")
def _matrix_exp(a):
    """exp(a) by scaling and squaring: X = a / 2^s with |X|_1 <= 1/2 (s per matrix), Taylor's
    series to degree 18 by Horner's rule (each product ordered.py's), then s squarings, a matrix
    that needs fewer than the batch's most keeping its own (frozen) from then on."""
    (a64,) = as64(a)
    n = a.shape[-1]
    if a.numel() == 0:
        return a.clone()
    norm = exact_sum(a64.abs(), dims=(-2,), out_dtype=_F64, precision=_F64).amax(-1)
    _, exponent = torch.frexp(torch.nan_to_num(norm, nan=0.0, posinf=2.0**60))
    steps = torch.clamp(exponent.to(torch.int64) + 1, min=0, max=61)
    x = a64 * ew.pow2(-steps)[..., None, None]
    eye = torch.eye(n, dtype=_F64).expand(a64.shape)
    total = eye.clone()
    for k in range(_TAYLOR, 0, -1):
        total = eye + exact_matmul(x, total, _F64) / float(k)
    for i in range(int(steps.max()) if steps.numel() else 0):
        squared = exact_matmul(total, total, _F64)
        total = torch.where((i < steps)[..., None, None], squared, total)
    bad = ~torch.isfinite(a64).all(-1).all(-1)
    total = torch.where(bad[..., None, None], torch.nan, total)
    return total.to(a.dtype)
