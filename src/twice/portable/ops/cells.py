"""The time steps of the fused recurrent layers (recurrent.py): LSTM, GRU and the plain RNN with
tanh or ReLU, forward and backward.

Each step is torch's CPU cell (aten/src/ATen/native/RNN.cpp, with the input's projection for
every step computed beforehand) spelled with the portable kernels: the gates' functions are the
registered kernels' (twice's own sigmoid and tanh, their backwards), every other operation one
torch operation that IEEE arithmetic rounds once, in the cell's order; the backward follows
autograd's formula for each of the cell's operations, and adds two gradients where autograd's
input buffer would (two terms: the order cannot matter). So every value a step computes has the
op-by-op route's bits. The LSTM's step runs as one compiled pass where the C module is built
(native_rnn), the same operations.

A cell's `forward(gx, recurrent, h0, c0, b_hh, order, y)` writes the outputs into `y` and returns
(what the backward needs, h_n, c_n); its `backward(saved, y, h_prev, dy, dh_n, dc_n, transposed,
order)` returns the gradients of the input projection and of the recurrent product's output, one
row of each per step and sample, and those of the initial states (h_prev: the hidden state each
step started from).
"""

from __future__ import annotations

import torch

from twice.portable.arithmetic import elementwise as ew
from twice.portable.dispatch.table import KERNELS
from twice.portable.native import rnn as native_rnn
from twice.portable.ops.math import unary

__all__ = ["CELLS", "previous"]

_sigmoid = unary(ew.sigmoid, "sigmoid")  # the registered kernels' own construction
_tanh = unary(ew.tanh, "tanh")


def _sigmoid_backward(grad, y):
    return KERNELS["sigmoid_backward.default"](grad, y)


def _tanh_backward(grad, y):
    return KERNELS["tanh_backward.default"](grad, y)


def previous(h0, y, reverse: bool) -> torch.Tensor:
    """The hidden state each step started from, at the step's position."""
    if reverse:
        return torch.cat([y[1:], h0.unsqueeze(0)], 0)
    return torch.cat([h0.unsqueeze(0), y[:-1]], 0)


def _incoming(dy, t, dh_rec, like):
    """The hidden state's gradient at step t: the output's plus the next step's (either may be
    absent; zeros when both are)."""
    dh = dy[t] if dy is not None else None
    if dh_rec is not None:
        dh = dh_rec if dh is None else torch.add(dh, dh_rec)
    return dh if dh is not None else torch.zeros_like(like)


def _linear_hh(recurrent, h, b_hh):
    """`linear(h, w_hh, b_hh)`: the product rounded once, then the bias added."""
    out = recurrent(h)
    return out if b_hh is None else torch.add(out, b_hh)


class LSTM:
    """gates = linear_hh(h) + gx; i, f, g, o = sigmoid, sigmoid, tanh, sigmoid of its blocks;
    c' = f c + i g; h' = o tanh(c')."""

    gates, has_cell = 4, True

    @staticmethod
    def forward(gx, recurrent, h0, c0, b_hh, order, y):
        """The steps, each one compiled pass where the C module applies; saves the gates, the
        cell states' tanh and the cell state each step started from."""
        steps, batch, hidden = y.shape
        acts = torch.empty(steps, batch, 4 * hidden, dtype=y.dtype, device=y.device)
        tanh_c = torch.empty(steps, batch, hidden, dtype=y.dtype, device=y.device)
        c_prev = torch.empty(steps, batch, hidden, dtype=y.dtype, device=y.device)
        h, c = h0, c0
        g_cols = slice(2 * hidden, 3 * hidden)
        steps_ = native_rnn.Steps(recurrent, y, batch, hidden)
        if steps_.usable and not native_rnn.ready(gx, h0, c0, b_hh, acts, tanh_c, c_prev, y):
            steps_.usable = False
        for t in order:
            c_prev[t].copy_(c)
            c_next = torch.empty(batch, hidden, dtype=y.dtype, device=y.device)
            if steps_.usable and (steps_.cut or steps_.cut_from(h)):  # one compiled call
                steps_.forward(b_hh, gx[t], c_prev[t], acts[t], c_next, tanh_c[t], y[t])
                h, c = y[t], c_next
                continue
            gates = recurrent(h)
            if native_rnn.lstm_cell(
                gates, b_hh, gx[t], c_prev[t], acts[t], c_next, tanh_c[t], y[t]
            ):  # the compiled cell: the operations below, in one pass
                h, c = y[t], c_next
                continue
            if b_hh is not None:
                gates = torch.add(gates, b_hh)
            gates = torch.add(gates, gx[t])
            act = acts[t]
            act.copy_(_sigmoid(gates))
            act[:, g_cols].copy_(_tanh(gates[:, g_cols]))
            i, f, g, o = act.chunk(4, 1)
            c = torch.add(torch.mul(f, c), torch.mul(i, g))
            tc = _tanh(c)
            tanh_c[t].copy_(tc)
            h = torch.mul(o, tc)
            y[t].copy_(h)
        return (acts, tanh_c, c_prev), h.clone(), c.clone()

    @staticmethod
    def backward(saved, y, h_prev, dy, dh_n, dc_n, transposed, order):
        """The gates' gradients, step by step in reverse (one gradient for both products)."""
        acts, tanh_c, c_prev = saved
        batch, hidden = y.shape[1], y.shape[2]
        dgates = torch.empty_like(acts)
        dh_rec, dc_rec = dh_n, dc_n
        steps_ = native_rnn.Steps(transposed, y, batch, 4 * hidden)
        if steps_.usable and not native_rnn.ready(acts, tanh_c, c_prev, dy, dh_n, dc_n):
            steps_.usable = False
        for t in reversed(order):
            dg, dc_next = dgates[t], torch.empty(batch, hidden, dtype=y.dtype, device=y.device)
            dy_t = dy[t] if dy is not None else None
            reached = dy_t is not None or dh_rec is not None or (steps_.usable and steps_.cut)
            if reached and steps_.usable and (steps_.cut or native_rnn.ready(dh_rec, y)):
                steps_.backward(dh_rec, dy_t, dc_rec, acts[t], tanh_c[t], c_prev[t], dg, dc_next)
                dc_rec = dc_next  # the hidden gradient stays cut for the next product
                dh_rec = None if steps_.cut else transposed(dg)
                continue
            args = (acts[t], tanh_c[t], c_prev[t], dg, dc_next)
            if reached and native_rnn.lstm_cell_backward(dy_t, dh_rec, dc_rec, *args):
                dc_rec, dh_rec = dc_next, transposed(dg)  # the compiled cell: as below
                continue
            dh = _incoming(dy, t, dh_rec, y[t]) if reached else None
            dc_rec = LSTM._step_backward(dh, dc_rec, acts[t], tanh_c[t], c_prev[t], dg)
            dh_rec = transposed(dg)
        if steps_.usable and steps_.cut:  # the first step's gates' gradients, still cut
            dh_rec = transposed(dgates[order[0]])
        return dgates, dgates, dh_rec, dc_rec

    @staticmethod
    def _step_backward(dh, dc_rec, act, tc, c_prev, dg):
        """One step's gates' gradients into dg; the previous cell state's gradient. `dh` None:
        no gradient reaches the step's hidden state (only the cell state is used), so, as in
        torch's composition, the output gate's gradient is 0 and none flows through tanh(c)."""
        i, f, g, o = act.chunk(4, 1)
        dact = torch.empty_like(act)
        d_i, d_f, d_g, d_o = dact.chunk(4, 1)
        if dh is None:
            d_o.zero_()
            dc = dc_rec if dc_rec is not None else torch.zeros_like(tc)
        else:
            torch.mul(dh, tc, out=d_o)
            dc = _tanh_backward(torch.mul(dh, o), tc)
            if dc_rec is not None:
                dc = torch.add(dc, dc_rec)
        torch.mul(dc, c_prev, out=d_f)
        torch.mul(dc, g, out=d_i)
        torch.mul(dc, i, out=d_g)
        dg.copy_(_sigmoid_backward(dact, act))
        hidden = tc.shape[1]
        dg[:, 2 * hidden : 3 * hidden].copy_(_tanh_backward(d_g, g))
        if dh is None:
            dg[:, 3 * hidden :].zero_()  # no gradient: not sigmoid's backward of 0
        return torch.mul(dc, f)


class GRU:
    """hg = linear_hh(h); r = sigmoid(hg_r + gx_r); z = sigmoid(hg_z + gx_z);
    n = tanh(gx_n + hg_n r); h' = (h - n) z + n."""

    gates, has_cell = 3, False

    @staticmethod
    def forward(gx, recurrent, h0, c0, b_hh, order, y):
        """The steps; saves r, z, n and the recurrent product's n block."""
        steps, batch, hidden = y.shape
        acts = torch.empty(steps, batch, 3 * hidden, dtype=y.dtype, device=y.device)  # r, z, n
        # hg_n, before r multiplies it
        hns = torch.empty(steps, batch, hidden, dtype=y.dtype, device=y.device)
        h = h0
        two = 2 * hidden
        for t in order:
            hg, g = _linear_hh(recurrent, h, b_hh), gx[t]
            act = acts[t]
            act[:, :two].copy_(_sigmoid(torch.add(hg[:, :two], g[:, :two])))
            r, z = act[:, :hidden], act[:, hidden:two]
            hns[t].copy_(hg[:, two:])
            n = _tanh(torch.add(g[:, two:], torch.mul(hg[:, two:], r)))
            act[:, two:].copy_(n)
            h = torch.add(torch.mul(torch.sub(h, n), z), n)
            y[t].copy_(h)
        return (acts, hns), h.clone(), None

    @staticmethod
    def backward(saved, y, h_prev, dy, dh_n, dc_n, transposed, order):
        """The gradients of the input projection and of the recurrent product, which differ in
        the n block (r multiplies only the recurrent one)."""
        acts, hns = saved
        hidden = y.shape[2]
        two = 2 * hidden
        dgx, dhg = torch.empty_like(acts), torch.empty_like(acts)
        dh_rec, parts = dh_n, None
        for t in reversed(order):
            if parts is None:
                dh = _incoming(dy, t, dh_rec, y[t])
            else:  # h feeds the output, h - n and the product: summed in autograd's order
                dh = parts[0] if dy is None else torch.add(dy[t], parts[0])
                dh = torch.add(dh, parts[1])
            act = acts[t]
            r, z, n = act[:, :hidden], act[:, hidden:two], act[:, two:]
            d_diff = torch.mul(dh, z)  # of h - n
            d_z = torch.mul(dh, torch.sub(h_prev[t], n))
            d_pre_n = _tanh_backward(torch.sub(dh, d_diff), n)  # n's two uses: dh - d_diff
            d_r = torch.mul(d_pre_n, hns[t])
            both = _sigmoid_backward(torch.cat([d_r, d_z], 1), act[:, :two])
            dgx[t, :, :two] = both
            dgx[t, :, two:] = d_pre_n
            dhg[t, :, :two] = both
            torch.mul(d_pre_n, r, out=dhg[t, :, two:])
            parts = (d_diff, transposed(dhg[t]))
        return dgx, dhg, parts[0], parts[1]  # h - n's and the product's: autograd adds them


class RNN:
    """h' = f(linear_hh(h) + gx), f tanh or ReLU."""

    gates, has_cell = 1, False

    def __init__(self, relu: bool) -> None:
        self.relu = relu

    def forward(self, gx, recurrent, h0, c0, b_hh, order, y):
        """The steps; the outputs are all the backward needs."""
        h = h0
        for t in order:
            pre = torch.add(_linear_hh(recurrent, h, b_hh), gx[t])
            h = torch.relu(pre) if self.relu else _tanh(pre)
            y[t].copy_(h)
        return (), h.clone(), None

    def backward(self, saved, y, h_prev, dy, dh_n, dc_n, transposed, order):
        """The pre-activation's gradient, step by step in reverse (one for both products)."""
        dpre = torch.empty_like(y)
        dh_rec = dh_n
        for t in reversed(order):
            dh = _incoming(dy, t, dh_rec, y[t])
            if self.relu:
                dpre[t] = torch.ops.aten.threshold_backward(dh, y[t], 0)
            else:
                dpre[t] = _tanh_backward(dh, y[t])
            dh_rec = transposed(dpre[t])
        return dpre, dpre, dh_rec, None


CELLS = {"lstm": LSTM, "gru": GRU, "rnn_tanh": RNN(relu=False), "rnn_relu": RNN(relu=True)}
"""The fused cells by the name of the `torch._VF` function they stand for."""
