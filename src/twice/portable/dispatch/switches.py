"""The torch settings portable mode turns off while it is active: process-wide ones counted
across threads, and the calling thread's flushing of denormals.

- oneDNN's fused recurrent kernel (mkldnn_rnn_layer) is one opaque operation; without it torch
  runs LSTM, GRU and RNN layers as the matrix products and functions each is made of.
- The fused inference path of nn.MultiheadAttention and the transformer layers gives way to
  their modules' operations.
- An einsum of three operands or more contracts left to right: opt_einsum's order would follow
  whether that package is installed.

These three are one setting for the whole process, while a mode is per thread: the first mode
entered (in any thread) saves and turns them off, the last one left restores them, under one
lock. Denormals are the calling thread's own setting (`torch.set_flush_denormal`, the x86 MXCSR
or ARM FPCR): torch's worker threads keep them, so flushing them in one thread would make a
result depend on which thread computed it. Each thread's outermost mode computes with them
(IEEE) and puts the thread's setting back on leaving.
"""

from __future__ import annotations

import threading

import torch

__all__ = ["enter", "leave", "stop_flushing", "resume_flushing"]

_lock = threading.Lock()
_state: dict = {"count": 0, "saved": None}
_probe = {"tiny": 5e-324, "one": 1.0}


def enter() -> None:
    """One more mode in the process: the first saves the settings and turns them off."""
    with _lock:
        if _state["count"] == 0:
            _state["saved"] = (
                torch._C._get_mkldnn_enabled(),
                torch.backends.mha.get_fastpath_enabled(),
                torch.backends.opt_einsum.enabled,
            )
            torch._C._set_mkldnn_enabled(False)
            torch.backends.mha.set_fastpath_enabled(False)
            torch.backends.opt_einsum.enabled = False
        _state["count"] += 1


def leave() -> None:
    """One mode fewer: the last puts the settings back as they were before the first."""
    with _lock:
        if _state["count"] == 0:
            return
        _state["count"] -= 1
        if _state["count"] == 0:
            mkldnn, fastpath, einsum = _state["saved"]
            torch._C._set_mkldnn_enabled(mkldnn)
            torch.backends.mha.set_fastpath_enabled(fastpath)
            torch.backends.opt_einsum.enabled = einsum


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
