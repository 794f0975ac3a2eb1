"""Float64 matrix products whose bits depend only on their inputs: every sum in one fixed order.

A float64 product could not be exact at a float32 product's cost: its operands' 53 bits need
three integer slices each and six float64 products of them (exact.py's rule for float32), six
times torch's own arithmetic. So a float64 product (a result at float64 precision) is defined
by its order instead, as a textbook loop writes it:

    out[i, j] = a[i, 0] * b[0, j], then out[i, j] + a[i, k] * b[k, j] for k = 1, 2, ...

each product and each sum one IEEE rounding in float64: no fused multiply-add, no reordering,
no blocking of k into partial sums. An inner dimension of 0 gives +0. Batches broadcast as in
torch.matmul. Nothing in it depends on the thread count, the instruction set, the library or
the device: the compiled kernel (native/csrc/ordered.c, every instruction set), the Triton kernel
(CUDA) and the torch loop below compute the same operations on each element in the same order,
and tests hold them together bit for bit.

What follows from the definition:
- the error is a float64 loop's: at most about k * 2**-53 times the sum of the terms'
  magnitudes (exact.py's float32 products round once; these round 2k - 1 times);
- `a @ b == (b.mT @ a.mT).mT`, and any block of rows or columns (a sample of a batch, a slice
  of the weight) is the whole product's block, bit for bit; but a product split along k and
  added back (two half sums) is another computation, with its own bits;
- infinities and NaN propagate as IEEE arithmetic in that order gives them (every NaN written
  as the one quiet NaN `math.nan` is), and a running sum can overflow where the exact sum would
  not.
"""

from __future__ import annotations

import math

import torch

from twice.portable.native import products as native_products

__all__ = ["ordered_matmul"]

_F64 = torch.float64


def ordered_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """`a @ b` in float64 by the rule above (torch.matmul's shapes: 1-d operands too)."""
    a64, b64 = a.to(_F64), b.to(_F64)
    if a64.dim() == 0 or b64.dim() == 0:
        raise RuntimeError("both arguments to matmul need to be at least 1D")
    vector_a, vector_b = a64.dim() == 1, b64.dim() == 1
    a64 = a64.unsqueeze(0) if vector_a else a64
    b64 = b64.unsqueeze(-1) if vector_b else b64
    out = _matrices(a64, b64)
    if vector_a and vector_b:
        return out[0, 0]
    out = out.squeeze(-1) if vector_b else out
    return out.squeeze(-2) if vector_a else out


def _matrices(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if a.shape[-1] != b.shape[-2]:
        raise RuntimeError(
            f"mat1 and mat2 shapes cannot be multiplied ({a.shape[-2]}x{a.shape[-1]} and "
            f"{b.shape[-2]}x{b.shape[-1]})"
        )
    if a.shape[-1] == 0 or a.numel() == 0 or b.numel() == 0:
        return torch.matmul(a, b)  # no term: +0 (or an empty result)
    if a.shape[-1] == 1:  # one term: its product (a rank-one update, a 1-feature input)
        return _canonical(a * b)
    fast = native_products.ordered_mm(a, b)
    if fast is not None:
        return fast
    gpu = native_products.gpu_ordered_mm(a, b)
    if gpu is not None:
        return gpu
    return ordered_loop(a, b)


def ordered_loop(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The rule in torch operations, one step of k at a time over the whole output (what runs
    where no compiled kernel applies, and the reference the kernels are tested against)."""
    total = a[..., :, :1] * b[..., :1, :]
    for k in range(1, a.shape[-1]):
        total = total + a[..., :, k : k + 1] * b[..., k : k + 1, :]
    return _canonical(total)


def _canonical(x: torch.Tensor) -> torch.Tensor:
    """Every NaN as the one quiet NaN `math.nan` is: the hardware picks a NaN's sign and payload
    (x86 a negative one, ARM and CUDA a positive one)."""
    return torch.where(x.isnan(), math.nan, x)
