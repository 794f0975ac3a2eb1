"""record/opargs: an operation's tensors and Python numbers, found in its arguments."""

import torch

from twice.record.opargs import op_scalars, op_tensors


def test_numbers_are_given_exactly_in_order_and_tensors_skipped():
    lr = 0.1
    assert op_scalars((torch.ones(1), lr, 3, True, "name", None), {}) == [lr.hex(), "3", "True"]
    assert op_scalars((torch.ones(1),), {"alpha": -1e-3, "out": None}) == [(-1e-3).hex()]
    assert op_scalars((), {}) == []


def test_tensors_are_found_however_deep_in_order():
    a, b, c, d = (torch.full((1,), float(i)) for i in range(4))
    assert op_tensors(a)[0] is a
    assert op_tensors((a, 1.0, b)) == [a, b]
    found = op_tensors((a, [b, {"x": c}], (d,), "no"))
    assert [float(t) for t in found] == [0.0, 1.0, 2.0, 3.0]
    assert op_tensors(None) == [] and op_tensors(()) == []
