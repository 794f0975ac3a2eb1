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
  single-tensor form on a CPU, and for some (ASGD, NAdam with coupled weight decay) the two
  round differently. Under the mode the choice is the single-tensor form on every device; a
  program that names `foreach=True` or `fused=True` gets that form everywhere.

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


def _linear(input, output_size, align_corners, scale_factors):
    ops = {3: torch._C._nn.upsample_linear1d, 4: torch._C._nn.upsample_bilinear2d}
    op = ops.get(input.dim(), torch._C._nn.upsample_trilinear3d)
    return op(input, output_size, align_corners, scale_factors)


def _max_pool3d(input, kernel_size, stride, padding, dilation, ceil_mode):
    return torch._C._nn.max_pool3d_with_indices(
        input, kernel_size, stride, padding, dilation, ceil_mode
    )


def _replicate(input, pad):
    return torch._C._nn.pad(input, pad, "replicate", None)


def _single_tensor(params, differentiable, use_fused=False):
    return False, False


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
}
"""(module, function) -> what a thread under portable mode runs instead."""

_state: dict = {"count": 0, "saved": None, "mode": ()}


def _portable_thread() -> bool:
    modes = _get_current_dispatch_mode_stack()
    return any(isinstance(mode, _state["mode"]) for mode in modes)


def _detour(original: Callable, operation: Callable) -> Callable:
    def detour(*args, **kwargs):
        if _portable_thread():
            return operation(*args, **kwargs)
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
