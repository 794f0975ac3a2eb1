"""twice.numerics, the public face of record/numerics.py: `watch` stops at the op that made the
first NaN or Inf (the watch itself: tests/unit/record/test_numerics.py)."""

import pytest
import torch

import twice.numerics
from twice.record import numerics as recorded


def test_the_public_names_are_the_watchs_own():
    assert twice.numerics.watch is recorded.watch
    assert twice.numerics.NonFiniteError is recorded.NonFiniteError
    assert twice.numerics.NumericsWatch is recorded.NumericsWatch


def test_watch_stops_at_the_op_that_made_the_first_inf():
    with pytest.raises(twice.numerics.NonFiniteError) as caught:
        with twice.numerics.watch(mode="stop"):
            torch.log(torch.zeros(3)).sum()
    assert caught.value.report["fault"]["op"].startswith("aten::log")
    assert isinstance(caught.value, FloatingPointError)
