"""The op-log comparison on plain records: the first op where two steps differ, and by how
much two tensors differ."""

import torch

from twice.core.opdiff import first_op_difference, value_gap


def op(name, inputs, outputs):
    return {"op": name, "in": inputs, "out": outputs, "phase": "forward"}


def test_op_comparison_tells_operation_input_and_sequence_apart():
    base = [op("mm", ["x", "w"], ["h"]), op("relu", ["h"], ["r"]), op("sum", ["r"], ["s"])]
    noisy = [op("mm", ["x", "w"], ["h"]), op("relu", ["h"], ["r2"]), op("sum", ["r2"], ["s2"])]
    assert (
        first_op_difference(base, noisy).kind == "operation"
        and first_op_difference(base, noisy).index == 1
    )
    other_data = [
        op("mm", ["x2", "w"], ["h2"]),
        op("relu", ["h2"], ["r2"]),
        op("sum", ["r2"], ["s2"]),
    ]
    found = first_op_difference(base, other_data)
    assert found.kind == "input" and found.index == 0 and found.inputs == [0]
    branch = [op("mm", ["x", "w"], ["h"]), op("tanh", ["h"], ["t"])]
    assert (
        first_op_difference(base, branch).kind == "sequence"
        and first_op_difference(base, branch).index == 1
    )
    assert first_op_difference(base, base[:2]).kind == "sequence"
    assert first_op_difference(base, list(base)).kind == "identical"


def test_value_gap_measures_abs_and_ulps():
    x = torch.tensor([1.0, 2.0, 3.0])
    y = x.clone()
    y[1] = torch.nextafter(y[1], torch.tensor(10.0))
    gap = value_gap(x, y)
    assert gap["max_ulps"] == 1 and gap["elements_differing"] == 1 and gap["max_abs"] == 2.0**-22
