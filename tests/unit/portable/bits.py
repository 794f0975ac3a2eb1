"""What the portable-mode tests share: bit equality with NaNs matched by position, the values the
elementwise kernels are tried on, a call with and without the compiled kernels, and the generated
recurrent-layer and convolution cases (TWICE_EXHAUSTIVE=1 draws many more)."""

from __future__ import annotations

import contextlib
import math
import os

import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st

from twice.portable import native
from twice.portable.dispatch.mode import PortableMode

F64 = torch.float64
NO_FUSED_RNN = "TWICE_NO_FUSED_RNN"  # core/protocol.py's ChildSettings.no_fused_rnn
needs_native = pytest.mark.skipif(not native.available(), reason="twice._native was not built")

EXHAUSTIVE = os.environ.get("TWICE_EXHAUSTIVE") == "1"
EXAMPLES = settings(max_examples=200 if EXHAUSTIVE else 12, derandomize=True, deadline=None)


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Byte equality, NaNs included (their positions; portable NaNs are canonical, but their
    payloads are not compared), and the sign of every zero (torch.equal holds -0 == +0)."""
    if not (a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.isnan(), b.isnan())):
        return False
    if not torch.equal(torch.nan_to_num(a, 7.0), torch.nan_to_num(b, 7.0)):
        return False
    if a.is_complex():
        return same_bits(torch.view_as_real(a), torch.view_as_real(b))
    return not a.is_floating_point() or torch.equal(
        a.signbit() & ~a.isnan(), b.signbit() & ~b.isnan()
    )


def values(seed=0) -> torch.Tensor:
    g = gen(seed)
    specials = [0.0, -0.0, 1e-300, -5e-324, 700.0, -740.0, 800.0, -800.0, 1.0, -1.0, 0.5, 6.0]
    specials += [5.99, -6.5, 1e-10, math.inf, -math.inf, math.nan, 0.3465, 20.0, -20.0]
    return torch.cat(
        [
            torch.randn(4000, generator=g, dtype=F64) * 4,
            torch.rand(4000, generator=g, dtype=F64) * 40 - 20,
            torch.tensor(specials, dtype=F64),
        ]
    )


def both(fn):
    """fn() with the compiled kernels, and with torch operations only."""
    fast = fn()
    with native.fallback():
        slow = fn()
    return fast, slow


def compiled_kernels(on: bool):
    """The compiled kernels where `on`, else torch operations only."""
    return contextlib.nullcontext() if on else native.fallback()


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
        "loss": st.sampled_from(["output", "final", "all", "cell", "cell_only"]),
        "scale": st.sampled_from([1e-3, 1.0, 30.0]),
    }
)


@contextlib.contextmanager
def rnn_route(fused: bool):
    """The recurrent layers and cells on the fused path, or op by op (TWICE_NO_FUSED_RNN=1),
    for the portable modes entered inside."""
    with pytest.MonkeyPatch.context() as patch:
        if fused:
            patch.delenv(NO_FUSED_RNN, raising=False)
        else:
            patch.setenv(NO_FUSED_RNN, "1")
        yield


def rnn_run(case: dict, fused: bool, spoil=None) -> dict[str, torch.Tensor]:
    """Train one recurrent layer of `case` a step under strict portable mode, on the fused path
    or op by op: its outputs, final states and every gradient, by name."""
    with rnn_route(fused):
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
            "cell_only": lambda: (c_n * 0.5).sum(),  # no gradient reaches the last h
            "all": lambda: (y * y).sum() + h_n.sum() + (c_n * c_n).sum(),
        }[case["loss"]]()
        loss.backward()
    out = {"y": y, "h_n": h_n, "c_n": c_n, "x": x.grad, "h0": h0.grad, "c0": c0.grad}
    out.update({name: p.grad for name, p in model.named_parameters()})
    return out


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
