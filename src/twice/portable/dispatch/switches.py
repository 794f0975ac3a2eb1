"""The torch settings portable mode pins while it is active: process-wide ones counted across
threads, and the calling thread's flushing of denormals.

A setting belongs here when it makes torch run other operations for the same program (another
route, another order, another kernel whose bits the mode cannot see into); `SETTINGS` lists each
with the value the mode holds it at and why. Every route torch may then take for a call is
one the mode covers, and the same on every device:

- oneDNN's fused recurrent kernel (mkldnn_rnn_layer) is one opaque operation; without it torch
  runs LSTM, GRU and RNN layers as the matrix products and functions each is made of.
- cuDNN: on a GPU, batch norm, the recurrent layers, CTC loss, grid sampling and affine grids
  take cuDNN's kernels when it is on; off, torch's native operations, which the mode covers and
  which are the ones a CPU runs. (The mode computes convolutions and products itself.)
- The fused inference path of nn.MultiheadAttention and the transformer layers gives way to
  their modules' operations.
- An einsum of three operands or more contracts left to right: opt_einsum's order would follow
  whether that package is installed.
- Scaled dot-product attention takes its math route (plain operations) on every device: the
  fused kernels (FlashAttention, memory-efficient, cuDNN, FlashAttention 3, a backend's own)
  are off, the math route on, and half precision computed in float32 there (ops/attention.py).

These are one setting for the whole process, while a mode is per thread: the first mode entered
(in any thread) saves and pins them, the last one left restores them, under one lock. Denormals
are the calling thread's own setting (`torch.set_flush_denormal`, the x86 MXCSR or ARM FPCR):
torch's worker threads keep them, so flushing them in one thread would make a result depend on
which thread computed it. Each thread's outermost mode computes with them (IEEE) and puts the
thread's setting back on leaving. The same count installs detours.py's routes: torch's Python
functions that would take another route on a GPU.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from twice.portable.dispatch import detours

__all__ = ["SETTINGS", "Setting", "enter", "leave", "stop_flushing", "resume_flushing"]
__all__ += ["compile_eagerly"]


class Setting(NamedTuple):
    """A process-wide torch setting: how to read and write it, and its value under the mode."""

    name: str
    get: Callable[[], Any]
    set: Callable[[Any], None]
    value: Any  # what the mode holds it at


def _einsum(enabled: bool) -> None:
    torch.backends.opt_einsum.enabled = enabled


def _found(*names: str) -> bool:
    return all(hasattr(torch._C, name) for name in names)


def _c(getter: str, setter: str, value: bool, name: str) -> list[Setting]:
    """A setting held in torch._C, where this torch has it (older releases lack some)."""
    if not _found(getter, setter):
        return []
    return [Setting(name, getattr(torch._C, getter), getattr(torch._C, setter), value)]


SETTINGS: list[Setting] = [
    *_c("_get_mkldnn_enabled", "_set_mkldnn_enabled", False, "torch.backends.mkldnn.enabled"),
    *_c("_get_cudnn_enabled", "_set_cudnn_enabled", False, "torch.backends.cudnn.enabled"),
    Setting(
        "torch.backends.mha fast path",
        torch.backends.mha.get_fastpath_enabled,
        torch.backends.mha.set_fastpath_enabled,
        False,
    ),
    Setting(
        "torch.backends.opt_einsum.enabled",
        lambda: torch.backends.opt_einsum.enabled,
        _einsum,
        False,
    ),  # fmt: skip
    *_c("_get_flash_sdp_enabled", "_set_sdp_use_flash", False, "flash attention"),
    *_c("_get_mem_efficient_sdp_enabled", "_set_sdp_use_mem_efficient", False, "efficient sdp"),
    *_c("_get_cudnn_sdp_enabled", "_set_sdp_use_cudnn", False, "cuDNN attention"),
    *_c("_get_fa3_sdp_enabled", "_set_sdp_use_fa3", False, "flash attention 3"),
    *_c("_get_overrideable_sdp_enabled", "_set_sdp_use_overrideable", False, "backend sdp"),
    *_c("_get_math_sdp_enabled", "_set_sdp_use_math", True, "math sdp"),
    *_c(
        "_get_math_sdp_allow_fp16_bf16_reduction",
        "_set_math_sdp_allow_fp16_bf16_reduction",
        False,
        "math sdp half-precision reduction",
    ),
]
"""Every process-wide torch setting the mode pins, with its value under the mode."""

_lock = threading.Lock()
_state: dict = {"count": 0, "saved": None}
_probe = {"tiny": 5e-324, "one": 1.0}


def enter(mode_type: type) -> None:
    """One more mode (an instance of `mode_type`) in the process: the first saves the settings
    and pins them, and installs the detours."""
    with _lock:
        if _state["count"] == 0:
            _state["saved"] = [setting.get() for setting in SETTINGS]
            for setting in SETTINGS:
                setting.set(setting.value)
            detours.install(mode_type)
        _state["count"] += 1


def leave() -> None:
    """One mode fewer: the last puts the settings back as they were before the first."""
    with _lock:
        if _state["count"] == 0:
            return
        _state["count"] -= 1
        if _state["count"] == 0:
            for setting, saved in zip(SETTINGS, _state["saved"]):
                setting.set(saved)
            detours.uninstall()


def stop_flushing() -> bool:
    """Compute with denormals in this thread; returns whether it was flushing them: the smallest
    double times one, in the thread's own floating-point unit (a Python float: no operation a
    dispatch mode would see), is zero only where denormals are flushed."""
    flushing = _probe["tiny"] * _probe["one"] == 0.0  # names, not constants: not folded
    if flushing:
        torch.set_flush_denormal(False)
    return flushing


def resume_flushing(flushing: bool) -> None:
    """Put back the thread's flushing of denormals as stop_flushing found it."""
    if flushing:
        torch.set_flush_denormal(True)


def compile_eagerly(mode) -> None:
    """Compiled code would bypass the mode (its kernels are Inductor's, with their own orders
    and fusions), so under portable mode `torch.compile` runs the function eagerly, through the
    mode: Dynamo is disabled (TORCHDYNAMO_DISABLE, inherited by worker processes, or its config
    where it is already loaded), and each call of `torch.compile` is counted for the manifest."""
    config = sys.modules.get("torch._dynamo.config")
    saved_env = os.environ.get("TORCHDYNAMO_DISABLE")
    saved_config = getattr(config, "disable", None)
    os.environ["TORCHDYNAMO_DISABLE"] = "1"
    if config is not None:
        config.disable = True
    original = torch.compile

    def compile_eagerly(*args, **kwargs):
        mode.compiled += 1
        return original(*args, **kwargs)

    torch.compile = compile_eagerly

    def undo() -> None:
        if torch.compile is compile_eagerly:
            torch.compile = original
        if saved_env is None:
            os.environ.pop("TORCHDYNAMO_DISABLE", None)
        else:
            os.environ["TORCHDYNAMO_DISABLE"] = saved_env
        if config is not None:
            config.disable = saved_config

    mode.undo_compile = undo
