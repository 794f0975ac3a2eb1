"""record/guard: an error of twice's own in an event handler stops the capture, never the
training; the time spent in handlers is the recorder's cost."""

import json
import time
import warnings

import pytest
import torch

from twice.record.guard import costed
from twice.store import layout
from unit.record.loops import train


def test_an_error_in_the_capture_stops_the_capture_not_the_training(tmp_path):
    """A parameter twice cannot read (here on the meta device, which holds no data) makes the
    capture stop with a warning and capture_error.json; the loop runs to its end."""

    def meta_model():
        model = torch.nn.Linear(3, 1, device="meta")
        return (
            [model],
            [torch.optim.SGD(model.parameters(), lr=0.1)],
            lambda step: model(torch.randn(2, 3, device="meta")).sum(),
        )

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        records = train(tmp_path, meta_model, steps=3, name="meta")
    assert records == []
    error = json.loads((tmp_path / "meta" / layout.CAPTURE_ERROR).read_text())
    assert error["step"] == 0 and error["handler"] == "pre_step" and "meta tensor" in error["error"]
    assert any("step capture stopped at step 0" in str(w.message) for w in caught)


def test_the_time_spent_in_a_costed_handler_is_added_even_when_it_raises():
    class Handler:
        cost = 0.0

        @costed
        def on_event(self, seconds, fail=False):
            time.sleep(seconds)
            if fail:
                raise ValueError("handler failed")
            return "done"

    handler = Handler()
    assert handler.on_event(0.02) == "done" and Handler.on_event.__name__ == "on_event"
    assert 0.02 <= handler.cost < 1.0
    with pytest.raises(ValueError):
        handler.on_event(0.02, fail=True)
    assert handler.cost >= 0.04
