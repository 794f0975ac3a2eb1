"""native/rnn: the compiled LSTM step and cell give the torch fallback's bits."""

import pytest
import torch
from hypothesis import given

from twice.portable import native
from twice.portable.native import rnn as native_rnn
from unit.portable.bits import (
    EXAMPLES,
    RNN_CASES,
    rnn_run,
    same_bits,
)


@pytest.mark.skipif(not native.available(), reason="needs the compiled kernels")
@EXAMPLES
@given(case=RNN_CASES)
def test_the_compiled_cell_gives_the_fallbacks_bits(case):
    """Whole compiled steps (p_lstm_step), the compiled cell between separate cuts and scalings,
    and the torch operations one by one: the same bits."""
    taken, whole = [], native_rnn.Steps.forward
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(native_rnn.Steps, "forward", lambda *a: taken.append(1) or whole(*a))
        compiled = rnn_run(case, True)
    with pytest.MonkeyPatch.context() as patch:  # no whole steps
        patch.setattr(native_rnn.Steps, "__init__", lambda self, *a: setattr(self, "usable", 0))
        cells = rnn_run(case, True)
    with native.fallback():
        fallback = rnn_run(case, True)
    if case.get("kind", "lstm") == "lstm" and case["dtype"] == torch.float32:
        assert taken  # the whole steps ran
    for name, value in compiled.items():
        for other in (cells, fallback):
            assert (value is None) == (other[name] is None), name
            assert value is None or same_bits(value, other[name]), name
