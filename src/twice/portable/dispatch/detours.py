"""torch's Python functions that take another route on some devices, pinned while portable mode
is active.

- On a GPU with deterministic algorithms on (twice turns them on), torch.nn.functional runs a
  Python decomposition instead of the operation for bilinear and trilinear interpolation, 3-d
  max pooling and replicate padding. The decomposition rounds otherwise than the operation
  portable mode computes on a CPU (interpolation's chained lerps; the padding's gradient summed
  by index_put), so the device would choose the bits. Under the mode each of them runs the
  operation itself, which the mode computes with one kernel on every device (deterministically,
  the reason torch took the decomposition).
- An optimizer left to choose (`foreach=None`) runs its multi-tensor form on a GPU and its
  single-tensor form on a CPU, and for some (ASGD) the two round differently; so do
  `AveragedModel`'s averaging and `clip_grad_norm_`. Under the mode the choice is the
  single-tensor form on every device; a program that names `foreach=True` or `fused=True`
  gets that form everywhere.
- torch's C++ takes another route on a GPU for dropout (`native_dropout`, whose scaling rounds
  otherwise than the CPU's `bernoulli_`, `div_`, `mul`) and for `rms_norm` (`_fused_rms_norm`
  and its backward, decomposed by the mode; a CPU differentiates the operations it is made of).
  Under the mode every device takes the GPU's route: `native_dropout`, and `_fused_rms_norm`'s
  decompositions forward and backward.
- `torch.einsum` asks opt_einsum for a contraction order when that package is installed and
  `torch.backends.opt_einsum.enabled` is on, so whether it is installed would choose the
  products; under the mode it is "not available", even if a program turns it on again.

Each detour applies to the calls made in a thread under a portable mode; other threads get
torch's function. `DETOURS` lists them; tests of the inventory read torch.nn.functional and
torch.optim and fail on a branch of this kind that is not here.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

__all__ = ["DETOURS", "install", "uninstall"]

_DECOMPOSITIONS = "torch._decomp.decompositions"


def _linear(original, input, output_size, align_corners, scale_factors):
    ops = {3: torch._C._nn.upsample_linear1d, 4: torch._C._nn.upsample_bilinear2d}
    op = ops.get(input.dim(), torch._C._nn.upsample_trilinear3d)
    return op(input, output_size, align_corners, scale_factors)


def _max_pool3d(original, input, kernel_size, stride, padding, dilation, ceil_mode):
    return torch._C._nn.max_pool3d_with_indices(
        input, kernel_size, stride, padding, dilation, ceil_mode
    )


def _replicate(original, input, pad):
    return torch._C._nn.pad(input, pad, "replicate", None)


def _single_tensor(original, params, differentiable, use_fused=False):
    return False, False


def _no_foreach_devices(original):
    return []


def _dropout(original, input, p, train):
    """torch's CPU dropout is `bernoulli_`, `div_`, `mul`; on a GPU (0 < p < 1, not empty) it
    is `native_dropout`, whose scaling rounds otherwise: every device takes the latter."""
    if train and 0 < p < 1 and input.numel() > 0:
        return torch.native_dropout(input, p, train)[0]
    return original(input, p, train)


class _FusedRMSNorm(torch.autograd.Function):
    """`_fused_rms_norm` as a GPU computes it under the mode, on any device: its decomposition
    forward and its backward's (on a CPU the operation has no kernel of its own, so torch would
    inline operations autograd differentiates one by one, with other bits)."""

    @staticmethod
    def forward(ctx, input, normalized_shape, weight, eps):
        decompositions = importlib.import_module(_DECOMPOSITIONS)
        out, rstd = decompositions._fused_rms_norm(input, normalized_shape, weight, eps)
        ctx.save_for_backward(input, rstd, weight)
        ctx.normalized_shape = normalized_shape
        return out

    @staticmethod
    def backward(ctx, grad):
        input, rstd, weight = ctx.saved_tensors
        mask = [ctx.needs_input_grad[0], weight is not None and ctx.needs_input_grad[2]]
        decompositions = importlib.import_module(_DECOMPOSITIONS)
        grad_input, grad_weight = decompositions._fused_rms_norm_backward(
            grad, input, ctx.normalized_shape, rstd, weight, mask
        )
        return grad_input, None, grad_weight, None


def _rms_norm(original, input, normalized_shape, weight=None, eps=None):
    """torch's rms_norm is operations autograd differentiates one by one on a CPU, and
    `_fused_rms_norm` with its own backward on a GPU: every device takes the latter."""
    decompositions = importlib.import_module(_DECOMPOSITIONS)
    transformed = torch._C._functorch.peek_interpreter_stack() is not None
    forward_ad = torch.autograd.forward_ad._current_level >= 0
    if transformed or forward_ad or not hasattr(decompositions, "_fused_rms_norm_backward"):
        return original(input, normalized_shape, weight, eps)  # (no rules for these)
    return _FusedRMSNorm.apply(input, list(normalized_shape), weight, eps)


def _no_opt_einsum(original):
    return False


def _no_foreach(original, *args, **kwargs):
    return False


_OPTIMIZERS = ("adadelta", "adagrad", "adam", "adamax", "asgd", "nadam", "radam", "rmsprop")
_OPTIMIZERS += ("rprop", "sgd")

DETOURS: dict[tuple[str, str], Callable] = {
    (_DECOMPOSITIONS, "_upsample_linear_vec"): _linear,  # F.interpolate, bilinear, trilinear
    (_DECOMPOSITIONS, "max_pool3d_with_indices"): _max_pool3d,  # F.max_pool3d's indices
    (_DECOMPOSITIONS, "_replication_pad"): _replicate,  # F.pad, mode replicate
    **{
        (f"torch.optim.{name}", "_default_to_fused_or_foreach"): _single_tensor
        for name in _OPTIMIZERS
    },
    ("torch.optim.swa_utils", "_get_foreach_kernels_supported_devices"): _no_foreach_devices,
    ("torch.nn.utils.clip_grad", "_has_foreach_support"): _no_foreach,  # foreach=None
    ("torch._VF", "dropout"): _dropout,  # F.dropout, nn.Dropout
    ("torch", "rms_norm"): _rms_norm,  # F.rms_norm, nn.RMSNorm
    ("torch.backends.opt_einsum", "is_available"): _no_opt_einsum,  # even if enabled again
}
"""(module, function) -> what a thread under portable mode runs instead (given torch's
function first)."""

_state: dict = {"count": 0, "saved": None, "mode": ()}


def _portable_thread() -> bool:
    modes = _get_current_dispatch_mode_stack()
    return any(isinstance(mode, _state["mode"]) for mode in modes)


def _detour(original: Callable, operation: Callable) -> Callable:
    def detour(*args, **kwargs):
        if _portable_thread():
            return operation(original, *args, **kwargs)
        return original(*args, **kwargs)

    detour.__wrapped__ = original
    return detour


def install(mode_type: type) -> None:
    """One more portable mode (an instance of `mode_type`) in the process (the caller holds
    switches' lock): the first replaces the functions."""
    _state["mode"] = mode_type
    _state["count"] += 1
    if _state["count"] > 1:
        return
    saved = {}
    for (module_name, name), operation in DETOURS.items():
        module = importlib.import_module(module_name)
        original = getattr(module, name, None)
        if original is not None:  # (an older torch without it)
            saved[module_name, name] = original
            setattr(module, name, _detour(original, operation))
    _state["saved"] = saved


def uninstall() -> None:
    """One mode fewer: the last puts torch's functions back."""
    if _state["count"] == 0:
        return
    _state["count"] -= 1
    if _state["count"] or _state["saved"] is None:
        return
    for (module_name, name), original in _state["saved"].items():
        setattr(importlib.import_module(module_name), name, original)
    _state["saved"] = None
