"""The compiled float64 matrix product in k's order (csrc/ordered.c: p_ordered_mm) and its Triton
twin for CUDA tensors (triton.py: ordered_mm), where they apply: arithmetic/ordered.py's rule,
the bits of its torch loop (tests compare them). And the same kernel for products of integer
slices (p_integer_mm: exact sums, the bits of torch.matmul's).

As in __init__.py, the function returns None where the kernel does not apply, and ordered.py
then takes the torch steps.
"""

from __future__ import annotations

import torch

from twice.portable import native
from twice.portable.native import buffer

__all__ = ["ordered_mm", "integer_mm", "gpu_ordered_mm"]


def ordered_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor | None:
    """p_ordered_mm of float64 `a` (..., m, k) and `b` (..., k, n), k >= 1, the batch
    dimensions broadcast as torch.matmul broadcasts them, read in place through their strides
    (a copy only where broadcast batch dimensions do not merge into one); or None."""
    return _product(a, b, "p_ordered_mm")


def integer_mm(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None):
    """ordered_mm's product of float64 integers whose every partial sum is exact (below 2**53:
    exact.py's slices), by p_integer_mm, whose tiles fuse the multiply and the add: the exact
    sums, so torch.matmul's bits but for the sign of a zero sum (exact.py's ZERO_SIGN); into
    `out` where given (contiguous, of the product's shape); or None."""
    return _product(a, b, "p_integer_mm", out)


def _product(a: torch.Tensor, b: torch.Tensor, kernel: str, out=None) -> torch.Tensor | None:
    if a.dtype != torch.float64 or b.dtype != torch.float64 or min(a.dim(), b.dim()) < 2:
        return None
    if not native.usable(a, b) or a.shape[-1] != b.shape[-2] or a.shape[-1] < 1:
        return None
    (m, k), n = a.shape[-2:], b.shape[-1]
    if b.dim() == 2 and a.dim() > 2:  # one right operand for the batch: the batch as rows
        if out is not None and (out.shape != (*a.shape[:-1], n) or not out.is_contiguous()):
            return None
        flat_out = None if out is None else out.view(-1, n)
        flat = _product(a.reshape(-1, k), b, kernel, flat_out)  # (each row's sums its own)
        if flat is None:
            return None
        return out if out is not None else flat.reshape(*a.shape[:-1], n)
    if a.dim() == 2 and b.dim() == 2:  # the common case without broadcasting's Python cost
        batch, a3, b3, a_strides, b_strides = (), a, b, (0, *a.stride()), (0, *b.stride())
    else:
        batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
        a3, b3 = _as_batch(a, batch), _as_batch(b, batch)
        a_strides, b_strides = a3.stride(), b3.stride()
    shape = (*batch, m, n)
    if out is None:
        out = native.empty(shape, torch.float64)
    elif out.shape != shape or out.dtype != torch.float64 or not out.is_contiguous():
        return None
    if not native.usable(out):
        return None
    getattr(native.module(), kernel)(
        a=native.strided(a3), b=native.strided(b3), out=buffer(out),
        batch=out.numel() // max(1, m * n) if batch else 1, m=m, k=k, n=n,
        a_strides=a_strides, b_strides=b_strides,
    )  # fmt: skip
    return out


def _as_batch(x: torch.Tensor, batch) -> torch.Tensor:
    """x broadcast to `batch` and its batch dimensions as one (a view where strides allow)."""
    x = x.expand(*batch, *x.shape[-2:])
    return x.reshape(-1, *x.shape[-2:]) if batch else x.unsqueeze(0)


def gpu_ordered_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor | None:
    """ordered_mm by the Triton kernel (native.gpu_kernels: CUDA tensors), or None."""
    kernels = native.gpu_kernels(a.device)
    if kernels is None or a.dtype != torch.float64 or b.dtype != torch.float64:
        return None
    batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    out = kernels.ordered_mm(_as_batch(a, batch), _as_batch(b, batch))
    return out.reshape(*batch, *out.shape[-2:])
