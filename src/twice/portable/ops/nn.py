"""The network operations of portable mode, forward and backward: softmax, losses and embedding
gradients (the normalisations are in norms.py, the convolutions in conv.py).

Each is written with the exact reductions of exact.py and the elementwise functions of
elementwise.py, in float64, and rounded once to the input's dtype, so its bits depend only on its
inputs. The formulas are the textbook ones (those torch's own kernels implement); where torch
saves statistics for the backward (mean, inverse standard deviation), these return them in the
dtypes and shapes torch's kernels do, so autograd and other kernels can read them.
"""

from __future__ import annotations

import math

import torch

from twice.portable.arithmetic import elementwise as ew
from twice.portable.arithmetic.exact import exact_bilinear, exact_sum

__all__ = [
    "softmax",
    "softmax_backward",
    "log_softmax",
    "log_softmax_backward",
    "nll_loss",
    "nll_loss_backward",
    "embedding_backward",
    "Unsupported",
]

_F64 = torch.float64


class Unsupported(Exception):
    """A call portable mode has no implementation for (its arguments, not the operation)."""


def _sum(x, dims, like, keepdim=True):
    """The exact sum in float64, at the precision a result of dtype `like` needs."""
    return exact_sum(x, dims, keepdim, _F64, like)


def _shifted(x: torch.Tensor, dim: int) -> torch.Tensor:
    x64 = x.to(_F64)
    top = x64.amax(dim=dim, keepdim=True)
    return x64 - torch.where(torch.isfinite(top), top, 0.0)


def softmax(x: torch.Tensor, dim: int, safe: bool = False) -> torch.Tensor:
    """exp(x - max) / sum(exp(x - max)) along `dim` (`safe`: rows all -inf give 0, not NaN)."""
    e = ew.exp(_shifted(x, dim))
    out = e / _sum(e, (dim,), x.dtype)
    if safe:
        out = torch.where((x == -math.inf).all(dim=dim, keepdim=True), 0.0, out)
    return out.to(x.dtype)


def softmax_backward(grad: torch.Tensor, out: torch.Tensor, dim: int) -> torch.Tensor:
    """y * (g - sum(g * y))."""
    g, y = grad.to(_F64), out.to(_F64)
    return (y * (g - _sum(g * y, (dim,), grad.dtype))).to(grad.dtype)


def log_softmax(x: torch.Tensor, dim: int) -> torch.Tensor:
    """(x - max) - log(sum(exp(x - max)))."""
    shifted = _shifted(x, dim)
    return (shifted - ew.log(_sum(ew.exp(shifted), (dim,), x.dtype))).to(x.dtype)


def log_softmax_backward(grad: torch.Tensor, out: torch.Tensor, dim: int) -> torch.Tensor:
    """g - exp(y) * sum(g)."""
    g = grad.to(_F64)
    return (g - ew.exp(out.to(_F64)) * _sum(g, (dim,), grad.dtype)).to(grad.dtype)


def _nll_weights(x, target, weight, ignore_index):
    safe = torch.where(target == ignore_index, 0, target)
    w = torch.ones(target.shape, dtype=_F64, device=x.device)
    if weight is not None:
        w = weight.to(_F64)[safe]
    return safe, torch.where(target == ignore_index, 0.0, w)


def nll_loss(x, target, weight, reduction: int, ignore_index: int):
    """aten.nll_loss_forward: (loss, total weight); reduction 0 none, 1 mean, 2 sum."""
    safe, w = _nll_weights(x, target, weight, ignore_index)
    rows = x.to(_F64) if x.dim() > 1 else x.to(_F64).unsqueeze(0)
    picked = -rows.gather(1, safe.reshape(-1, 1)).reshape(target.shape) * w
    total = exact_sum(w, None, False, _F64, x.dtype)
    if reduction == 0:
        return picked.to(x.dtype), torch.zeros((), dtype=x.dtype, device=x.device)
    loss = exact_sum(picked, None, False, _F64, x.dtype)
    if reduction == 1:
        loss = loss / total
    return loss.to(x.dtype), total.to(x.dtype)


def nll_loss_backward(grad, x, target, weight, reduction: int, ignore_index: int, total):
    """aten.nll_loss_backward: -w * g (divided by the total weight for the mean) at each target."""
    safe, w = _nll_weights(x, target, weight, ignore_index)
    g = grad.to(_F64)
    value = -(w * g) if reduction == 0 else -(w * g)
    if reduction == 1:
        value = value / total.to(_F64)
    rows = torch.zeros(x.shape if x.dim() > 1 else (1, x.shape[0]), dtype=_F64, device=x.device)
    rows.scatter_(1, safe.reshape(-1, 1), value.reshape(-1, 1))
    return rows.reshape(x.shape).to(x.dtype)


def embedding_backward(grad, indices, num_weights: int, padding_idx: int, by_freq: bool):
    """aten.embedding_dense_backward: each row's gradients added up exactly (index_add of
    integer slices), divided by the index's count when scaled by frequency."""
    rows = grad.reshape(-1, grad.shape[-1])
    idx = indices.reshape(-1)
    keep = idx != padding_idx
    rows, idx = rows[keep], idx[keep]

    def form(a, b):  # a: one-hot rows chosen by idx (never built), b: the gradient rows
        out = torch.zeros(num_weights, b.shape[-1], dtype=_F64, device=b.device)
        return out.index_add_(0, idx, b * a)

    def scale(ua, ub):
        return ua * ub.reshape(1, -1)

    ones = torch.ones(rows.shape[0], 1, dtype=_F64, device=grad.device)
    counts = torch.bincount(idx, minlength=num_weights).to(_F64).reshape(-1, 1)
    out = exact_bilinear(
        ones, rows, form, None, (0,), max(1, rows.shape[0]), _F64, scale, grad.dtype
    )
    if by_freq:
        out = out / torch.clamp(counts, min=1.0)
    return out.to(grad.dtype)
