"""Portable kernels for the triangular factorizations and what is built on them: Cholesky, LU,
the symmetric indefinite LDL^T, triangular and general solves, inverses, determinants, trace
and cross products
(arithmetic/factor.py's algorithms, in float64, each result rounded once to its dtype).

Each kernel returns what torch's returns (the same outputs, dtypes and LAPACK layouts: LU and
1-based int32 pivots, int32 info), so autograd's formulas, which take these outputs, run
unchanged and route their own operations.
"""

from __future__ import annotations

import math

import torch

from twice.portable.arithmetic import elementwise as ew
from twice.portable.arithmetic import factor
from twice.portable.arithmetic.exact import exact_sum
from twice.portable.dispatch.table import kernel
from twice.portable.ops.math import floating

__all__ = ["as64", "check"]

_F64 = torch.float64


def as64(*tensors):
    """The float64 copies of float32 or float64 tensors (other dtypes refused)."""
    floating(*tensors)
    return [t.to(_F64) for t in tensors]


def check(info: torch.Tensor, name: str, what: str) -> None:
    """Raise torch's error where `info` flags a failed factorization (check_errors=True)."""
    if bool((info != 0).any()):
        raise torch.linalg.LinAlgError(f"{name}: {what}")


def _cholesky_lower(a64: torch.Tensor, upper: bool):
    """(L, info) from the triangle LAPACK reads: the lower, or the upper (as its transpose)."""
    return factor.cholesky(a64.mT if upper else a64)


@kernel("linalg_cholesky_ex.default")
def _cholesky_ex(a, *, upper=False, check_errors=False):
    (a64,) = as64(a)
    low, info = _cholesky_lower(a64, upper)
    if check_errors:
        check(info, "linalg.cholesky", "The factorization could not be completed")
    low = low.to(a.dtype)
    return (low.mT.contiguous() if upper else low), info


@kernel("cholesky.default")
def _cholesky(a, upper=False):
    out, info = _cholesky_ex(a, upper=upper)
    check(info, "linalg.cholesky", "The factorization could not be completed")
    return out


def _cholesky_solve64(b64, l64, upper):
    """x with (L L^T) x = b, L lower (or U^T U with U upper)."""
    low = l64.mT if upper else l64
    y = factor.solve_triangular(low, b64, upper=False)
    return factor.solve_triangular(low.mT, y, upper=True)


@kernel("cholesky_solve.default")
def _cholesky_solve(b, factor_, upper=False):
    b64, l64 = as64(b, factor_)
    return _cholesky_solve64(b64, l64, upper).to(b.dtype)


@kernel("cholesky_inverse.default")
def _cholesky_inverse(factor_, upper=False):
    (l64,) = as64(factor_)
    eye = torch.eye(l64.shape[-1], dtype=_F64).expand(l64.shape)
    return _cholesky_solve64(eye, l64, upper).to(factor_.dtype)


@kernel("linalg_solve_triangular.default")
def _solve_triangular(a, b, *, upper, left=True, unitriangular=False):
    a64, b64 = as64(a, b)
    if left:
        x = factor.solve_triangular(a64, b64, upper, unitriangular)
    else:  # x a = b: a^T x^T = b^T, a^T's triangle the other one
        x = factor.solve_triangular(a64.mT, b64.mT, not upper, unitriangular).mT
    return x.to(torch.result_type(a, b))


@kernel("triangular_solve.default")
def _triangular_solve(b, a, upper=True, transpose=False, unitriangular=False):
    a64, b64 = as64(a, b)
    if transpose:
        x = factor.solve_triangular(a64.mT, b64, not upper, unitriangular)
    else:
        x = factor.solve_triangular(a64, b64, upper, unitriangular)
    batch = x.shape[:-2]
    return x.to(b.dtype), a.expand(*batch, *a.shape[-2:]).clone()


@kernel("linalg_lu_factor_ex.default")
def _lu_factor_ex(a, *, pivot=True, check_errors=False):
    (a64,) = as64(a)
    lu, pivots, info = factor.lu_factor(a64, pivot)
    if check_errors:
        check(info, "torch.linalg.lu_factor", "The factorization could not be completed")
    return lu.to(a.dtype), pivots, info


@kernel("lu_unpack.default")
def _lu_unpack(lu, pivots, unpack_data=True, unpack_pivots=True):
    # Copies, triangles and a permutation built from the integer pivots: no arithmetic on
    # floats, so torch's own kernel gives the same bits everywhere.
    return torch.ops.aten.lu_unpack.default(lu, pivots, unpack_data, unpack_pivots)


@kernel("linalg_lu.default")
def _lu(a, *, pivot=True):
    lu, pivots, _ = _lu_factor_ex(a, pivot=pivot)
    p, low, up = torch.ops.aten.lu_unpack.default(lu, pivots)
    if not pivot:
        p = torch.empty(0, dtype=a.dtype)
    return p, low, up


def _lu_solve64(lu64, pivots, b64, left, adjoint):
    if left:
        return factor.lu_solve(lu64, pivots, b64, adjoint)
    return factor.lu_solve(lu64, pivots, b64.mT, not adjoint).mT


@kernel("linalg_lu_solve.default")
def _lu_solve(lu, pivots, b, *, left=True, adjoint=False):
    lu64, b64 = as64(lu, b)
    return _lu_solve64(lu64, pivots, b64, left, adjoint).to(torch.result_type(lu, b))


@kernel("linalg_ldl_factor_ex.default")
def _ldl_factor_ex(a, *, hermitian=False, check_errors=False):
    # real tensors only (the mode refuses complex ones): hermitian and symmetric are the same
    (a64,) = as64(a)
    ld, pivots, info = factor.ldl_factor(a64)
    if check_errors:
        check(info, "torch.linalg.ldl_factor_ex", "a zero pivot: D is singular")
    return ld.to(a.dtype), pivots, info


@kernel("linalg_ldl_solve.default")
def _ldl_solve(ld, pivots, b, *, hermitian=False):
    # torch's checks on the arguments (LAPACK would read out of bounds on others)
    torch._check(ld.dim() >= 2 and ld.shape[-1] == ld.shape[-2], lambda: "LD must be square")
    torch._check(b.dim() >= 2 and b.shape[-2] == ld.shape[-1], lambda: "B's rows must be LD's")
    torch._check(pivots.shape == ld.shape[:-1], lambda: "pivots must be LD.shape[:-1]")
    torch._check(ld.dtype == b.dtype, lambda: f"LD and B of one dtype: {ld.dtype}, {b.dtype}")
    torch._check(pivots.dtype in (torch.int32, torch.int64), lambda: "pivots must be integers")
    n = ld.shape[-1]
    torch._check(bool(((pivots.abs() >= 1) & (pivots.abs() <= n)).all()), lambda: "bad pivots")
    ld64, b64 = as64(ld, b)
    return factor.ldl_solve(ld64, pivots, b64).to(torch.result_type(ld, b))


@kernel("_linalg_solve_ex.default")
def _solve_ex(a, b, *, left=True, check_errors=False):
    a64, b64 = as64(a, b)
    vector = b.dim() == 1 or (b.dim() == a.dim() - 1 and b.shape == a.shape[:-1])
    if vector:
        b64 = b64.unsqueeze(-1) if left else b64.unsqueeze(-2)
    lu, pivots, info = factor.lu_factor(a64)
    if check_errors:
        check(info, "torch.linalg.solve", "The solver failed because the input is singular.")
    x = _lu_solve64(lu, pivots, b64, left, False)
    if vector:
        x = x.squeeze(-1) if left else x.squeeze(-2)
    return x.to(torch.result_type(a, b)), lu.to(a.dtype), pivots, info


@kernel("linalg_inv_ex.default")
def _inv_ex(a, *, check_errors=False):
    (a64,) = as64(a)
    lu, pivots, info = factor.lu_factor(a64)
    if check_errors:
        check(info, "linalg.inv", "The diagonal element is zero, the inversion could not be done")
    eye = torch.eye(a.shape[-1], dtype=_F64).expand(a64.shape)
    return factor.lu_solve(lu, pivots, eye).to(a.dtype), info


def _det_lu(a):
    """LU of a, or of a^T where a is contiguous (torch's choice: det(a^T) = det(a), and its
    backward reads the factors with that rule)."""
    (a64,) = as64(a)
    return factor.lu_factor(a64.mT if a.is_contiguous() else a64)


def _product(values: torch.Tensor) -> torch.Tensor:
    """The product over the last dimension, multiplied left to right in float64."""
    total = torch.ones(values.shape[:-1], dtype=_F64)
    for i in range(values.shape[-1]):
        total = total * values[..., i]
    return total


@kernel("_linalg_det.default")
def _det(a):
    lu, pivots, _ = _det_lu(a)
    sign, diagonal = factor.det_from_lu(lu, pivots)
    return (sign * _product(diagonal)).to(a.dtype), lu.to(a.dtype), pivots


@kernel("_linalg_slogdet.default")
def _slogdet(a):
    lu, pivots, _ = _det_lu(a)
    sign, diagonal = factor.det_from_lu(lu, pivots)
    signs = _product(torch.sign(diagonal)) * sign
    logs = exact_sum(ew.log(diagonal.abs()), dims=(-1,), out_dtype=_F64, precision=_F64)
    logs = torch.where(signs == 0, -math.inf, logs)
    return signs.to(a.dtype), logs.to(a.dtype), lu.to(a.dtype), pivots


@kernel("trace.default")
def _trace(a):
    floating(a)
    if not a.is_floating_point():
        return a.diagonal().sum()
    return exact_sum(a.diagonal(), out_dtype=a.dtype)


@kernel("linalg_cross.default")
def _cross(a, b, *, dim=-1):
    """a x b: each component a difference of two products, the products exact in float64 for
    float32 operands."""
    same = a.dim() == b.dim()
    torch._check(same, lambda: "linalg.cross: inputs must have the same number of dimensions.")
    a64, b64 = as64(a, b)
    shape = torch.broadcast_shapes(a.shape, b.shape)
    a64, b64 = a64.expand(shape), b64.expand(shape)
    parts = []
    for i, j in ((1, 2), (2, 0), (0, 1)):
        left = a64.select(dim, i) * b64.select(dim, j)
        parts.append(left - a64.select(dim, j) * b64.select(dim, i))
    return torch.stack(parts, dim).to(torch.result_type(a, b))
