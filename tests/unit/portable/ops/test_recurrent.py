"""ops/recurrent: nn.LSTM, nn.GRU and nn.RNN as one autograd operation per layer and
direction: their outputs, final states and the gradients of the input, the initial states
and the input weights and bias equal, bit for bit, what the op-by-op route
(TWICE_NO_FUSED_RNN=1) computes, for generated layer shapes and settings; the recurrent
weight's and bias's gradients are exact sums rounded once and close to the op-by-op ones.
Their cells (nn.LSTMCell, nn.GRUCell, nn.RNNCell: lstm_cell, gru_cell, rnn_tanh_cell,
rnn_relu_cell) as one operation per call: every output and gradient equals the op-by-op
route's, bit for bit."""

import contextlib
import math
import threading

import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from twice.portable.dispatch.mode import PortableMode
from twice.portable.ops import recurrent
from unit.portable.bits import (
    EXAMPLES,
    RNN_CASES,
    rnn_route,
    rnn_run,
    same_bits,
)

# a single float64 step whose input gradient autograd forms as the transposed product; a GRU's
# hidden state that also feeds the loss (three gradients added into it, in autograd's order)
_GRU_STEP = {
    "kind": "gru", "layers": 1, "bidirectional": False, "batch_first": False, "bias": False,
    "inputs": 1, "hidden": 5, "steps": 1, "batch": 1, "dtype": torch.float64, "dropout": 0.0,
    "loss": "final", "scale": 1e-3,
}  # fmt: skip


@EXAMPLES
@example(case=_GRU_STEP)
@example(case=dict(_GRU_STEP, bidirectional=True, loss="all"))
@given(case=RNN_CASES)
def test_fused_recurrent_layers_give_the_op_by_op_bits(case):
    fused = rnn_run(case, True)
    plain = rnn_run(case, False)
    assert fused.keys() == plain.keys()
    for name in fused:
        a, b = fused[name], plain[name]
        assert (a is None) == (b is None), name
        if a is None:
            continue
        if name.startswith(("weight_hh", "bias_hh")):
            # one exact sum over every step, rounded once, against one rounding per step
            tolerance = 1e-12 if a.dtype == torch.float64 else 1e-5
            assert torch.allclose(a, b, rtol=tolerance, atol=tolerance * b.abs().max()), name
        else:
            assert same_bits(a, b), name


def test_the_fused_path_is_taken_and_its_recurrent_gradient_is_one_rounding():
    """The recurrent weight's gradient is the exact product of every step's gate gradients
    and hidden states, rounded once: against float64 it is at least as close as the op-by-op
    route's per-step rounding, and it differs from it (so the fused path ran)."""
    case = dict(
        layers=1, bidirectional=False, batch_first=True, bias=True, inputs=5, hidden=8,
        steps=12, batch=6, dtype=torch.float32, dropout=0.0, loss="output", scale=1.0,
    )  # fmt: skip
    fused = rnn_run(case, True)["weight_hh_l0"]
    plain = rnn_run(case, False)["weight_hh_l0"]
    reference = rnn_run(dict(case, dtype=torch.float64), False)["weight_hh_l0"]
    assert not torch.equal(fused, plain)
    error = (fused.double() - reference).abs().max()
    assert error <= (plain.double() - reference).abs().max() * 1.5


def test_the_fused_lstm_does_not_depend_on_the_thread_count():
    case = dict(
        layers=2, bidirectional=True, batch_first=True, bias=True, inputs=16, hidden=32,
        steps=6, batch=8, dtype=torch.float32, dropout=0.2, loss="all", scale=1.0,
    )  # fmt: skip
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = rnn_run(case, True)
        torch.set_num_threads(2)
        two = rnn_run(case, True)
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(one[k], two[k]) for k in one)


@pytest.mark.parametrize("loss", ["all", "cell_only"])
def test_non_finite_values_give_the_op_by_op_nans_and_infinities(loss):
    """With only the cell state used, no gradient reaches the last hidden state: the output
    gate's gradient is 0 there, not 0 times a NaN."""
    case = dict(
        layers=2, bidirectional=False, batch_first=False, bias=True, inputs=3, hidden=4,
        steps=4, batch=3, dtype=torch.float32, dropout=0.0, loss=loss, scale=1.0,
    )  # fmt: skip
    spoil = {(1, 0, 0): math.inf, (2, 1, 1): math.nan}  # saturates the gates; spreads
    fused = rnn_run(case, True, spoil)
    plain = rnn_run(case, False, spoil)
    assert fused["y"][2:, 1].isnan().all() and not fused["y"][:, 0].isnan().any()
    names = ("y", "h_n", "c_n", "x", "h0", "c0", "weight_ih_l0")
    for name in names + (("weight_hh_l1", "bias_hh_l1") if loss == "cell_only" else ()):
        assert same_bits(fused[name], plain[name]), name


@pytest.mark.parametrize("layer", [torch.nn.LSTM, torch.nn.GRU, torch.nn.RNN])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_a_second_derivative_goes_through_the_op_by_op_layer(layer, bidirectional):
    """A gradient penalty through a recurrent layer: the first derivative under create_graph is the
    op-by-op route's, bit for bit; the second is close to it (its path back through the layer's
    output takes the fused backward, whose recurrent sums round once)."""

    def penalty(fused: bool):
        with rnn_route(fused):
            torch.manual_seed(0)
            model = layer(3, 4, num_layers=2, bidirectional=bidirectional)
            x = torch.randn(5, 2, 3, requires_grad=True)
            with PortableMode("strict"):
                (grad,) = torch.autograd.grad((model(x)[0] ** 2).sum(), x, create_graph=True)
                (grad * grad).sum().backward()
        return grad.detach(), [x.grad, *(p.grad for p in model.parameters())]

    (first, second), (first_op, second_op) = penalty(True), penalty(False)
    assert torch.equal(first, first_op)
    for a, b in zip(second, second_op):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-5 * b.abs().max())


def test_what_the_fused_path_does_not_take_runs_op_by_op_under_strict(monkeypatch):
    """Projections, packed sequences and autocast leave the fused path (no fused layer runs);
    each still trains under strict. A plain call takes it."""
    from torch.nn.utils.rnn import pack_padded_sequence

    fused = []
    apply = recurrent.RecurrentLayer.apply
    monkeypatch.setattr(
        recurrent.RecurrentLayer, "apply", lambda *args: fused.append(args[0]) or apply(*args)
    )
    projected = torch.nn.LSTM(4, 6, proj_size=3, batch_first=True)
    lstm, gru = torch.nn.LSTM(4, 6, batch_first=True), torch.nn.GRU(4, 6, batch_first=True)
    x = torch.randn(3, 5, 4)
    with PortableMode("strict"):
        projected(x)[0].sum().backward()
        for layer in (lstm, gru):
            packed = pack_padded_sequence(x, [5, 3, 2], batch_first=True)
            layer(packed)[0].data.sum().backward()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                layer(x)[0].float().sum().backward()
        assert fused == []
        gru(x)[0].sum().backward()
    assert fused == ["gru"]
    assert projected.weight_hr_l0.grad is not None and lstm.weight_hh_l0.grad is not None


def test_install_restores_torch_and_other_threads_see_the_original():
    kinds = ("lstm", "gru", "rnn_tanh", "rnn_relu")
    before = {name: getattr(torch._VF, name) for k in kinds for name in (k, f"{k}_cell")}
    seen = {}

    def original(*args):
        return "op by op"

    with PortableMode("strict"):
        with PortableMode("strict"):  # nested entries install once
            assert all(getattr(torch._VF, k) is not f for k, f in before.items())

        def other():  # no portable mode in this thread: the fused path declines
            x, h = torch.zeros(1, 1, 1), torch.zeros(1, 1, 1)
            weights = [torch.zeros(3, 1)] * 2
            seen["call"] = recurrent.layers("gru", original, x, h, weights, False, 1, 0.0,
                                            False, False, False)  # fmt: skip

        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
        assert all(getattr(torch._VF, k) is not f for k, f in before.items())
    assert all(getattr(torch._VF, k) is f for k, f in before.items())
    assert seen["call"] == "op by op"


CELL_CASES = st.fixed_dictionaries(
    {
        "kind": st.sampled_from(["lstm", "gru", "rnn_tanh", "rnn_relu"]),
        "bias": st.booleans(),
        "inputs": st.integers(1, 6),
        "hidden": st.integers(1, 7),
        "batch": st.integers(0, 4),  # 0: one unbatched sample
        "steps": st.integers(1, 5),
        "stacked": st.booleans(),  # a second cell on the first one's hidden state
        "dtype": st.sampled_from([torch.float32, torch.float64]),
        "scale": st.sampled_from([1e-3, 1.0, 30.0]),
        "state": st.sampled_from(["zeros", "given", "leaf"]),
        "spoil": st.sampled_from([None, None, math.inf, math.nan]),
        "loss": st.sampled_from(["last", "all", "cell"]),
    }
)


def _cell_run(case: dict, fused: bool) -> dict[str, torch.Tensor]:
    """A loop of cells (time_sequence_prediction's shape) trained one step under strict
    portable mode, fused or op by op: every state it made and every gradient, by name."""
    with rnn_route(fused):
        torch.manual_seed(0)
        kind, dtype, hidden = case["kind"], case["dtype"], case["hidden"]
        make = {"lstm": torch.nn.LSTMCell, "gru": torch.nn.GRUCell}.get(kind)
        extra = {} if make else {"nonlinearity": kind[4:]}
        make = make or torch.nn.RNNCell
        cells = [make(case["inputs"], hidden, bias=case["bias"], **extra)]
        cells += [make(hidden, hidden, bias=case["bias"], **extra)] if case["stacked"] else []
        cells = [c.to(dtype) for c in cells]
        lead = (case["batch"],) if case["batch"] else ()
        x = torch.randn(case["steps"], *lead, case["inputs"], dtype=dtype) * case["scale"]
        if case["spoil"] is not None:
            x[0].view(-1)[0] = case["spoil"]
        x.requires_grad_()
        h0 = torch.randn(*lead, hidden, dtype=dtype).requires_grad_(case["state"] == "leaf")
        states = [None if case["state"] == "zeros" else (h0, h0 * 0.5) if kind == "lstm" else h0]
        states = states * len(cells)
        made = []
        with PortableMode("strict"):
            for t in range(case["steps"]):
                inp = x[t]
                for i, c in enumerate(cells):
                    states[i] = c(inp, states[i])
                    inp = states[i][0] if kind == "lstm" else states[i]
                    made.append(states[i])
            flat = [s for m in made for s in (m if isinstance(m, tuple) else (m,))]
            loss = {
                "last": lambda: flat[-1].sum(),
                "all": lambda: sum((s * s).sum() for s in flat),
                "cell": lambda: (flat[-1] * flat[0]).sum(),
            }[case["loss"]]()
            loss.backward()
    out = {f"state{i}": s.detach() for i, s in enumerate(flat)}
    out.update({"x": x.grad, "h0": h0.grad})
    out.update({f"{i}.{n}": p.grad for i, c in enumerate(cells) for n, p in c.named_parameters()})
    return out


@EXAMPLES
@example(
    case={
        "kind": "gru",
        "bias": False,
        "inputs": 1,
        "hidden": 1,
        "batch": 1,
        "steps": 2,
        "stacked": False,
        "dtype": torch.float64,
        "scale": 1e-3,
        "state": "zeros",
        "spoil": None,
        "loss": "all",
    }  # fmt: skip
)
@given(case=CELL_CASES)
def test_fused_cells_give_the_op_by_op_bits_for_every_output_and_gradient(case):
    fused, plain = _cell_run(case, True), _cell_run(case, False)
    assert fused.keys() == plain.keys()
    for name in fused:
        a, b = fused[name], plain[name]
        assert (a is None) == (b is None), name
        assert a is None or same_bits(a, b), name


def test_a_cell_call_is_one_fused_operation_and_what_it_does_not_take_runs_as_torch(monkeypatch):
    fused = []
    apply = recurrent.RecurrentLayer.apply
    monkeypatch.setattr(
        recurrent.RecurrentLayer, "apply", lambda *args: fused.append(args[0]) or apply(*args)
    )
    lstm, gru = torch.nn.LSTMCell(3, 4), torch.nn.GRUCell(3, 4)
    x = torch.randn(2, 3)
    with PortableMode("strict"):
        lstm(x)[0].sum().backward()
        gru(x[0]).sum().backward()  # unbatched: the module adds the batch dimension
        assert fused == ["lstm", "gru"]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            lstm(x)[0].float().sum().backward()
        lstm.double()(x.double(), (torch.zeros(2, 4), torch.zeros(2, 4)))  # mixed dtypes
        with pytest.raises(RuntimeError):
            torch._VF.gru_cell(x, torch.zeros(2, 5), *gru.parameters())  # torch's own error
        assert fused == ["lstm", "gru"]


@pytest.mark.parametrize("reuse", ["state", "input", "both"])
def test_a_second_derivative_through_cells_is_torchs(reuse):
    """A gradient penalty through two cell calls, the second fed the first one's state, its
    hidden state as input, or both (one tensor reaching a call twice): the first derivative is
    the op-by-op route's bits; the second is as close to torch's own (float64, no portable
    mode) as the op-by-op route's."""

    def penalty(route: str):
        with rnn_route(route == "fused"):
            torch.manual_seed(0)
            cell = torch.nn.LSTMCell(3, 4).double()
            x = torch.randn(5, 3, requires_grad=True, dtype=torch.float64)
            z = torch.randn(5, 3, dtype=torch.float64)
            with PortableMode("strict") if route != "torch" else contextlib.nullcontext():
                h, c = cell(x)
                h, c = cell(
                    z if reuse == "state" else h[:, :3], None if reuse == "input" else (h, c)
                )
                (grad,) = torch.autograd.grad((h**2).sum(), x, create_graph=True)
                (grad * grad).sum().backward()
        return grad.detach(), [x.grad, *(p.grad for p in cell.parameters())]

    (first, second), (first_op, second_op) = penalty("fused"), penalty("op by op")
    reference = penalty("torch")[1]
    assert same_bits(first, first_op)
    for a, b, r in zip(second, second_op, reference):
        scale = r.abs().max()
        assert (a - r).abs().max() <= max(4 * (b - r).abs().max(), 1e-15 * scale)


def _routes(run):
    """run() on the fused route and op by op (each in strict portable mode)."""
    out = []
    for fused in (True, False):
        with rnn_route(fused):
            torch.manual_seed(0)
            with PortableMode("strict"):
                out.append(run())
    return out


def test_cells_under_transforms_one_bias_and_saved_inputs_run_as_op_by_op():
    """What the fused Function has no rule for runs op by op (torch.func, forward-mode AD); a
    cell given one bias differentiates twice; an input no gradient needs may change before
    the backward, or be an inference tensor, as op by op."""
    from torch.func import grad, vmap

    def transforms():
        cell = torch.nn.GRUCell(3, 4)
        x, h = torch.randn(5, 3), torch.randn(5, 4)
        g = grad(lambda x: cell(x, h).sum())(x)
        v = vmap(lambda x: cell(x.unsqueeze(0), h[:1]).squeeze(0))(x)
        with torch.autograd.forward_ad.dual_level():
            dual = torch.autograd.forward_ad.make_dual(x, torch.ones_like(x))
            tangent = torch.autograd.forward_ad.unpack_dual(cell(dual, h)).tangent
        return g, v, tangent

    def one_bias():
        x = torch.randn(5, 3, requires_grad=True)
        w_ih, w_hh, b_ih = torch.randn(16, 3), torch.randn(16, 4), torch.randn(16)
        h, c = torch._VF.lstm_cell(x, (torch.zeros(5, 4), torch.zeros(5, 4)), w_ih, w_hh, b_ih)
        (first,) = torch.autograd.grad((h * h).sum(), x, create_graph=True)
        return (first,)

    def saved():
        cell = torch.nn.RNNCell(3, 4)
        cell.weight_ih.requires_grad_(False)
        with torch.inference_mode():
            frozen = torch.randn(5, 3)
        x, h = torch.randn(5, 3), torch.randn(5, 4, requires_grad=True)
        out = cell(x, h) + cell(frozen, h)
        x.copy_(torch.randn(5, 3))  # refilled before the backward: no gradient needs it
        out.sum().backward()
        return (h.grad, cell.weight_hh.grad)

    def state_refilled():
        # a GRU (layer and cell) whose recurrent weight is frozen keeps no h0 for the backward,
        # so h0 may be refilled in place (a stateful loop), or made in inference mode
        layer, cell = torch.nn.GRU(3, 4), torch.nn.GRUCell(3, 4)
        layer.weight_hh_l0.requires_grad_(False)
        cell.weight_hh.requires_grad_(False)
        x = torch.randn(5, 2, 3, requires_grad=True)
        h = torch.zeros(1, 2, 4)
        with torch.inference_mode():
            frozen = torch.zeros(2, 4)
        _, h_n = layer(x, h)
        h.copy_(h_n.detach())
        out = cell(x[0], frozen)
        (h_n.sum() + out.sum()).backward()
        return (x.grad, layer.weight_ih_l0.grad, cell.weight_ih.grad)

    for run in (transforms, one_bias, saved, state_refilled):
        fused, plain = _routes(run)
        assert all(same_bits(a, b) for a, b in zip(fused, plain)), run.__name__


def test_a_cell_given_a_0_dimensional_input_raises_torchs_error():
    cell = torch.nn.GRUCell(3, 4)
    args = (torch.tensor(1.0), torch.zeros(1, 4), *cell.parameters())
    with pytest.raises((IndexError, RuntimeError)) as plain:
        torch._VF.gru_cell(*args)
    with PortableMode("strict"), pytest.raises(plain.type) as ours:
        torch._VF.gru_cell(*args)
    assert str(ours.value) == str(plain.value)


def test_the_fused_path_takes_any_device_but_not_two():
    """A GPU's layer takes the fused path as a CPU's does (op by op, its weights' gradients
    would round once a step, as no CPU's do); tensors on two devices run as torch runs them.
    The predicate is checked on the meta device, the one other device here."""
    lstm = torch.nn.LSTM(4, 6, batch_first=True)
    params = [p.detach() for p in lstm._flat_weights]

    def args(x, params):
        states = (torch.zeros(1, 3, 6, device=x.device),) * 2
        return (x, states, params, True, 1, 0.0, True, False, True)

    with PortableMode("strict"):
        meta = [p.to("meta") for p in params]
        assert recurrent._fusable("lstm", args(torch.randn(3, 5, 4, device="meta"), meta))
        assert not recurrent._fusable("lstm", args(torch.randn(3, 5, 4, device="meta"), params))
        gru = torch.nn.GRUCell(4, 6)
        weights = [p.detach().to("meta") for p in (gru.weight_ih, gru.weight_hh, gru.bias_ih)]
        cell = (torch.randn(3, 4, device="meta"), torch.zeros(3, 6, device="meta"), *weights)
        assert recurrent._cell_fusable("gru", (*cell, gru.bias_hh.detach().to("meta")))
        assert not recurrent._cell_fusable("gru", (*cell, gru.bias_hh.detach()))
