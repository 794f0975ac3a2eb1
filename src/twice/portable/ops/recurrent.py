"""Recurrent layers in portable mode (`nn.LSTM`, `nn.GRU`, `nn.RNN`) as one autograd operation
per layer and direction, and their cells (`nn.LSTMCell`, `nn.GRUCell`, `nn.RNNCell`) as one per
call.

With oneDNN's fused kernel switched off (mode.py), torch runs a recurrent layer as the products
and functions it is made of: a few dozen operations per time step, each routed through the mode,
and a backward that cuts the recurrent weight into slices again at every step and adds each
step's weight gradient into the total, one rounding per step. Here a layer is one autograd
function whose steps (cells.py) call the same portable kernels directly, with the recurrent
weight cut into slices once for all steps (`exact.Repeated`), and whose weight and bias
gradients are each one product (exact, rounded once; float64: in order) or exact sum, over all
steps and samples. A cell's
call (`torch._VF.lstm_cell`, `gru_cell`, `rnn_tanh_cell`, `rnn_relu_cell`) is that operation
over one step: a loop of cells (pytorch/examples' time_sequence_prediction) runs two dozen
operations fewer per step, forward and backward.

What that changes in bits, by construction: the outputs, the final states, and the gradients of
the input, the initial states, the input weights and the input bias are the op-by-op route's
bits (the same kernels on the same values in the same order: tests hold them equal); the
recurrent weight's and the recurrent bias's gradients are one sum over every step (exact and
rounded once; a float64 weight's in order), where the op-by-op route rounds once per step.
Both depend on the inputs alone. A cell's call is one step, so its outputs and first-order
gradients are the op-by-op route's bits.

The fused path is taken for tensors of float32 or float64, one dtype and one device throughout
(a GPU's as a CPU's, so both round the weights' gradients once; the compiled kernels' torch
fallbacks run there), without projections (`proj_size`), packed sequences or autocast, when the
portable mode is the innermost dispatch mode; every other call runs op by op through the mode. A
backward with `create_graph=True` (a second derivative, a gradient penalty) runs the layer again
op by op and differentiates that, so its gradients are the op-by-op route's and can be
differentiated again. `TWICE_NO_FUSED_RNN=1` keeps every call op by op.
"""

from __future__ import annotations

import threading

import torch
from torch.utils._python_dispatch import (
    _disable_current_modes,
    _get_current_dispatch_mode,
    _pop_mode_temporarily,
)

from twice.portable.arithmetic.exact import Repeated, exact_matmul, exact_sum
from twice.portable.ops.cells import CELLS, previous

__all__ = ["install", "uninstall", "layers", "cell", "RecurrentLayer"]

_DTYPES = (torch.float32, torch.float64)
_KINDS = ("lstm", "gru", "rnn_tanh", "rnn_relu")  # the torch._VF functions replaced
_CELLS = {f"{kind}_cell": kind for kind in _KINDS}  # and their cells'


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


class RecurrentLayer(torch.autograd.Function):
    """One layer in one direction over a time-major input (T, B, I), of the cell `kind`: the
    output (T, B, H) and the final hidden state (B, H), and for an LSTM the final cell state."""

    @staticmethod
    def forward(ctx, kind, reverse, x, h0, c0, w_ih, w_hh, b_ih, b_hh):
        """The input's projection for every step at once, as torch's CPU layer computes it,
        then the cell's steps in order (`reverse`: last to first)."""
        ctx.set_materialize_grads(False)
        cell = CELLS[kind]
        with _bare():
            steps, batch = x.shape[0], x.shape[1]
            gx = _linear(x.reshape(steps * batch, -1), w_ih, b_ih).reshape(steps, batch, -1)
            recurrent = Repeated(w_hh.t(), x.dtype, "right")
            y = torch.empty(steps, batch, w_hh.shape[1], dtype=x.dtype, device=x.device)
            order = _order(steps, reverse)
            saved, h_n, c_n = cell.forward(gx, recurrent, h0, c0, b_hh, order, y)
        ctx.kind, ctx.reverse = kind, reverse
        # the input and the initial state are kept as inputs only where a gradient is taken of
        # them or with them (as the op-by-op route keeps them); else a copy of their values
        need = ctx.needs_input_grad
        keep = [need[2] or need[5], need[3] or need[6]]
        ctx.copies = [None if k else t.detach().clone() for k, t in zip(keep, (x, h0))]
        kept = [t if k else None for k, t in zip(keep, (x, h0))]
        c0 = c0 if cell.has_cell else None  # a GRU's second h0 (_second_use): not needed
        ctx.save_for_backward(*kept, c0, w_ih, w_hh, b_ih, b_hh, y, *saved)
        return (y, h_n, c_n) if cell.has_cell else (y, h_n)

    @staticmethod
    def backward(ctx, dy, dh_n, dc_n=None):
        """The cell's steps in reverse, then the products and sums over all steps at once.
        Under `create_graph=True`, the op-by-op layer's gradients instead, which can be
        differentiated again."""
        if torch.is_grad_enabled():
            return _differentiable_backward(ctx, dy, dh_n, dc_n)
        x, h0, c0, w_ih, w_hh, b_ih, b_hh, y, *saved = _saved(ctx)
        with _bare():
            steps, batch = x.shape[0], x.shape[1]
            order = _order(steps, ctx.reverse)
            h_prev = previous(h0, y, ctx.reverse)
            dy, dh_n, dc_n = (None if d is None else d.contiguous() for d in (dy, dh_n, dc_n))
            single = steps == 1 and ctx.kind != "gru"  # one step: its product comes last
            transposed = (_Last if single else Repeated)(w_hh, x.dtype, "right")
            dgx, dhg, dh0, dc0 = CELLS[ctx.kind].backward(
                saved, y, h_prev, dy, dh_n, dc_n, transposed, order
            )
            need, rows = ctx.needs_input_grad, steps * batch
            one = dhg is dgx  # LSTM and RNN: one gradient for both products
            dgx = dgx.reshape(rows, -1)
            dhg = dgx if one else dhg.reshape(rows, -1)
            if single and transposed.pending is not None:
                dg = transposed.pending
                dx, dh0 = _side_by_side((dg, dg), (w_ih, w_hh), need[2:4], x.dtype)
            else:
                dx = exact_matmul(dgx, w_ih, x.dtype) if need[2] else None
            dx = None if dx is None else dx.reshape(x.shape)
            left = dgx.t()
            lefts = (left, left if one else dhg.t())
            rights = (x.reshape(rows, -1), h_prev.reshape(rows, -1))
            dw_ih, dw_hh = _side_by_side(lefts, rights, need[5:7], x.dtype)
            db_ih = exact_sum(dgx, (0,)) if need[7] else None
            db_hh = None
            if need[8]:  # one sum where the two gradients are one tensor: the same bits
                db_hh = db_ih.clone() if dhg is dgx and need[7] else exact_sum(dhg, (0,))
        return (
            None, None, dx, dh0 if need[3] else None, dc0 if need[4] else None,
            dw_ih, dw_hh, db_ih, db_hh,
        )  # fmt: skip


class _Last(Repeated):
    """The recurrent weight's product of a single step (a cell's call), left for later: in the
    cell's backward it is the step's last operation and gives the initial state's gradient
    only, so `_side_by_side` forms it with the input's."""

    pending = None

    def __call__(self, other: torch.Tensor) -> None:
        self.pending = other


def _side_by_side(lefts, rights, wanted, dtype) -> list:
    """`left @ right` for each wanted pair, exact_matmul's (None for the others). Where
    both are wanted and share their left operand (a single step's input and hidden-state
    gradients; the weight gradients of an LSTM or RNN, whose gates' gradient is one tensor),
    one product of it and the two right operands side by side: every output is its row's and
    its column's own sum (exact, or float64's in order), so its bits are the separate products'
    (tests hold them equal)."""
    if all(wanted) and lefts[0] is lefts[1]:
        both = exact_matmul(lefts[0], torch.cat(rights, 1), dtype)
        cut = rights[0].shape[1]
        return [both[:, :cut].contiguous(), both[:, cut:].contiguous()]
    return [exact_matmul(a, b, dtype) if w else None for a, b, w in zip(lefts, rights, wanted)]


def _saved(ctx) -> list:
    """The saved tensors, with the copies kept in place of the input and initial state."""
    saved = list(ctx.saved_tensors)
    saved[:2] = [c if c is not None else t for c, t in zip(ctx.copies, saved[:2])]
    return saved


def _differentiable_backward(ctx, dy, dh_n, dc_n):
    """The gradients a second derivative can go through (`create_graph=True`): the layer run
    again op by op (torch's own composition, each operation routed through the portable mode,
    with autograd recording it), then differentiated. These are the op-by-op route's bits, for
    the recurrent weight's gradient too."""
    # each input by a node of its own: where one is made from another (a cell's input sliced
    # from the hidden state it is also given), the gradient of each counts its own uses only
    saved = (None if t is None else t.view_as(t) for t in _saved(ctx)[:7])
    x, h0, c0, w_ih, w_hh, b_ih, b_hh = saved
    weights = [w for w in (w_ih, w_hh, b_ih, b_hh) if w is not None]
    steps = x.flip(0) if ctx.reverse else x  # a reversed layer is a forward one on flipped time
    hx = (h0.unsqueeze(0), c0.unsqueeze(0)) if ctx.kind == "lstm" else h0.unsqueeze(0)
    run = getattr(torch._C._VariableFunctions, ctx.kind)
    out, *finals = run(steps, hx, weights, b_ih is not None, 1, 0.0, False, False, False)
    out = out.flip(0) if ctx.reverse else out
    states = [out] + [state[0] for state in finals]
    pairs = [(o, g) for o, g in zip(states, (dy, dh_n, dc_n)) if g is not None]
    # a GRU's h0 in the cell state's place (_second_use) takes no gradient here: the re-run's
    # h0 gets both of its uses' gradients, added (as close, not the same bits)
    given = (x, h0, c0, w_ih, w_hh, b_ih, b_hh)
    need = [wanted and t is not None for t, wanted in zip(given, ctx.needs_input_grad[2:])]
    inputs = [t for t, wanted in zip(given, need) if wanted]
    grads = iter(
        torch.autograd.grad(
            [o for o, _ in pairs],
            inputs,
            [g for _, g in pairs],
            create_graph=True,
            allow_unused=True,
        )  # fmt: skip
    )
    return (None, None, *(next(grads) if wanted else None for wanted in need))


def _second_use(kind: str, h0s) -> list:
    """What a layer of `kind` is given in the cell state's place: for a GRU its initial hidden
    state again. A GRU's step uses h twice (in h - n and in the recurrent product), and the
    op-by-op route's autograd adds the two gradients into h's one after the other, after any
    gradient h's other uses gave it: the layer returns them separately, h - n's for the first
    place and the product's for the second, and autograd adds them in that order."""
    return list(h0s) if kind == "gru" else [None] * len(h0s)


def _order(steps: int, reverse: bool) -> list[int]:
    return list(range(steps - 1, -1, -1)) if reverse else list(range(steps))


def layers(kind, original, *args):
    """`torch._VF.<kind>` (lstm, gru, rnn_tanh, rnn_relu) under portable mode: the fused layers
    where they apply, else `original` (run op by op through the mode)."""
    if not _fusable(kind, args):
        return original(*args)
    inputs, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first = args
    directions = 2 if bidirectional else 1
    per_layer = 4 if has_biases else 2
    x = inputs.transpose(0, 1) if batch_first else inputs
    h0s = (hx[0] if kind == "lstm" else hx).unbind(0)
    c0s = hx[1].unbind(0) if kind == "lstm" else _second_use(kind, h0s)
    finals = [[], []]
    for layer in range(num_layers):
        outputs = []
        for direction in range(directions):
            index = layer * directions + direction
            w = params[index * per_layer : (index + 1) * per_layer]
            b_ih, b_hh = (w[2], w[3]) if has_biases else (None, None)
            y, *states = RecurrentLayer.apply(
                kind, direction == 1, x, h0s[index], c0s[index], w[0], w[1], b_ih, b_hh
            )
            outputs.append(y)
            for kept, state in zip(finals, states):
                kept.append(state)
        x = outputs[0] if directions == 1 else torch.cat(outputs, -1)
        if dropout and train and layer < num_layers - 1:
            x = torch.dropout(x, dropout, True)
    output = x.transpose(0, 1) if batch_first else x
    return output, *(torch.stack(kept, 0) for kept in finals if kept)


def cell(kind, original, *args):
    """`torch._VF.<kind>_cell` under portable mode: one step of the fused layer where it applies
    (the new hidden state, and for an LSTM the new cell state), else `original`."""
    if not _cell_fusable(kind, args):
        return original(*args)
    x, hx, w_ih, w_hh, *biases = args
    b_ih, b_hh = (list(biases) + [None, None])[:2]
    h0, c0 = (hx[0], hx[1]) if kind == "lstm" else (hx, _second_use(kind, [hx])[0])
    _, *states = RecurrentLayer.apply(kind, False, x.unsqueeze(0), h0, c0, w_ih, w_hh, b_ih, b_hh)
    return tuple(states) if kind == "lstm" else states[0]


def _cell_fusable(kind, args) -> bool:
    """A batched call of float32/float64 tensors of one dtype and one device (a GPU's too: op by
    op, a layer's weight gradients would round otherwise than on a CPU) with the shapes torch
    accepts (anything else runs as torch runs it, with torch's error where there is one)."""
    if not 4 <= len(args) <= 6 or not _plain_autograd():
        return False
    x, hx, w_ih, w_hh, *biases = args
    if len({b is None for b in biases}) > 1 or len(biases) == 1:
        return False  # one bias: the op-by-op re-run of a second derivative takes both or none
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        return False
    states = list(hx) if kind == "lstm" and isinstance(hx, (list, tuple)) else [hx]
    if len(states) != (2 if kind == "lstm" else 1):
        return False
    tensors = [x, *states, w_ih, w_hh, *(b for b in biases if b is not None)]
    if any(not isinstance(t, torch.Tensor) for t in tensors) or x.dtype not in _DTYPES:
        return False
    if any(t.dtype != x.dtype or t.device != x.device or t.is_sparse for t in tensors):
        return False
    if torch.is_autocast_enabled("cpu") or torch.is_autocast_enabled("cuda"):
        return False
    rows = CELLS[kind].gates * (w_hh.shape[-1] if w_hh.dim() == 2 else -1)
    shapes = [x.dim(), w_ih.shape, w_hh.shape, *(b.shape for b in biases if b is not None)]
    wanted = [2, (rows, x.shape[-1]), (rows, rows // CELLS[kind].gates)]
    return (
        shapes == wanted + [(rows,)] * (len(shapes) - 3)
        and rows > 0
        and x.shape[0] > 0
        and all(t.shape == (x.shape[0], w_hh.shape[-1]) for t in states)
    )


def _plain_autograd() -> bool:
    """Portable mode is the thread's innermost dispatch mode, and neither a torch.func transform
    (grad, vmap, jvp) nor forward-mode AD is active: the fused Function has no rules for them,
    so such calls run op by op."""
    mode = _get_current_dispatch_mode()
    if not isinstance(mode, _installed["mode"]) or not mode.live:
        return False
    if torch._C._functorch.peek_interpreter_stack() is not None:
        return False
    return torch.autograd.forward_ad._current_level < 0


def _fusable(kind, args) -> bool:
    if len(args) != 9 or not isinstance(args[3], bool):
        return False  # the packed-sequence form: (data, batch_sizes, hx, params, has_biases, ...)
    if not _plain_autograd():
        return False
    inputs, hx, params, has_biases, num_layers, _, _, bidirectional, _ = args
    states = list(hx) if kind == "lstm" else [hx]
    tensors = [inputs, *states, *params]
    if any(not isinstance(t, torch.Tensor) for t in tensors) or inputs.dim() != 3:
        return False
    if inputs.dtype not in _DTYPES or any(
        t.dtype != inputs.dtype or t.device != inputs.device for t in tensors
    ):
        return False
    if torch.is_autocast_enabled("cpu") or torch.is_autocast_enabled("cuda"):
        return False
    per_layer = 4 if has_biases else 2
    if len(params) != num_layers * (2 if bidirectional else 1) * per_layer:
        return False  # projections (proj_size) add a weight per layer
    hidden = params[1].shape[1]
    return all(t.shape[-1] == hidden for t in states) and (
        params[1].shape[0] == CELLS[kind].gates * hidden
    )


_lock = threading.Lock()
_installed: dict = {"count": 0, "saved": None, "mode": ()}


def install(mode_type: type) -> None:
    """Route the recurrent layers' calls (`torch._VF.lstm`, `gru`, `rnn_tanh`, `rnn_relu`)
    through `layers`, and their cells' (`lstm_cell`, ...) through `cell`, while any portable
    mode (an instance of `mode_type`) is entered; every call checks that such a mode is the
    innermost one of its thread."""
    import os

    from twice.core.protocol import ChildSettings

    vf = torch._VF
    with _lock:
        _installed["count"] += 1
        _installed["mode"] = mode_type
        if _installed["count"] > 1 or ChildSettings.read(os.environ, "no_fused_rnn"):
            return
        saved = {name: vf.__dict__.get(name) for name in (*_KINDS, *_CELLS)}
        _installed["saved"] = saved
        for name in saved:
            setattr(vf, name, _fused(name, saved[name] or getattr(vf, name)))


def _fused(name: str, original):
    run, kind = (cell, _CELLS[name]) if name in _CELLS else (layers, name)

    def fused(*args, **kwargs):
        if kwargs:
            return original(*args, **kwargs)
        return run(kind, original, *args)

    return fused


def uninstall() -> None:
    """Undo one `install`; the last restores `torch._VF`'s functions."""
    vf = torch._VF
    with _lock:
        if _installed["count"] == 0:
            return
        _installed["count"] -= 1
        if _installed["count"] or _installed["saved"] is None:
            return
        saved, _installed["saved"] = _installed["saved"], None
        for kind, function in saved.items():
            if function is None:
                vf.__dict__.pop(kind, None)
            else:
                setattr(vf, kind, function)
