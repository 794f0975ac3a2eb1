"""`nn.LSTM` in portable mode as one autograd operation per layer and direction.

With oneDNN's fused kernel switched off (mode.py), torch runs an LSTM layer as the products and
functions it is made of: a few dozen operations per time step, each routed through the mode, and
a backward that cuts the recurrent weight into slices again at every step and adds each step's
weight gradient into the total, one rounding per step. Here a layer is one autograd function
whose steps call the same portable kernels directly, with the recurrent weight cut into slices
once for all steps (`exact.Repeated`), and whose weight and bias gradients are each one
exact product, or sum, over all steps and samples, rounded once.

What that changes in bits, by construction: the outputs, the final states, and the gradients of
the input, the initial states, the input weights and the input bias are the op-by-op route's
bits (the same kernels on the same values in the same order: tests hold them equal); the
recurrent weight's and the recurrent bias's gradients are exact sums over every step rounded
once, where the op-by-op route rounds once per step. Both depend on the inputs alone.

The fused path is taken for CPU tensors of float32 or float64, one dtype throughout, without
projections (`proj_size`), packed sequences or autocast, when the portable mode is the
innermost dispatch mode; every other call runs op by op through the mode, as before. A backward
with `create_graph=True` (a second derivative, a gradient penalty) runs the layer again op by op
and differentiates that, so its gradients are the op-by-op route's and can be differentiated
again. `TWICE_NO_FUSED_RNN=1` keeps every call op by op.
"""

from __future__ import annotations

import threading

import torch
from torch.utils._python_dispatch import (
    _disable_current_modes,
    _get_current_dispatch_mode,
    _pop_mode_temporarily,
)

from twice.portable import elementwise as ew
from twice.portable import native_rnn
from twice.portable.exact import Repeated, exact_matmul, exact_sum
from twice.portable.ops_math import unary
from twice.portable.table import KERNELS

__all__ = ["install", "uninstall", "lstm", "LSTMLayer"]

_sigmoid = unary(ew.sigmoid, "sigmoid")  # the registered kernels' own construction
_tanh = unary(ew.tanh, "tanh")
_DTYPES = (torch.float32, torch.float64)


def _sigmoid_backward(grad, y):
    return KERNELS["sigmoid_backward.default"](grad, y)


def _tanh_backward(grad, y):
    return KERNELS["tanh_backward.default"](grad, y)


class _bare:
    """No dispatch mode routes the operations in this block: the portable mode is left where it
    is the innermost one (as inside its own kernels); where another mode is, all are."""

    def __enter__(self):
        current = _get_current_dispatch_mode()
        if current is None:
            self._inner = None
        elif isinstance(current, _installed["mode"]):
            self._inner = _pop_mode_temporarily()
        else:
            self._inner = _disable_current_modes()
        if self._inner is not None:
            self._inner.__enter__()

    def __exit__(self, *exc):
        if self._inner is not None:
            return self._inner.__exit__(*exc)
        return None


def _linear(x, weight, bias):
    """`at::linear(x, weight, bias)` as the portable route computes it: the product rounded
    once, then the bias added."""
    out = exact_matmul(x, weight.t(), x.dtype)
    return out if bias is None else torch.add(out, bias)


class LSTMLayer(torch.autograd.Function):
    """One LSTM layer in one direction over a time-major input (T, B, I): the output (T, B, H),
    the final hidden and cell states (B, H)."""

    @staticmethod
    def forward(ctx, x, h0, c0, w_ih, w_hh, b_ih, b_hh, reverse):
        """The steps in order (`reverse`: last to first), each gate's function and the cell
        update as torch's CPU cell spells them; saves the gates for the backward."""
        ctx.set_materialize_grads(False)
        with _bare():
            steps, batch = x.shape[0], x.shape[1]
            hidden = w_hh.shape[1]
            # the input's projection for every step at once, as torch's CPU layer computes it
            gx = _linear(x.reshape(steps * batch, -1), w_ih, b_ih).reshape(steps, batch, -1)
            recurrent = Repeated(w_hh.t(), x.dtype, "right")
            acts = torch.empty(steps, batch, 4 * hidden, dtype=x.dtype)
            tanh_c = torch.empty(steps, batch, hidden, dtype=x.dtype)
            c_prev = torch.empty(steps, batch, hidden, dtype=x.dtype)
            y = torch.empty(steps, batch, hidden, dtype=x.dtype)
            h, c = h0, c0
            g_cols = slice(2 * hidden, 3 * hidden)
            for t in _order(steps, reverse):
                gates = recurrent(h)
                c_prev[t].copy_(c)
                c_next = torch.empty(batch, hidden, dtype=x.dtype)
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
            h_n, c_n = h.clone(), c.clone()
        ctx.reverse = reverse
        ctx.save_for_backward(x, h0, c0, w_ih, w_hh, b_ih, b_hh, acts, tanh_c, c_prev, y)
        return y, h_n, c_n

    @staticmethod
    def backward(ctx, dy, dh_n, dc_n):
        """The steps in reverse, the gates' gradients by autograd's formulas for the cell's
        operations; then the products and sums over all steps at once. Under
        `create_graph=True`, the op-by-op layer's gradients instead, which can be
        differentiated again."""
        if torch.is_grad_enabled():
            return _differentiable_backward(ctx, dy, dh_n, dc_n)
        x, h0, c0, w_ih, w_hh, b_ih, b_hh, acts, tanh_c, c_prev, y = ctx.saved_tensors
        with _bare():
            steps, batch = x.shape[0], x.shape[1]
            hidden = w_hh.shape[1]
            transposed = Repeated(w_hh, x.dtype, "right")
            dgates = torch.empty_like(acts)
            g_cols = slice(2 * hidden, 3 * hidden)
            order = _order(steps, ctx.reverse)
            dy, dh_rec, dc_rec = (None if d is None else d.contiguous() for d in (dy, dh_n, dc_n))
            for t in reversed(order):
                dg, dc_next = dgates[t], torch.empty(batch, hidden, dtype=x.dtype)
                dy_t = dy[t] if dy is not None else None
                args = (acts[t], tanh_c[t], c_prev[t], dg, dc_next)
                if native_rnn.lstm_cell_backward(dy_t, dh_rec, dc_rec, *args):
                    dc_rec, dh_rec = dc_next, transposed(dg)  # the compiled cell: as below
                    continue
                dh = dy_t
                if dh_rec is not None:
                    dh = dh_rec if dh is None else torch.add(dh, dh_rec)
                if dh is None:
                    dh = torch.zeros(batch, hidden, dtype=x.dtype)
                act = acts[t]
                i, f, g, o = act.chunk(4, 1)
                tc = tanh_c[t]
                dact = torch.empty_like(act)
                d_i, d_f, d_g, d_o = dact.chunk(4, 1)
                torch.mul(dh, tc, out=d_o)
                dc = _tanh_backward(torch.mul(dh, o), tc)
                if dc_rec is not None:
                    dc = torch.add(dc, dc_rec)
                torch.mul(dc, c_prev[t], out=d_f)
                dc_rec = torch.mul(dc, f)
                torch.mul(dc, g, out=d_i)
                torch.mul(dc, i, out=d_g)
                dg.copy_(_sigmoid_backward(dact, act))
                dg[:, g_cols].copy_(_tanh_backward(d_g, g))
                dh_rec = transposed(dg)
            flat = dgates.reshape(steps * batch, 4 * hidden)
            h_prev = _previous(h0, y, ctx.reverse)
            need, rows = ctx.needs_input_grad, steps * batch
            dx = exact_matmul(flat, w_ih, x.dtype).reshape(x.shape) if need[0] else None
            dw_ih = exact_matmul(flat.t(), x.reshape(rows, -1), x.dtype) if need[3] else None
            dw_hh = exact_matmul(flat.t(), h_prev.reshape(rows, -1), x.dtype) if need[4] else None
            db = exact_sum(flat, (0,)) if (need[5] or need[6]) else None
        return (
            dx,
            dh_rec if need[1] else None,
            dc_rec if need[2] else None,
            dw_ih,
            dw_hh,
            db if need[5] else None,
            (db.clone() if need[5] else db) if need[6] else None,
            None,
        )


def _differentiable_backward(ctx, dy, dh_n, dc_n):
    """The gradients a second derivative can go through (`create_graph=True`): the layer run
    again op by op (torch's own composition, each operation routed through the portable mode,
    with autograd recording it), then differentiated. These are the op-by-op route's bits, for
    the recurrent weight's gradient too."""
    x, h0, c0, w_ih, w_hh, b_ih, b_hh = ctx.saved_tensors[:7]
    weights = [w for w in (w_ih, w_hh, b_ih, b_hh) if w is not None]
    steps = x.flip(0) if ctx.reverse else x  # a reversed layer is a forward one on flipped time
    out, h_n, c_n = torch._C._VariableFunctions.lstm(
        steps, (h0.unsqueeze(0), c0.unsqueeze(0)), weights, b_ih is not None, 1, 0.0, False,
        False, False,
    )  # fmt: skip
    out = out.flip(0) if ctx.reverse else out
    pairs = [(o, g) for o, g in ((out, dy), (h_n[0], dh_n), (c_n[0], dc_n)) if g is not None]
    need = ctx.needs_input_grad[:7]
    inputs = [t for t, wanted in zip((x, h0, c0, w_ih, w_hh, b_ih, b_hh), need) if wanted]
    grads = iter(
        torch.autograd.grad(
            [o for o, _ in pairs],
            inputs,
            [g for _, g in pairs],
            create_graph=True,
            allow_unused=True,
        )  # fmt: skip
    )
    return (*(next(grads) if wanted else None for wanted in need), None)


def _order(steps: int, reverse: bool) -> list[int]:
    return list(range(steps - 1, -1, -1)) if reverse else list(range(steps))


def _previous(h0, y, reverse):
    """The hidden state each step started from, at the step's position."""
    if reverse:
        return torch.cat([y[1:], h0.unsqueeze(0)], 0)
    return torch.cat([h0.unsqueeze(0), y[:-1]], 0)


def lstm(original, *args):
    """`torch._VF.lstm` under portable mode: the fused layers where they apply, else `original`
    (run op by op through the mode)."""
    if not _fusable(args):
        return original(*args)
    inputs, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first = args
    directions = 2 if bidirectional else 1
    per_layer = 4 if has_biases else 2
    x = inputs.transpose(0, 1) if batch_first else inputs
    h0s, c0s = hx[0].unbind(0), hx[1].unbind(0)
    finals_h, finals_c = [], []
    for layer in range(num_layers):
        outputs = []
        for direction in range(directions):
            index = layer * directions + direction
            w = params[index * per_layer : (index + 1) * per_layer]
            b_ih, b_hh = (w[2], w[3]) if has_biases else (None, None)
            y, h_n, c_n = LSTMLayer.apply(
                x, h0s[index], c0s[index], w[0], w[1], b_ih, b_hh, direction == 1
            )
            outputs.append(y)
            finals_h.append(h_n)
            finals_c.append(c_n)
        x = outputs[0] if directions == 1 else torch.cat(outputs, -1)
        if dropout and train and layer < num_layers - 1:
            x = torch.dropout(x, dropout, True)
    output = x.transpose(0, 1) if batch_first else x
    return output, torch.stack(finals_h, 0), torch.stack(finals_c, 0)


def _fusable(args) -> bool:
    if len(args) != 9 or not isinstance(args[1], (tuple, list)) or len(args[1]) != 2:
        return False  # the packed-sequence form: (data, batch_sizes, hx, ...)
    if not isinstance(_get_current_dispatch_mode(), _installed["mode"]):
        return False
    inputs, hx, params, has_biases, num_layers, _, _, bidirectional, _ = args
    tensors = [inputs, *hx, *params]
    if any(not isinstance(t, torch.Tensor) for t in tensors) or inputs.dim() != 3:
        return False
    if inputs.dtype not in _DTYPES or any(
        t.dtype != inputs.dtype or t.device.type != "cpu" for t in tensors
    ):
        return False
    if torch.is_autocast_enabled("cpu") or torch.is_autocast_enabled("cuda"):
        return False
    per_layer = 4 if has_biases else 2
    if len(params) != num_layers * (2 if bidirectional else 1) * per_layer:
        return False  # projections (proj_size) add a weight per layer
    hidden = params[1].shape[1]
    return hx[0].shape[-1] == hidden == hx[1].shape[-1] and params[1].shape[0] == 4 * hidden


_lock = threading.Lock()
_installed: dict = {"count": 0, "saved": None, "mode": ()}


def install(mode_type: type) -> None:
    """Route `nn.LSTM`'s call (`torch._VF.lstm`) through `lstm` while any portable mode (an
    instance of `mode_type`) is entered; every call checks that such a mode is the innermost
    one of its thread."""
    import os

    from twice.core.protocol import NO_FUSED_RNN

    vf = torch._VF
    with _lock:
        _installed["count"] += 1
        _installed["mode"] = mode_type
        if _installed["count"] > 1 or os.environ.get(NO_FUSED_RNN) == "1":
            return
        saved = vf.__dict__.get("lstm")
        original = saved or vf.lstm
        _installed["saved"] = (saved,)

        def fused_lstm(*args, **kwargs):
            if kwargs:
                return original(*args, **kwargs)
            return lstm(original, *args)

        vf.lstm = fused_lstm


def uninstall() -> None:
    """Undo one `install`; the last restores `torch._VF.lstm`."""
    vf = torch._VF
    with _lock:
        if _installed["count"] == 0:
            return
        _installed["count"] -= 1
        if _installed["count"] or _installed["saved"] is None:
            return
        (saved,) = _installed["saved"]
        _installed["saved"] = None
        if saved is None:
            vf.__dict__.pop("lstm", None)
        else:
            vf.lstm = saved
