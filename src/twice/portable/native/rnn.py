"""The compiled LSTM cell (csrc/recurrent.c: p_lstm_cell, p_lstm_cell_backward; p_lstm_step,
p_lstm_step_backward with the step's product scaled and the next product's operand cut), where
it applies.

As in __init__.py, each function returns False where the kernel does not apply (a tensor not on
the CPU, of another dtype, or not contiguous; no compiled module), and recurrent.py then computes
the same bits with the portable kernels and torch operations.
"""

from __future__ import annotations

import torch

from twice.portable import native
from twice.portable.native import buffer
from twice.portable.native.products import integer_product

__all__ = ["lstm_cell", "lstm_cell_backward", "ready", "Steps"]


def ready(*tensors) -> bool:
    """Whether the kernels take these tensors (None ones aside): on the CPU, float32 or float64,
    one dtype, contiguous."""
    present = [t for t in tensors if t is not None]
    dtype = present[0].dtype
    return native.usable(*present) and all(t.dtype == dtype and t.is_contiguous() for t in present)


def lstm_cell(hg, bias, gx, c, act, c_out, tanh_c, h) -> bool:
    """One step forward: gates = (hg + bias) + gx; act = the gates' functions; c_out = f c + i g;
    tanh_c = tanh(c_out); h = o tanh_c. hg, gx, act: (rows, 4H); c and the outputs: (rows, H);
    bias (4H) or None. Whether it ran."""
    if not ready(hg, bias, gx, c, act, c_out, tanh_c, h):
        return False
    native.module().p_lstm_cell(
        rows=c.shape[0], hidden=c.shape[1], hg=buffer(hg), bias=buffer(bias), gx=buffer(gx),
        c=buffer(c), act=buffer(act), c_out=buffer(c_out), tanh_c=buffer(tanh_c), h=buffer(h),
    )  # fmt: skip
    return True


def lstm_cell_backward(dy, dh, dc, act, tanh_c, c_prev, dgates, dc_out) -> bool:
    """One step backward: the gates' gradients into dgates (rows, 4H) and the previous cell's
    into dc_out (rows, H), from the output's gradient dy, the next step's dh and dc (each may be
    None). Whether it ran."""
    if not ready(act, dy, dh, dc, tanh_c, c_prev, dgates, dc_out):
        return False
    native.module().p_lstm_cell_backward(
        rows=c_prev.shape[0], hidden=c_prev.shape[1], dy=buffer(dy), dh=buffer(dh),
        dc=buffer(dc), act=buffer(act), tanh_c=buffer(tanh_c), c_prev=buffer(c_prev),
        dgates=buffer(dgates), dc_out=buffer(dc_out),
    )  # fmt: skip
    return True


class Steps:
    """An LSTM layer's time steps by p_lstm_step (p_lstm_step_backward): each step one float64
    product of integers (integer_product's) and one compiled call that scales and rounds it as
    `Repeated`'s product does, runs the cell, and cuts the next product's operand (the hidden
    state forward, the gates' gradients backward) as `native.split_rows` does, the same bits
    as the separate kernels. `repeated` is the recurrent weight's `exact.Repeated` (right
    side); `like` a tensor of the layer's dtype. Where it does not apply, `usable` is False."""

    def __init__(self, repeated, like: torch.Tensor, rows: int, width: int) -> None:
        module = native.module()
        self.usable = bool(
            module is not None
            and hasattr(module, "p_lstm_step")
            and repeated.parts is not None
            and native.usable(like)
        )
        if not self.usable:
            return
        self.module, self.repeated = module, repeated
        ints, units = repeated.parts
        self.ints_w, self.units_w = ints, units.reshape(-1).contiguous()
        self.ub = buffer(self.units_w)
        self.rows = rows
        self.prod = torch.empty(rows, ints.shape[1], dtype=torch.float64)
        self.ints = torch.empty(rows, width, dtype=torch.float64)  # the cut operand's integers
        self.units = [torch.empty(rows, dtype=torch.float64) for _ in range(2)]
        self.flip, self.cut = 0, False

    def cut_from(self, t: torch.Tensor) -> bool:
        """Cut `t` (rows, width) for the next product; False where a value is not finite."""
        parts = native.split_rows(t, (-1,), self.repeated.beta)
        if not parts:
            self.cut = False
            return False
        self.ints.copy_(parts[0][0])
        self.units[self.flip].copy_(parts[0][1].reshape(-1))
        self.cut = True
        return True

    def _product(self) -> tuple:
        """The pending product into self.prod; (its buffer, its row units' buffer)."""
        integer_product(self.ints, self.ints_w, out=self.prod)
        units = self.units[self.flip]
        self.flip ^= 1
        return buffer(self.prod), buffer(units)

    def forward(self, bias, gx, c, act, c_out, tanh_c, h) -> None:
        """One step from the cut hidden state: p_lstm_cell's outputs, and h's cut (self.cut)."""
        prod, ua = self._product()
        self.cut = self.module.p_lstm_step(
            self.rows, c.shape[1], self.repeated.beta, prod, ua, self.ub, buffer(bias),
            buffer(gx), buffer(c), buffer(act), buffer(c_out), buffer(tanh_c), buffer(h),
            buffer(self.ints), buffer(self.units[self.flip]),
        )  # fmt: skip

    def backward(self, dh, dy, dc, act, tanh_c, c_prev, dgates, dc_out) -> None:
        """One step back: the incoming hidden gradient is the pending cut's product (when
        self.cut) or `dh` (a tensor or None); p_lstm_cell_backward's outputs, and the gates'
        gradients' cut (self.cut)."""
        prod, ua = self._product() if self.cut else (None, None)
        self.cut = self.module.p_lstm_step_backward(
            self.rows, c_prev.shape[1], self.repeated.beta, prod, ua, self.ub,
            None if self.cut else buffer(dh), buffer(dy), buffer(dc), buffer(act),
            buffer(tanh_c), buffer(c_prev), buffer(dgates), buffer(dc_out), buffer(self.ints),
            buffer(self.units[self.flip]),
        )  # fmt: skip
