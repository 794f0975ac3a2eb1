"""The compiled kernels of batch norm and layer norm (csrc/norms.c: p_chansum, p_chanmap,
p_bnsums, p_lnfwd, p_lnbwd), where they apply.

As in __init__.py, each function returns None where the kernel does not apply, and norms.py then
computes the same bits with torch operations.
"""

from __future__ import annotations

import torch

from twice.portable import native
from twice.portable.native import buffer

__all__ = ["chansum", "chanmap", "bnsums", "layer_norm", "layer_norm_backward"]


def _nchw(x: torch.Tensor):
    n, c = x.shape[0], x.shape[1]
    return n, c, x.numel() // max(1, n * c)


def chansum(expr: int, x, y, m, s, w, beta: int, count: int):
    """Batch norm's exact per-channel sums (see csrc/norms.c p_chansum) as a float64 (C,) tensor;
    False where a value is not finite; None where the kernel does not apply. m, s, w are float64
    (C,) tensors or None."""
    tensors = [t for t in (x, y) if t is not None]
    if not native.usable(*tensors) or not all(t.is_contiguous() for t in tensors) or x.dim() < 2:
        return None
    n, c, size = _nchw(x)
    out = native.empty(c, torch.float64)
    finite = native.module().p_chansum(
        expr=expr, n=n, c=c, s=size, beta=beta, count=count, x=buffer(x), y=buffer(y),
        mean=buffer(m), scale=buffer(s), weight=buffer(w), out=buffer(out),
    )  # fmt: skip
    return out if finite else False


def chanmap(expr: int, x, y, m, s, w, b, p1, p2, dtype):
    """Batch norm's per-element formulas (see csrc/norms.c p_chanmap), or None."""
    tensors = [t for t in (x, y) if t is not None]
    if not native.usable(*tensors) or not all(t.is_contiguous() for t in tensors) or x.dim() < 2:
        return None
    n, c, size = _nchw(x)
    out = native.empty(x.shape, dtype)
    native.module().p_chanmap(
        expr=expr, n=n, c=c, s=size, x=buffer(x), y=buffer(y), mean=buffer(m), scale=buffer(s),
        weight=buffer(w), bias=buffer(b), p1=buffer(p1), p2=buffer(p2), out=buffer(out),
    )  # fmt: skip
    return out


def bnsums(x, y, m, s, w, beta: int):
    """Batch norm's backward sums (chansum's expressions 0, 2, 3, 4 with y the gradient) as a
    float64 (C, 4) tensor in two passes, for one slice each; False where a value is not finite;
    None where the kernel does not apply."""
    if not native.usable(x, y) or not (x.is_contiguous() and y.is_contiguous()) or x.dim() < 2:
        return None
    n, c, size = _nchw(x)
    out = native.empty((c, 4), torch.float64)
    finite = native.module().p_bnsums(
        n=n, c=c, s=size, beta=beta, x=buffer(x), y=buffer(y), mean=buffer(m), scale=buffer(s),
        weight=buffer(w), out=buffer(out),
    )  # fmt: skip
    return out if finite else False


def layer_norm(x, cols: int, w, b, eps: float, beta: int):
    """Layer norm over rows of `cols` at float32 precision: (out, mean, rstd) with the statistics
    float64 per row; False where a value is not finite; None where the kernel does not apply."""
    if not native.usable(x) or x.dtype != torch.float32 or not x.is_contiguous() or x.numel() == 0:
        return None
    rows = x.numel() // cols
    out = native.empty(x.shape, x.dtype)
    mean, rstd = native.empty(rows, torch.float64), native.empty(rows, torch.float64)
    finite = native.module().p_lnfwd(
        rows=rows, cols=cols, beta=beta, x=buffer(x), weight=buffer(w), bias=buffer(b),
        eps=float(eps), out=buffer(out), mean=buffer(mean), rstd=buffer(rstd),
    )  # fmt: skip
    return (out, mean, rstd) if finite else False


def layer_norm_backward(grad, x, cols: int, mean, rstd, w, beta_row, beta_col, want):
    """Layer norm's backward at float32 precision: (grad input or None, the columns' exact sums
    of grad * x-hat and of grad, float64, or None); False where a value is not finite; None where
    the kernel does not apply."""
    usable = native.usable(x, grad) and x.dtype == grad.dtype == torch.float32
    if not usable or not (x.is_contiguous() and grad.is_contiguous()) or x.numel() == 0:
        return None
    rows = x.numel() // cols
    gi = native.empty(x.shape, x.dtype) if want[0] else None
    gw = native.empty(cols, torch.float64) if want[1] else None
    gb = native.empty(cols, torch.float64) if want[2] else None
    finite = native.module().p_lnbwd(
        rows=rows, cols=cols, beta_row=beta_row, beta_col=beta_col, x=buffer(x),
        grad=buffer(grad), mean=buffer(mean), rstd=buffer(rstd), weight=buffer(w),
        grad_input=buffer(gi), grad_weight=buffer(gw), grad_bias=buffer(gb),
    )  # fmt: skip
    return (gi, gw, gb) if finite else False
