"""The compiled float64 matrix product in k's order (csrc/ordered.c: p_ordered_mm) and its Triton
twin for CUDA tensors (triton.py: ordered_mm), where they apply: arithmetic/ordered.py's rule,
the bits of its torch loop (tests compare them). And the same kernel for products of integer
slices (p_integer_mm: exact sums, the bits of torch.matmul's).

As in __init__.py, the function returns None where the kernel does not apply, and ordered.py
then takes the torch steps.
"""

from __future__ import annotations

import statistics
import time

import torch

from twice.portable import native
from twice.portable.native import buffer

__all__ = ["ordered_mm", "integer_mm", "integer_product", "gpu_ordered_mm"]


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


def integer_product(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None):
    """torch.matmul(a, b, out=out) of integer slices (integer_mm's operands): by p_integer_mm
    where it applies and runs faster than torch's own product on this CPU at this thread count
    (`faster_than_torch`), else by torch.matmul. The sums are exact, so both give the same
    values (tests hold them to the same bits); only the time differs."""
    if native.usable(a, b) and faster_than_torch():
        found = integer_mm(a, b, out)
        if found is not None:
            return found
    return torch.matmul(a, b) if out is None else torch.matmul(a, b, out=out)


_FASTER: dict[int, bool] = {}


def faster_than_torch() -> bool:
    """Whether p_integer_mm beats torch's float64 product (the BLAS torch links: MKL, which runs
    a slower path on some CPUs, OpenBLAS, Accelerate) on this machine at torch's thread count:
    both timed once a process and thread count, in turn, on the same integers (a product of
    about 6 MFLOP, 1 to 2 ms in all). False without the compiled kernels."""
    if not native.available():  # (not kept: the kernels may be turned back on)
        return False
    threads = torch.get_num_threads()
    if threads not in _FASTER:
        faster = _timed_faster()
        if faster is None:  # the kernel declined meanwhile (turned off in another thread)
            return False
        _FASTER[threads] = faster
    return _FASTER[threads]


def _timed_faster(rounds: int = 5) -> bool | None:
    """Whether p_integer_mm took less time than torch.matmul (median of `rounds`, in turn);
    None where the kernel declined."""
    g = torch.Generator(device="cpu").manual_seed(0)
    ints = {"generator": g, "device": "cpu", "dtype": torch.float64}
    a = torch.randint(-(2**20), 2**20, (48, 256), **ints)
    b = torch.randint(-(2**20), 2**20, (256, 256), **ints)
    ours, theirs = [], []
    for _ in range(rounds + 1):  # the first of each is a warm-up
        start = time.perf_counter()
        if integer_mm(a, b) is None:
            return None
        middle = time.perf_counter()
        torch.matmul(a, b)
        ours.append(middle - start)
        theirs.append(time.perf_counter() - middle)
    return statistics.median(ours[1:]) < statistics.median(theirs[1:])


def _product(a: torch.Tensor, b: torch.Tensor, kernel: str, out=None) -> torch.Tensor | None:
    if a.dtype != torch.float64 or b.dtype != torch.float64 or min(a.dim(), b.dim()) < 2:
        return None
    if not native.usable(a, b) or a.shape[-1] != b.shape[-2] or a.shape[-1] < 1:
        return None
    if a.numel() == 0 or b.numel() == 0 or (out is not None and _shares(out, a, b)):
        return None  # (an empty product, or an out that is an operand: torch's to decide)
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


def _shares(out: torch.Tensor, *operands: torch.Tensor) -> bool:
    """Whether `out`'s bytes meet any operand's (the kernel reads its operands while it writes),
    whatever storages hold them (two tensors over one array are two storages)."""
    return any(_overlap(_bytes(out), _bytes(x)) for x in operands)


def _bytes(x: torch.Tensor) -> tuple[int, int]:
    """The span of memory x's elements lie in: [first byte, past the last)."""
    return x.data_ptr(), x.data_ptr() + native.span(x) * x.element_size()


def _overlap(one: tuple[int, int], other: tuple[int, int]) -> bool:
    return one[0] < other[1] and other[0] < one[1]


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
