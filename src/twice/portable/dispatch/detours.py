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
  single-tensor form on a CPU, and for some (ASGD) the two round differently; so does
  `AveragedModel`'s averaging. Under the mode the choice is the single-tensor form on every
  device; a program that names `foreach=True` or `fused=True` gets that form everywhere.
- Dropout: torch's C++ `aten::dropout` runs `native_dropout` on a GPU and `bernoulli_`,
  `div_`, `mul` on a CPU, whose scale rounds otherwise. `OVERRIDES` registers the mode's own
  kernel for it while the mode is active, so every caller (F.dropout, attention's math route,
  the transformer layers, a stacked RNN) runs `native_dropout` on every device under the mode,
  and torch's own operations in threads outside it.
- `rms_norm` is operations autograd differentiates one by one on a CPU, and `_fused_rms_norm`
  with its own backward on a GPU; `torch.rms_norm` (so F.rms_norm and nn.RMSNorm) runs the
  former on every device under the mode.
- `torch.einsum` asks opt_einsum for a contraction order when that package is installed and
  `torch.backends.opt_einsum.enabled` is on, so whether it is installed would choose the
  products; under the mode it is "not available", even if a program turns it on again.

- Adam's (and AdamW's) single-tensor step, eight or so operations per parameter, each a trip
  through the mode, runs as one compiled pass per parameter with the same bits
  (ops/optim.py's `single_tensor_adam`): not a route of its own, a speed-up, taken only where
  no other dispatch mode is in force (one would see the operations).

Each detour applies to the calls made in a thread under a portable mode; other threads get
torch's function. `DETOURS` lists them; tests of the inventory read torch.nn.functional and
torch.optim and fail on a branch of this kind that is not here.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

from twice.portable.ops.optim import single_tensor_adam

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


def _dropout_as_torch(input, p, train):
    """torch's own `aten::dropout` (ATen's Dropout.cpp), operation for operation: what a thread
    outside portable mode runs while the mode's kernel for it is registered."""
    fused_devices = ("cuda", "xpu", "lazy", torch._C._get_privateuse1_backend_name())
    if train and 0 < p < 1 and input.numel() > 0 and input.device.type in fused_devices:
        return torch.native_dropout(input, p, train)[0]
    if not 0 <= p <= 1:
        raise RuntimeError(f"dropout probability has to be between 0 and 1, but got {p}")
    if p == 0 or not train or input.numel() == 0:
        return input
    if p == 1:
        return input.mul(torch.zeros((), dtype=input.dtype, device=input.device))
    noise = torch.empty_like(input)
    noise.bernoulli_(1 - p)
    noise.div_(1 - p)
    return input.mul(noise)


def _dropout(input, p, train):
    """`aten::dropout` for every caller, C++ ones included (attention's math route, the
    transformer layers, a stacked RNN's dropout): under the mode `native_dropout`, a GPU's
    route, on every device; elsewhere torch's own."""
    fused = train and 0 < p < 1 and input.numel() > 0 and input.is_floating_point()
    if fused and _portable_thread():
        return torch.native_dropout(input, p, train)[0]
    return _dropout_as_torch(input, p, train)


OVERRIDES: dict[str, Callable] = {"dropout": _dropout}
"""aten's composite operations whose kernel the mode replaces while it is active (torch's C++
picks the route inside them by device, below any Python-level detour)."""


def _rms_norm(original, input, normalized_shape, weight=None, eps=None):
    """torch's rms_norm is operations autograd differentiates one by one on a CPU, and
    `_fused_rms_norm` with its own backward on a GPU: every device runs the former, as the
    operations of torch's decomposition (so derivatives of any order follow them)."""
    shape = [normalized_shape] if isinstance(normalized_shape, int) else list(normalized_shape)
    if len(shape) > input.dim() or list(input.shape[input.dim() - len(shape) :]) != shape:
        return original(input, normalized_shape, weight, eps)  # torch's error
    decompositions = importlib.import_module(_DECOMPOSITIONS)
    return decompositions._fused_rms_norm(input, shape, weight, eps)[0]


def _batch_norm_as_on_a_cpu(original, input, weight, bias, running_mean, running_var,
                            training, momentum, eps, functional=False):  # fmt: skip
    """torch's batch-norm decomposition helper (for `_batch_norm_with_update`,
    `_native_batch_norm_legit`'s no-stats and functional forms, `native_batch_norm.out`)
    returns the saved statistics cast to the input's dtype on a CPU and in float32 elsewhere
    (and, in evaluation, empty on a CPU, the running ones elsewhere): a half-precision
    gradient would follow the device. Every device gets the CPU's."""
    out = original(input, weight, bias, running_mean, running_var, training, momentum, eps,
                   functional)  # fmt: skip
    if input.device.type == "cpu":
        return out
    output, save_mean, save_rstd, *running = out
    if not training:
        save_mean, save_rstd = input.new_zeros((0,)), input.new_zeros((0,))
    return (output, save_mean.to(input.dtype), save_rstd.to(input.dtype), *running)


def _no_opt_einsum(original):
    return False


def _adam(original, *args, **kwargs):
    """Adam's step in one compiled pass where portable modes are the only dispatch modes in
    force: another mode (twice's op recorder and numerics watch, a program's own) sees torch's
    operations, each one, and the tensors' versions, as without the pass."""
    modes = _get_current_dispatch_mode_stack()
    if all(isinstance(mode, _state["mode"]) for mode in modes):
        return single_tensor_adam(original, *args, **kwargs)
    return original(*args, **kwargs)


_OPTIMIZERS = ("adadelta", "adagrad", "adam", "adamax", "asgd", "nadam", "radam", "rmsprop")
_OPTIMIZERS += ("rprop", "sgd")

DETOURS: dict[tuple[str, str], Callable] = {
    (_DECOMPOSITIONS, "_upsample_linear_vec"): _linear,  # F.interpolate, bilinear, trilinear
    (_DECOMPOSITIONS, "max_pool3d_with_indices"): _max_pool3d,  # F.max_pool3d's indices
    (_DECOMPOSITIONS, "_replication_pad"): _replicate,  # F.pad, mode replicate
    (_DECOMPOSITIONS, "native_batch_norm_helper"): _batch_norm_as_on_a_cpu,
    **{
        (f"torch.optim.{name}", "_default_to_fused_or_foreach"): _single_tensor
        for name in _OPTIMIZERS
    },
    ("torch.optim.swa_utils", "_get_foreach_kernels_supported_devices"): _no_foreach_devices,
    ("torch", "rms_norm"): _rms_norm,  # F.rms_norm, nn.RMSNorm
    ("torch.backends.opt_einsum", "is_available"): _no_opt_einsum,  # even if enabled again
    # not a route but a speed-up: each parameter's step in one compiled pass, the same bits
    ("torch.optim.adam", "_single_tensor_adam"): _adam,
}
"""(module, function) -> what a thread under portable mode runs instead (given torch's
function first)."""

_state: dict = {"saved": None, "mode": ()}


def _portable_thread() -> bool:
    modes = _get_current_dispatch_mode_stack()
    return any(isinstance(mode, _state["mode"]) and mode.live for mode in modes)


def _detour(original: Callable, operation: Callable) -> Callable:
    def detour(*args, **kwargs):
        if _portable_thread():
            return operation(original, *args, **kwargs)
        return original(*args, **kwargs)

    detour.__wrapped__ = original
    return detour


def install(mode_type: type) -> None:
    """Replace the functions for threads under a mode of `mode_type` (switches.py calls it for
    the first mode in the process, under its lock, and `uninstall` for the last)."""
    _state["mode"] = mode_type
    saved = {}
    for (module_name, name), operation in DETOURS.items():
        module = importlib.import_module(module_name)
        original = getattr(module, name, None)
        if original is not None:  # (an older torch without it)
            saved[module_name, name] = original
            detour = _detour(original, operation)
            if module is torch:  # TorchScript compiles a call of it as the aten operation
                torch.jit._builtins._register_builtin(detour, f"aten::{name}")
            setattr(module, name, detour)
    _state["saved"] = saved
    library = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():  # torch warns once that a kernel is overridden
        warnings.simplefilter("ignore")
        for name, kernel in OVERRIDES.items():
            library.impl(name, kernel, "CompositeImplicitAutograd")
    _state["library"] = library


def uninstall() -> None:
    """Put torch's functions back."""
    if _state["saved"] is None:
        return
    for (module_name, name), original in _state["saved"].items():
        setattr(importlib.import_module(module_name), name, original)
    _state["saved"] = None
    _state.pop("library")._destroy()  # torch's own kernels again
