"""Portable mode's compiled kernels (twice._native; csrc/, a C file per family), where they apply.

Each function returns None where the compiled kernel does not apply (no extension built, a tensor
on another device or of another dtype, `fallback()` in force): the caller then computes the same
bits with torch operations. The C code receives the polynomial coefficients and constants from
elementwise.py, so the two paths share one definition of each function. Every buffer goes to C as
one description, `buffer(tensor)`: (address, elements, dtype code), which the kernel checks.
"""

from __future__ import annotations

import contextlib
import math
import os

import torch
from torch._prims_common import canonicalize_dim

from twice.portable.arithmetic.coefficients import BINARY_KERNELS, UNARY_KERNELS

__all__ = [
    "available",
    "keep_memory",
    "usable",
    "empty",
    "module",
    "buffer",
    "strided",
    "span",
    "KINDS",
    "fallback",
    "gpu",
    "gpu_uniform",
    "unary",
    "binary",
    "split_rows",
    "row_sums",
    "scaled",
    "compound",
    "uniform",
    "normal",
]

try:
    from twice import _native as _module

    if not hasattr(_module, "p_init"):
        _module = None
except ImportError:  # built without a C compiler
    _module = None

# Codes by the one table of the kernels (coefficients.py); a build whose own table differs
# (a stale extension) is not used: the torch fallbacks give the same bits.
_UNARY = {n: i for i, n in enumerate(UNARY_KERNELS)}
_BINARY = {n: i for i, n in enumerate(BINARY_KERNELS)}
_kernels = getattr(_module, "p_kernels", None)
if _kernels is None or _kernels() != (UNARY_KERNELS, BINARY_KERNELS):
    _module = None
KINDS = {torch.float32: 0, torch.float64: 1}
_state = {"on": True, "ready": False, "threads": 1}


def gpu(name: str, x: torch.Tensor, dtype=None) -> torch.Tensor | None:
    """elementwise.<name>(x) by the Triton kernel (gpu_kernels), or None."""
    kernels = gpu_kernels(x.device) if x.dtype in KINDS else None
    if kernels is None or name not in kernels.FUNCTIONS:
        return None
    from twice.portable.arithmetic.coefficients import KERNEL_ARGS

    return kernels.unary(name, x, dtype or x.dtype, *KERNEL_ARGS)


def gpu_uniform(count: int, key: int, device) -> torch.Tensor | None:
    """philox.uniform by the Triton kernel on a CUDA device, or None."""
    kernels = gpu_kernels(torch.device(device)) if device is not None else None
    return None if kernels is None else kernels.uniform(count, key, device)


def gpu_kernels(device: torch.device):
    """The Triton kernels' module (native/triton.py) for tensors on `device`: a CUDA device
    where Triton is there (or, for tests, any device under TRITON_INTERPRET=1) and the kernels
    are in use; None otherwise."""
    interpret = os.environ.get("TRITON_INTERPRET") == "1" and _state.get("gpu_tests")
    if not _state["on"] or (device.type != "cuda" and not interpret):
        return None
    if "gpu" not in _state:
        try:
            from twice.portable.native import triton as kernels
        except ImportError:  # no Triton: a CPU build of torch
            kernels = None
        _state["gpu"] = kernels
    return _state["gpu"]


def _init() -> None:
    from twice.portable.arithmetic.coefficients import KERNEL_ARGS

    _module.p_init(*KERNEL_ARGS)
    _state["ready"] = True


_get_fill = torch._C._get_deterministic_fill_uninitialized_memory
_set_fill = torch._C._set_deterministic_fill_uninitialized_memory


def empty(shape, dtype) -> torch.Tensor:
    """torch.empty without deterministic mode's fill of new memory (every element is written).
    (torch.utils.deterministic.fill_uninitialized_memory's own getter and setter, called
    directly: this runs several times per product.)"""
    # unpacked, as a Size costs torch more to take; () stays one argument (a 0-dim tensor)
    dims = (shape,) if isinstance(shape, int) else (shape if len(shape) else ((),))
    if not _get_fill():
        return torch.empty(*dims, dtype=dtype)
    _set_fill(False)
    try:
        return torch.empty(*dims, dtype=dtype)
    finally:
        _set_fill(True)


def buffer(t: torch.Tensor | None):
    """A tensor as the compiled kernels take it: (address, elements, dtype code: KINDS), for a
    contiguous tensor of KINDS' dtypes, which the caller keeps alive for the call; None stays None
    (an optional buffer left out)."""
    return None if t is None else (t.data_ptr(), t.numel(), KINDS[t.dtype])


def strided(t: torch.Tensor):
    """A strided (or broadcast) tensor as the compiled kernels take it: buffer()'s description
    with the elements it spans in memory, for a kernel given its strides beside it."""
    return (t.data_ptr(), span(t), KINDS[t.dtype])


def span(t: torch.Tensor) -> int:
    """How many elements a strided tensor's memory spans, from its first to its last."""
    return 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride())) if t.numel() else 0


def module():
    """The compiled extension (twice._native), for norms.py; None where not built."""
    return _module


def keep_memory() -> bool:
    """Have glibc's malloc keep freed memory for reuse (p_keep_memory: portable mode's large
    float64 temporaries would otherwise be fresh pages, faulted in, on every call). Once per
    process; returns whether it applied. No result depends on it."""
    if "memory" not in _state:
        _state["memory"] = bool(_module is not None and _module.p_keep_memory())
    return _state["memory"]


def available() -> bool:
    """Whether the compiled kernels are built and in use."""
    return _module is not None and _state["on"]


@contextlib.contextmanager
def fallback():
    """Compute with torch operations only, for a block (the tests compare the two paths)."""
    before = _state["on"]
    _state["on"] = False
    try:
        yield
    finally:
        _state["on"] = before


def usable(*tensors: torch.Tensor) -> bool:
    """Whether the compiled kernels apply to these tensors (built, in use, CPU, float32/64,
    strided, their memory their values)."""
    if _module is None or not _state["on"]:
        return False
    if not _state["ready"]:
        _init()
    threads = torch.get_num_threads()
    if threads != _state["threads"]:  # the kernels follow torch's thread count, in its pool
        _module.p_threads(threads=threads)
        _state["threads"] = threads
    for t in tensors:
        if not t.is_cpu or t.dtype not in KINDS or t.layout is not torch.strided or t.is_neg():
            return False  # (a lazily negated view's memory holds the values before negation)
    return True


def unary(name: str, x: torch.Tensor, dtype=None) -> torch.Tensor | None:
    """elementwise.<name>(x) rounded to `dtype` (x's by default), or None."""
    if not usable(x):
        return None
    src = x.contiguous()
    out = empty(x.shape, dtype or x.dtype)
    _module.p_unary(kernel=_UNARY[name], src=buffer(src), dst=buffer(out))
    return out


def binary(name: str, grad: torch.Tensor | None, x: torch.Tensor, dtype, a=0.0, b=0.0):
    """A backward of GELU/SiLU (or softplus with beta a, threshold b, grad None), or None."""
    if not usable(x) or (grad is not None and not usable(grad)):
        return None
    if grad is not None and grad.shape != x.shape:
        return None
    xs = x.contiguous()
    gs = grad.contiguous() if grad is not None else None
    out = empty(x.shape, dtype)
    _module.p_binary(
        kernel=_BINARY[name], grad=buffer(gs), x=buffer(xs), dst=buffer(out), a=float(a),
        b=float(b),
    )  # fmt: skip
    return out


def _rows(x: torch.Tensor, dims: tuple[int, ...] | None):
    """x with the dimensions `dims` moved last, contiguous, as (rows, cols); and the kept shape."""
    if dims is None:
        return x.contiguous().reshape(1, -1), ()
    dims = tuple(sorted(canonicalize_dim(x.dim(), d) for d in dims))
    kept = [d for d in range(x.dim()) if d not in dims]
    moved = x.permute(*kept, *dims).contiguous()
    cols = math.prod(x.shape[d] for d in dims)
    return moved.reshape(-1, cols), kept


def _split_blocks(x: torch.Tensor, axis: int, beta: int):
    """p_split over x's last two dimensions (x contiguous, at most one batch dimension)."""
    rows, cols = x.shape[-2], x.shape[-1]
    outer = x.numel() // max(1, rows * cols)
    ints = empty(x.shape, torch.float64)
    unit_shape = (*x.shape[:-2], rows, 1) if axis == 0 else (*x.shape[:-2], 1, cols)
    units = empty(unit_shape, torch.float64)
    finite = _module.p_split(
        src=buffer(x), outer=outer, rows=rows, cols=cols, beta=beta, axis=axis,
        ints=buffer(ints), units=buffer(units),
    )  # fmt: skip
    return (ints, units) if finite else None


def split_rows(x: torch.Tensor, dims, beta: int):
    """exact.split(x, dims, 1, beta) as [(ints, unit)]: False where a value is not finite, None
    where the kernel does not apply. A matrix (or a batch of them) reduced along either of its
    last two dimensions is read in place, transposed or not."""
    if not usable(x) or x.numel() == 0 or x.dim() == 0:
        return None
    if (
        dims is not None
        and len(dims) == 1
        and x.dim() in (2, 3)
        and canonicalize_dim(x.dim(), dims[0]) >= x.dim() - 2
    ):
        axis = 0 if canonicalize_dim(x.dim(), dims[0]) == x.dim() - 1 else 1
        flipped = x.transpose(-1, -2)
        if not x.is_contiguous() and flipped.is_contiguous():
            parts = _split_blocks(flipped, 1 - axis, beta)
            if parts is None:
                return False
            return [(parts[0].transpose(-1, -2), parts[1].transpose(-1, -2))]
        parts = _split_blocks(x.contiguous(), axis, beta)
        return False if parts is None else [parts]
    rows, kept = _rows(x, dims)
    parts = _split_blocks(rows, 0, beta)
    if parts is None:
        return False
    ints, units = parts
    if dims is None:
        return [(ints.reshape(x.shape), units.reshape(()))]
    dims = tuple(sorted(canonicalize_dim(x.dim(), d) for d in dims))
    order = kept + list(dims)
    back = [order.index(d) for d in range(x.dim())]
    unit_shape = [1 if d in dims else x.shape[d] for d in range(x.dim())]
    return [(ints.reshape([x.shape[d] for d in order]).permute(*back), units.reshape(unit_shape))]


def split_given(x: torch.Tensor, units: torch.Tensor) -> torch.Tensor | None:
    """The integers of a split of the rows of matrix `x` on units fixed elsewhere (float64, one
    per row, each a power of two the row's values are below 2**beta of): round(x / unit), as
    split_rows computes them. The values must be finite. None where the kernel does not apply."""
    if not usable(x, units) or x.dim() != 2 or not x.numel() or units.numel() != x.shape[0]:
        return None
    src, units = x.contiguous(), units.to(torch.float64).contiguous()
    ints = empty(x.shape, torch.float64)
    _module.p_split(
        src=buffer(src), outer=1, rows=x.shape[0], cols=x.shape[1], beta=0, axis=0,
        ints=buffer(ints), units=buffer(units), given=1,
    )  # fmt: skip
    return ints


def scaled(product, unit_a, unit_b, out_dtype, bias=None):
    """product * (unit_a * unit_b) (+ bias), rounded once to out_dtype, for a product of shape
    (M, N) or (B, M, N) with units (.., M, 1) and (.., 1, N); or None."""
    if not usable(product) or out_dtype not in KINDS or product.dim() not in (2, 3):
        return None
    if bias is not None and (not usable(bias) or bias.dim() > product.dim()):
        return None
    rows, cols = product.shape[-2:]
    blocks = product.numel() // max(1, rows * cols)
    ua = unit_a.expand(*product.shape[:-1], 1).contiguous()
    ub = unit_b.expand(*product.shape[:-2], 1, cols).contiguous()
    out = empty(product.shape, out_dtype)
    (block_stride, row_stride, col_stride), bias_buffer = (0, 0, 0), None
    if bias is not None:
        full = bias.expand(product.shape)
        block_stride, row_stride, col_stride = (
            tuple(full.stride()) if product.dim() == 3 else (0, *full.stride())
        )
        bias_buffer = strided(full)
    _module.p_scale(
        product=buffer(product.contiguous()), blocks=blocks, rows=rows, cols=cols,
        unit_a=buffer(ua), unit_b=buffer(ub), out=buffer(out), bias=bias_buffer,
        bias_block_stride=block_stride, bias_row_stride=row_stride, bias_col_stride=col_stride,
    )  # fmt: skip
    return out


_COMPOUND = {"addcmul": 0, "addcdiv": 1, "add": 2, "lerp": 3}


def compound(name: str, self, a, b, value: float, inplace: bool = False):
    """ops_math's addcmul/addcdiv/add-with-alpha/lerp in one pass, where every tensor has one
    dtype, one shape and a contiguous layout; or None. `inplace` writes the result into `self`
    (each element is read before it is written; an operand that overlaps `self` other than
    exactly sends the call to the caller's path)."""
    tensors = [t for t in (self, a, b) if t is not None]
    if not usable(*tensors) or any(
        t.dtype != self.dtype or t.shape != self.shape or not t.is_contiguous() for t in tensors
    ):
        return None
    if inplace:
        start, size = self.data_ptr(), self.numel() * self.element_size()
        for t in tensors[1:]:
            p = t.data_ptr()
            if p != start and p < start + size and start < p + size:
                return None
        out = self
    else:
        out = empty(self.shape, self.dtype)
    other = b if b is not None else a
    _module.p_compound(
        op=_COMPOUND[name], self=buffer(self), a=buffer(a), b=buffer(other), value=float(value),
        out=buffer(out),
    )  # fmt: skip
    return out


def row_sums(x: torch.Tensor, dims, beta: int, count: int, keepdim: bool):
    """exact_sum's float64 result: False where a value is not finite, None where the kernel
    does not apply."""
    if not usable(x) or x.numel() == 0 or x.dim() == 0:
        return None
    lead = dims is not None and sorted(canonicalize_dim(x.dim(), d) for d in dims) == list(
        range(len(dims))
    )
    if count == 1 and lead and len(dims) < x.dim() and x.is_contiguous():
        # the leading dimensions: column sums of a (rows, cols) matrix, read in place
        cols = math.prod(x.shape[len(dims) :])
        out = empty(cols, torch.float64)
        finite = _module.p_colsum(
            src=buffer(x), rows=x.numel() // max(1, cols), cols=cols, beta=beta, out=buffer(out)
        )
        if not finite:
            return False
        shape = [1] * len(dims) + list(x.shape[len(dims) :]) if keepdim else x.shape[len(dims) :]
        return out.reshape(shape)
    rows, kept = _rows(x, dims)
    out = empty(rows.shape[0], torch.float64)
    finite = _module.p_rowsum(
        src=buffer(rows), rows=rows.shape[0], cols=rows.shape[1], beta=beta, count=count,
        out=buffer(out),
    )  # fmt: skip
    if not finite:
        return False
    reduced = set(range(x.dim())) if dims is None else {canonicalize_dim(x.dim(), d) for d in dims}
    if keepdim:
        return out.reshape([1 if d in reduced else x.shape[d] for d in range(x.dim())])
    return out.reshape([x.shape[d] for d in kept])


def uniform(count: int, key: int, device) -> torch.Tensor | None:
    """philox.uniform(count, key), or None."""
    if (
        _module is None
        or not _state["on"]
        or (device is not None and torch.device(device).type != "cpu")
    ):
        return None
    out = empty(count, torch.float64)
    _module.p_uniform(key=key, out=buffer(out))
    return out


def normal(count: int, key: int, device) -> torch.Tensor | None:
    """philox.normal(count, key), or None."""
    if not usable(torch.empty(0)) or (device is not None and torch.device(device).type != "cpu"):
        return None
    out = empty(count, torch.float64)
    scratch = empty(2 * max(1, -(-count // 2)), torch.float64)
    _module.p_normal(key=key, out=buffer(out), scratch=buffer(scratch))
    return out
