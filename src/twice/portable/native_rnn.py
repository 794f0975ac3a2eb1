"""The compiled LSTM cell (src/twice/_portable.c p_lstm_cell, p_lstm_cell_backward), where it
applies.

As in native.py, each function returns False where the kernel does not apply (a tensor not on
the CPU, of another dtype, or not contiguous; no compiled module), and recurrent.py then computes
the same bits with the portable kernels and torch operations.
"""

from __future__ import annotations

import torch

from twice.portable import native

__all__ = ["lstm_cell", "lstm_cell_backward"]


def _ready(*tensors) -> bool:
    present = [t for t in tensors if t is not None]
    dtype = present[0].dtype
    return native.usable(*present) and all(t.dtype == dtype and t.is_contiguous() for t in present)


def _ptr(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.data_ptr()


def lstm_cell(hg, bias, gx, c, act, c_out, tanh_c, h) -> bool:
    """One step forward: gates = (hg + bias) + gx; act = the gates' functions; c_out = f c + i g;
    tanh_c = tanh(c_out); h = o tanh_c. hg, gx, act: (rows, 4H); c and the outputs: (rows, H);
    bias (4H) or None. Whether it ran."""
    if not _ready(hg, bias, gx, c, act, c_out, tanh_c, h):
        return False
    native.module().p_lstm_cell(
        kind=native.KINDS[hg.dtype], rows=c.shape[0], hidden=c.shape[1], hg=hg.data_ptr(),
        bias=_ptr(bias), gx=gx.data_ptr(), c=c.data_ptr(), act=act.data_ptr(),
        c_out=c_out.data_ptr(), tanh_c=tanh_c.data_ptr(), h=h.data_ptr(),
    )  # fmt: skip
    return True


def lstm_cell_backward(dy, dh, dc, act, tanh_c, c_prev, dgates, dc_out) -> bool:
    """One step backward: the gates' gradients into dgates (rows, 4H) and the previous cell's
    into dc_out (rows, H), from the output's gradient dy, the next step's dh and dc (each may be
    None). Whether it ran."""
    if not _ready(act, dy, dh, dc, tanh_c, c_prev, dgates, dc_out):
        return False
    native.module().p_lstm_cell_backward(
        kind=native.KINDS[act.dtype], rows=c_prev.shape[0], hidden=c_prev.shape[1],
        dy=_ptr(dy), dh=_ptr(dh), dc=_ptr(dc), act=act.data_ptr(), tanh_c=tanh_c.data_ptr(),
        c_prev=c_prev.data_ptr(), dgates=dgates.data_ptr(), dc_out=dc_out.data_ptr(),
    )  # fmt: skip
    return True
