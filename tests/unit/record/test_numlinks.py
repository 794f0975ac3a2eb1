"""record/numlinks: the middle links of a NaN's story, the zero gradients and the 0/0, in words."""

import torch

from twice.record import hooks
from twice.record.health import Event
from twice.record.numlinks import name_operands, zero_gradients
from twice.record.recorder import Recorder


def test_a_division_event_says_what_it_divided_as_written(tmp_path):
    source = tmp_path / "train.py"
    source.write_text("import torch\ng = p.grad / p.grad.norm()\n")
    event = Event("div_by_zero", 3, "0/0 in aten::div", line=f"{source}:2")
    name_operands(event, torch.zeros(4))
    assert event.summary == (
        "0/0 in aten::div: `p.grad.norm()` is zero and `p.grad` is all zero: 0/0 is NaN"
    )
    assert event.details == {"numerator": "p.grad", "denominator": "p.grad.norm()"}
    some = Event("div_by_zero", 3, "x", line=f"{source}:2")
    name_operands(some, torch.tensor([0.0, 1.0, 0.0]))
    assert some.summary == "x: `p.grad.norm()` is zero and `p.grad` holds 2 exact zeros: 0/0 is NaN"
    unread = Event("div_by_zero", 3, "x", line=f"{source}:1")  # no division on that line
    name_operands(unread, torch.zeros(1))
    assert unread.summary == "x" and unread.details == {}


def test_the_zero_and_vanishing_gradients_are_named(tmp_path):
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    hooks.install(Recorder(tmp_path))
    try:
        model(torch.zeros(3, 2)).sum().backward()  # the weight's gradient is exactly zero
        optimizer.step()
        event = zero_gradients(0, None, None)
        assert event.details == {
            "parameters": ["weight"],
            "exactly_zero": ["weight"],
            "vanishing": [],
        }
        assert (
            event.summary == "the gradients of `weight` are exactly zero at step 0 (every element)"
        )
        model.weight.grad.fill_(1e-45)  # subnormal: its squares underflow
        vanishing = zero_gradients(1, None, None)
        assert vanishing.details["vanishing"] == ["weight"] and "vanishing" in vanishing.summary
        # the gradient an op overwrote is judged as it was before
        before = torch.zeros_like(model.bias.grad)
        both = zero_gradients(2, model.bias.grad, before)
        assert both.details["exactly_zero"] == ["bias"] and both.details["vanishing"] == ["weight"]
        model.weight.grad.fill_(1.0)
        assert zero_gradients(3, None, None) is None
    finally:
        hooks.uninstall()
