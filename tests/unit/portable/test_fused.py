"""Portable mode's fused paths give the op-by-op route's bits where they say they do.

nn.LSTM, nn.GRU and nn.RNN run as one autograd operation per layer and direction
(twice.portable.ops.recurrent): their outputs, final states and the gradients of the input, the
initial states and the input weights and bias must equal, bit for bit, what the op-by-op route
(TWICE_NO_FUSED_RNN=1) computes, for generated layer shapes and settings; the recurrent
weight's and bias's gradients are exact sums rounded once and must be close to the op-by-op
ones. A convolution unfolds a few samples at a time (conv.COLUMN_CHUNK): any chunk size gives
the same bits. exact.Repeated gives exact_matmul's bits with one operand cut into slices once.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from twice.portable import native
from twice.portable.arithmetic.exact import Repeated, exact_matmul
from twice.portable.dispatch.mode import PortableMode
from twice.portable.native import conv as native_conv
from twice.portable.native import rnn as native_rnn
from twice.portable.ops import conv as pconv
from twice.portable.ops import recurrent

NO_FUSED_RNN = "TWICE_NO_FUSED_RNN"  # core/protocol.py's ChildSettings.no_fused_rnn

EXHAUSTIVE = os.environ.get("TWICE_EXHAUSTIVE") == "1"
EXAMPLES = settings(max_examples=200 if EXHAUSTIVE else 12, derandomize=True, deadline=None)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-equal, NaNs matched by position (their payloads are not canonical)."""
    return torch.equal(a.isnan(), b.isnan()) and torch.equal(
        torch.nan_to_num(a, nan=7.0), torch.nan_to_num(b, nan=7.0)
    )


RNN_CASES = st.fixed_dictionaries(
    {
        "kind": st.sampled_from(["lstm", "gru", "rnn_tanh", "rnn_relu"]),
        "layers": st.integers(1, 2),
        "bidirectional": st.booleans(),
        "batch_first": st.booleans(),
        "bias": st.booleans(),
        "inputs": st.integers(1, 6),
        "hidden": st.integers(1, 7),
        "steps": st.integers(1, 5),
        "batch": st.integers(1, 4),
        "dtype": st.sampled_from([torch.float32, torch.float64]),
        "dropout": st.sampled_from([0.0, 0.0, 0.3]),
        "loss": st.sampled_from(["output", "final", "all", "cell"]),
        "scale": st.sampled_from([1e-3, 1.0, 30.0]),
    }
)


def _rnn_run(case: dict, fused: bool, spoil=None) -> dict[str, torch.Tensor]:
    with pytest.MonkeyPatch.context() as patch:
        if fused:
            patch.delenv(NO_FUSED_RNN, raising=False)
        else:
            patch.setenv(NO_FUSED_RNN, "1")
        return _rnn_train(dict({"kind": "lstm"}, **case), spoil or {})


def _rnn_train(case: dict, spoil: dict) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    kind = case["kind"]
    layer = {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU}.get(kind, torch.nn.RNN)
    extra = {"nonlinearity": kind[4:]} if kind.startswith("rnn") else {}
    model = layer(
        case["inputs"], case["hidden"], num_layers=case["layers"], bias=case["bias"],
        batch_first=case["batch_first"], bidirectional=case["bidirectional"],
        dropout=case["dropout"] if case["layers"] > 1 else 0.0, **extra,
    ).to(case["dtype"])  # fmt: skip
    directions = 2 if case["bidirectional"] else 1
    shape = (case["batch"], case["steps"])
    shape = shape if case["batch_first"] else shape[::-1]
    x = torch.randn(*shape, case["inputs"], dtype=case["dtype"]) * case["scale"]
    for where, value in spoil.items():
        x[where] = value
    x.requires_grad_()
    states = (case["layers"] * directions, case["batch"], case["hidden"])
    h0 = torch.randn(states, dtype=case["dtype"]).requires_grad_()
    c0 = torch.randn(states, dtype=case["dtype"]).requires_grad_()
    with PortableMode("strict"):
        torch.manual_seed(1)  # the dropout's key
        if kind == "lstm":
            y, (h_n, c_n) = model(x, (h0, c0))
        else:
            (y, h_n), c_n = model(x, h0), h0 * 2.0  # no cell state: a stand-in the loss can use
        loss = {
            "output": lambda: (y * y).sum(),
            "final": lambda: h_n.sum(),
            "cell": lambda: (c_n * 0.5).sum() + (h_n * 0.0).sum(),
            "all": lambda: (y * y).sum() + h_n.sum() + (c_n * c_n).sum(),
        }[case["loss"]]()
        loss.backward()
    out = {"y": y, "h_n": h_n, "c_n": c_n, "x": x.grad, "h0": h0.grad, "c0": c0.grad}
    out.update({name: p.grad for name, p in model.named_parameters()})
    return out


@EXAMPLES
@given(case=RNN_CASES)
def test_fused_recurrent_layers_give_the_op_by_op_bits(case):
    fused = _rnn_run(case, True)
    plain = _rnn_run(case, False)
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
            assert _same(a, b), name


@pytest.mark.skipif(not native.available(), reason="needs the compiled kernels")
@EXAMPLES
@given(case=RNN_CASES)
def test_the_compiled_cell_gives_the_fallbacks_bits(case):
    """Whole compiled steps (p_lstm_step), the compiled cell between separate cuts and scalings,
    and the torch operations one by one: the same bits."""
    taken, whole = [], native_rnn.Steps.forward
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(native_rnn.Steps, "forward", lambda *a: taken.append(1) or whole(*a))
        compiled = _rnn_run(case, True)
    with pytest.MonkeyPatch.context() as patch:  # no whole steps
        patch.setattr(native_rnn.Steps, "__init__", lambda self, *a: setattr(self, "usable", 0))
        cells = _rnn_run(case, True)
    with native.fallback():
        fallback = _rnn_run(case, True)
    if case.get("kind", "lstm") == "lstm" and case["dtype"] == torch.float32:
        assert taken  # the whole steps ran
    for name, value in compiled.items():
        for other in (cells, fallback):
            assert (value is None) == (other[name] is None), name
            assert value is None or _same(value, other[name]), name


def test_the_fused_path_is_taken_and_its_recurrent_gradient_is_one_rounding():
    """The recurrent weight's gradient is the exact product of every step's gate gradients
    and hidden states, rounded once: against float64 it is at least as close as the op-by-op
    route's per-step rounding, and it differs from it (so the fused path ran)."""
    case = dict(
        layers=1, bidirectional=False, batch_first=True, bias=True, inputs=5, hidden=8,
        steps=12, batch=6, dtype=torch.float32, dropout=0.0, loss="output", scale=1.0,
    )  # fmt: skip
    fused = _rnn_run(case, True)["weight_hh_l0"]
    plain = _rnn_run(case, False)["weight_hh_l0"]
    reference = _rnn_run(dict(case, dtype=torch.float64), False)["weight_hh_l0"]
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
        one = _rnn_run(case, True)
        torch.set_num_threads(2)
        two = _rnn_run(case, True)
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(one[k], two[k]) for k in one)


def test_non_finite_values_give_the_op_by_op_nans_and_infinities():
    case = dict(
        layers=2, bidirectional=False, batch_first=False, bias=True, inputs=3, hidden=4,
        steps=4, batch=3, dtype=torch.float32, dropout=0.0, loss="all", scale=1.0,
    )  # fmt: skip
    spoil = {(1, 0, 0): math.inf, (2, 1, 1): math.nan}  # saturates the gates; spreads
    fused = _rnn_run(case, True, spoil)
    plain = _rnn_run(case, False, spoil)
    assert fused["y"][2:, 1].isnan().all() and not fused["y"][:, 0].isnan().any()
    for name in ("y", "h_n", "c_n", "x", "h0", "c0", "weight_ih_l0"):
        assert _same(fused[name], plain[name]), name


@pytest.mark.parametrize("layer", [torch.nn.LSTM, torch.nn.GRU, torch.nn.RNN])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_a_second_derivative_goes_through_the_op_by_op_layer(layer, bidirectional):
    """A gradient penalty through a recurrent layer: the first derivative under create_graph is the
    op-by-op route's, bit for bit; the second is close to it (its path back through the layer's
    output takes the fused backward, whose recurrent sums round once)."""

    def penalty(fused: bool):
        with pytest.MonkeyPatch.context() as patch:
            if fused:
                patch.delenv(NO_FUSED_RNN, raising=False)
            else:
                patch.setenv(NO_FUSED_RNN, "1")
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
    before = {kind: getattr(torch._VF, kind) for kind in ("lstm", "gru", "rnn_tanh", "rnn_relu")}
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


def _compiled(on: bool):
    return contextlib.nullcontext() if on else native.fallback()


CONV_CASES = st.fixed_dictionaries(
    {
        "groups": st.sampled_from([1, 1, 2]),
        "batch": st.integers(1, 5),
        "cin": st.integers(1, 3),
        "cout": st.integers(1, 6),
        "kernel": st.tuples(st.integers(1, 3), st.integers(1, 3)),
        "stride": st.tuples(st.integers(1, 2), st.integers(1, 2)),
        "padding": st.tuples(st.integers(0, 3), st.integers(0, 1)),
        "dilation": st.tuples(st.integers(1, 2), st.integers(1, 2)),
        "size": st.tuples(st.integers(6, 10), st.integers(6, 21)),
        "dtype": st.sampled_from([torch.float32, torch.float64]),
        "spoil": st.sampled_from([None, None, math.inf, math.nan]),
        "spoil_weight": st.booleans(),
    }
)


@EXAMPLES
@given(case=CONV_CASES)
def test_a_convolution_has_the_same_bits_whatever_its_chunk(case):
    g = case["groups"]
    torch.manual_seed(0)
    scales = torch.logspace(-3, 3, case["batch"], dtype=case["dtype"]).reshape(-1, 1, 1, 1)
    x = torch.randn(case["batch"], g * case["cin"], *case["size"], dtype=case["dtype"]) * scales
    if case["spoil"] is not None:
        x[0, 0, 0, 0] = case["spoil"]
    w = torch.randn(g * case["cout"], case["cin"], *case["kernel"], dtype=case["dtype"])
    b = torch.randn(g * case["cout"], dtype=case["dtype"])
    settings_ = (case["stride"], case["padding"], case["dilation"], False, (0, 0), g)
    if case["spoil_weight"]:
        w[-1, 0, 0, 0] = math.inf
    results = []
    # the compiled kernels in cache; columns unfolded a sample at a time, or the whole batch in
    # one chunk (torch's float64 kernel for the input gradient); and the torch steps one by one
    routes = ((1, True, True), (1, True, False), (1 << 40, True, False), (1, False, False))
    kernels = ("forward", "weight_grad", "input_grad")
    seen = {name: [] for name in kernels}

    def spy(name, kernel=None):
        kernel = getattr(native_conv, name)

        def spied(*args):
            seen[name].append(kernel(*args))
            return seen[name][-1]

        return spied

    spies = {name: spy(name) for name in kernels}
    for chunk, compiled, in_cache in routes:
        with pytest.MonkeyPatch.context() as patch, _compiled(compiled):
            patch.setattr(pconv, "COLUMN_CHUNK", chunk)
            patch.setattr(pconv, "WHOLE_WEIGHT_GRAD", 2 * chunk)
            patch.setattr(native_conv, "INPUT_GRAD_CHANNELS", 1)  # any count takes it
            for name in kernels:
                patch.setattr(native_conv, name, spies[name] if in_cache else lambda *a: None)
            out = pconv.convolution(x, w, b, *settings_)
            grad = torch.linspace(-2, 2, out.numel(), dtype=out.dtype).reshape(out.shape)
            back = pconv.convolution_backward(grad, x, w, [w.shape[0]], *settings_, [True] * 3)
        results.append([out, *back])
    finite = case["spoil"] is None and not case["spoil_weight"]
    if native.available() and case["dtype"] == torch.float32 and finite:  # in cache, taken
        assert seen["forward"] and all(seen["forward"])
        assert g > 1 or all(t is not None for t in seen["weight_grad"])
        spread = [d * (k - 1) - p for d, k, p in zip(case["dilation"], case["kernel"],
                                                     case["padding"])]  # fmt: skip
        half = 2 * results[0][0][0, 0].numel() >= x[0, 0].numel()  # most taps inside
        if case["stride"] == (1, 1) and min(spread) >= 0 and half:
            assert seen["input_grad"] and all(t is not None for t in seen["input_grad"])
    for first, *others in zip(*results):
        assert all(_same(first, other) for other in others)
    # the weight's gradient, summed a few samples at a time on grids fixed over the batch, is
    # the one exact product of the whole batch's columns
    n, cout = x.shape[0], w.shape[0]
    columns = torch.nn.functional.unfold(x, case["kernel"], case["dilation"], case["padding"],
                                         case["stride"])  # fmt: skip
    k, length = columns.shape[1] // g, columns.shape[2]
    a = grad.reshape(n, g, cout // g, length).permute(1, 2, 0, 3).reshape(g, cout // g, -1)
    b = columns.reshape(n, g, k, length).permute(1, 0, 3, 2).reshape(g, n * length, k)
    assert _same(results[0][2], exact_matmul(a, b, x.dtype).reshape(w.shape))


@EXAMPLES
@given(
    rows=st.integers(1, 6),
    inner=st.integers(1, 9),
    cols=st.integers(1, 6),
    dtype=st.sampled_from([torch.float32, torch.float64]),
    spoil=st.sampled_from([None, math.inf, math.nan]),
)
def test_a_repeated_operand_gives_exact_matmuls_bits(rows, inner, cols, dtype, spoil):
    torch.manual_seed(rows * 100 + inner * 10 + cols)
    weight = torch.randn(inner, cols, dtype=dtype) * 10.0
    right, left = Repeated(weight, dtype, "right"), Repeated(weight.t(), dtype, "left")
    for step in range(3):
        a = torch.randn(rows, inner, dtype=dtype) * 10.0**step
        if spoil is not None and step == 1:
            a[0, 0] = spoil
        assert _same(right(a), exact_matmul(a, weight, dtype))
        assert _same(left(a.t()), exact_matmul(weight.t(), a.t(), dtype))


@pytest.mark.parametrize("side", ["left", "right"])
def test_a_repeated_operand_that_is_not_finite_falls_back_to_the_whole_product(side):
    weight = torch.randn(4, 4)
    weight[1, 2] = math.inf
    other = torch.randn(4, 4)
    repeated = Repeated(weight, torch.float32, side)
    got = repeated(other)
    want = exact_matmul(other, weight) if side == "right" else exact_matmul(weight, other)
    assert _same(got, want)


@pytest.mark.skipif(not native.available(), reason="needs the compiled kernels")
@pytest.mark.parametrize("spoil", [None, math.inf, math.nan])
def test_pooling_sums_cut_by_the_compiled_kernel_give_the_fallbacks_bits(spoil):
    torch.manual_seed(5)
    x = torch.randn(3, 4, 9, 11) * torch.logspace(-4, 4, 4).reshape(1, 4, 1, 1)
    x3 = torch.randn(2, 3, 5, 6, 7)
    if spoil is not None:
        x[1, 2, 3, 4] = spoil

    def pools():
        out = []
        for inp, pool in (
            (x, torch.nn.functional.avg_pool2d),
            (x3, torch.nn.functional.avg_pool3d),
        ):
            leaf = inp.clone().requires_grad_()
            with PortableMode("strict"):
                y = pool(leaf, 3, 2, 1, ceil_mode=True, count_include_pad=False)
                (grad,) = torch.autograd.grad(
                    y, leaf, torch.linspace(-1, 1, y.numel()).reshape(y.shape)
                )
            out += [y, grad]
        return out

    fast = pools()
    with native.fallback():
        slow = pools()
    assert all(_same(a, b) for a, b in zip(fast, slow))


@pytest.mark.skipif(not native.available(), reason="needs the compiled kernels")
@EXAMPLES
@given(case=CONV_CASES, first=st.integers(0, 2), seed=st.integers(0, 2**16))
def test_the_compiled_unfold_and_fold_give_the_torch_steps_bits(case, first, seed):
    """p_conv_forward cuts each column as unfold then p_split does; p_unfold is unfold then
    p_split on given units per row; p_fold_scale is conv.py's fold of integer columns, then the
    scaling and one rounding."""
    gen = torch.Generator().manual_seed(seed)
    channels, kernel = case["cin"] + first, case["kernel"]
    stride, padding, dilation = case["stride"], case["padding"], case["dilation"]
    shape = (case["batch"], channels, *case["size"])
    x = torch.randn(shape, generator=gen, dtype=case["dtype"])
    x = x * torch.exp2(torch.randint(-60, 60, shape, generator=gen)).to(case["dtype"])
    if case["spoil"] is not None:
        x.view(-1)[seed % x.numel()] = case["spoil"]
    w = torch.empty(1, channels, *kernel)
    out_hw = [pconv._out_size(case["size"][i], kernel[i], stride[i], padding[i], dilation[i])
              for i in (0, 1)]  # fmt: skip
    cols = pconv._columns(x, w, stride, padding, dilation)
    area = kernel[0] * kernel[1]
    beta = 1 + seed % 50
    want = native.split_rows(cols[first * area :], (-2,), beta)
    # the forward kernel's columns, through an identity weight into float64: integers * units
    rows, n = (channels - first) * area, case["batch"]
    eye, ones = torch.eye(rows, dtype=torch.float64), torch.ones(rows, dtype=torch.float64)
    out = torch.zeros(n, rows, out_hw[0] * out_hw[1], dtype=torch.float64)
    got = native.module().p_conv_forward(
        src=native.buffer(x), geometry=(*x.shape, *kernel, *stride, *padding, *dilation, *out_hw),
        c0=first, cc=channels - first, beta=beta, wints=native.buffer(eye),
        wunits=native.buffer(ones), m=rows, out=native.buffer(out), out_c=rows, co0=0,
    )  # fmt: skip
    assert got == (want is not False)
    if want:
        ((ints, units),) = want
        assert torch.equal(out, (ints * units).reshape(rows, n, -1).transpose(0, 1))
    if case["spoil"] is None:
        units = torch.exp2(torch.randint(-70, 70, (cols.shape[0],), generator=gen).double())
        given_ = native_conv.columns_given(x, kernel, stride, padding, dilation, out_hw, units)
        assert torch.equal(given_, native.split_given(cols, units))
    ints = torch.randint(-(2**40), 2**40, (case["batch"], channels * area, cols.shape[1] //
                         case["batch"]), generator=gen).double()  # fmt: skip
    unit_b = torch.exp2(torch.randint(-80, 20, (case["batch"],), generator=gen).double())
    folded = pconv._fold(ints, case["size"], kernel, dilation, padding, stride)
    want = (folded * (0.5 * unit_b.reshape(-1, 1, 1, 1))).to(case["dtype"])
    got = native_conv.fold_scaled(ints, case["size"], kernel, stride, padding, dilation, 0.5,
                                  unit_b, case["dtype"])  # fmt: skip
    assert torch.equal(got, want)


@pytest.mark.skipif(not native.available(), reason="needs the compiled kernels")
def test_torch_computes_the_input_gradient_only_with_a_kernel_of_sums_of_products(monkeypatch):
    """Torch's own float64 convolution backward takes the integer slices only where it would
    pick Slow2d or SlowDilated2d; any other kernel (Winograd, NNPACK, one torch adds later) is
    never asked, and the fold gives the same bits."""
    torch.manual_seed(3)
    x, w = torch.randn(4, 3, 9, 9), torch.randn(5, 3, 3, 3)
    grad = torch.randn(4, 5, 9, 9)
    settings_ = ([1, 1], [1, 1], [1, 1], False, [0, 0], 1, [True, False, False])
    calls = []
    real = torch.ops.aten.convolution_backward

    class Counting:
        def __call__(self, *args):
            calls.append(args[0].dtype)
            return real(*args)

    monkeypatch.setattr(torch.ops.aten, "convolution_backward", Counting())
    monkeypatch.setattr(native_conv, "input_grad", lambda *a: None)  # the route in cache off
    by_torch = pconv.convolution_backward(grad, x, w, None, *settings_)[0]
    assert calls == [torch.float64]  # torch's kernel took the integers
    for other in (torch._C._ConvBackend.Winograd3x3Depthwise, torch._C._ConvBackend.Mkldnn):
        calls.clear()
        monkeypatch.setattr(torch._C, "_select_conv_backend", lambda *a, other=other: other)
        by_fold = pconv.convolution_backward(grad, x, w, None, *settings_)[0]
        assert calls == []
        assert torch.equal(by_fold, by_torch)
