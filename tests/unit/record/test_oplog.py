"""record/oplog: the op log of a chosen step, every ATen operation with its module, line, phase
and the digests of what it read and wrote."""

import json

import pytest
import torch

from twice.record.oplog import OpLog, OpRecorder
from twice.store.oplogs import recorded_steps, step_ops


def _record_ops(folder, step=0):
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Tanh())
    with OpRecorder(step) as ops:
        model(torch.ones(4, 3)).sum().backward()
    log = OpLog(folder)
    ops.close()
    ops.write(log)
    log.close()


def test_op_logs_name_a_new_models_modules_right_in_the_same_process(tmp_path):
    """Module paths are cached by id: a model built where a freed one lived must not inherit its
    names (the Linear was once named after the freed model's Tanh)."""
    for attempt in range(5):
        torch.manual_seed(0)
        _record_ops(tmp_path / f"{attempt}a")
        torch.manual_seed(0)
        _record_ops(tmp_path / f"{attempt}b")
        for side in "ab":
            records = step_ops(tmp_path / f"{attempt}{side}", 0)
            assert {r["module"] for r in records if r["op"] == "aten::addmm"} == {"Sequential.0"}
            assert {r["module"] for r in records if r["op"] == "aten::tanh"} == {"Sequential.1"}


def test_a_recorded_steps_ops_read_back_with_names_phases_and_lines(tmp_path):
    _record_ops(tmp_path, 2)
    records = step_ops(tmp_path, 2)
    assert records and recorded_steps(tmp_path) == [2] and step_ops(tmp_path, 3) is None
    names = [r["op"] for r in records]
    assert "aten::tanh" in names and any(r["phase"] == "backward" for r in records)
    assert {r["module"] for r in records if r["op"] == "aten::tanh"} == {"Sequential.1"}
    assert all(
        r["line"] and r["line"].startswith("tests/unit/record/test_oplog.py:")
        for r in records
        if r["phase"] == "forward"
    )
    assert [r["i"] for r in records] == list(range(len(records)))


def test_op_log_digests_transposed_arguments_exactly_without_copying_them():
    from twice.core.digests import digest_tensor
    from twice.record.oplog import OpRecorder

    def log(weight):
        recorder = OpRecorder(0)
        with recorder:
            torch.mm(torch.ones(2, 3), weight.t())
        recorder.close()
        return next(r for r in recorder.records if r["op"] == "aten::mm")

    w = torch.arange(12.0).reshape(4, 3)
    nudged = w.clone()
    nudged[3, 2] = torch.nextafter(nudged[3, 2], torch.tensor(100.0))
    same, again, other = log(w), log(w.clone()), log(nudged)
    assert same["in"] == again["in"] and same["out"] == again["out"]
    assert same["in"][0] == other["in"][0] and same["in"][1] != other["in"][1]
    assert same["in"][0] == digest_tensor(
        torch.ones(2, 3)
    )  # contiguous arguments: the trace's digest


class HandSGD(torch.optim.Optimizer):
    """An optimizer written in user code: its ops have lines of their own."""

    def __init__(self, params):
        super().__init__(params, {"lr": 0.1})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                p.mul_(0.5)  # HAND-SGD-DECAY
                p.sub_(p.grad)  # HAND-SGD-UPDATE


@pytest.mark.parametrize(
    "optimizer_class", [torch.optim.Adam, HandSGD], ids=["torch.optim", "user code"]
)
def test_optimizer_ops_carry_the_line_they_come_from(tmp_path, optimizer_class):
    from pathlib import Path

    from twice.record import hooks
    from twice.store.oplogs import step_ops

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    optimizer = optimizer_class(model.parameters())
    hooks.install(hooks.Recorder(tmp_path, record_ops={1}))
    try:
        for _ in range(2):
            optimizer.zero_grad()
            model(torch.randn(4, 3)).sum().backward()
            optimizer.step()  # STEP-CALL
    finally:
        hooks.uninstall()
    source = Path(__file__).read_text().splitlines()
    lines = {
        source[int(op["line"].rsplit(":", 1)[1]) - 1].split("# ")[-1]
        for op in step_ops(tmp_path, 1)
        if op["phase"] == "optimizer"
    }
    expected = (
        {"STEP-CALL"}
        if optimizer_class is torch.optim.Adam
        else {"HAND-SGD-DECAY", "HAND-SGD-UPDATE"}
    )
    assert lines == expected


def test_op_records_are_written_as_json_that_reads_back_equal():
    from twice.record.oplog import _encode_record

    records = [
        {
            "i": 0,
            "op": "aten::mm",
            "phase": "forward",
            "in": [],
            "out": ["ab12"],
            "shapes": [[]],
            "dtypes": ["float32"],
            "module": None,
            "line": None,
        },
        {
            "i": 1,
            "op": "aten::mm",
            "phase": "backward",
            "in": ["a", "b"],
            "out": [],
            "shapes": [],
            "dtypes": [],
            "module": 'odd"name\\here',
            "line": "dir/ü.py:3",
            "node": "MmBackward0",
        },
        {
            "i": 2,
            "op": "aten::cat",
            "phase": "user",
            "in": ["c"],
            "out": ["d", "e"],
            "shapes": [[2, 3], [4]],
            "dtypes": ["int64", "bool"],
            "module": "M",
            "line": "a.py:1\n",
        },
        {
            "i": 3,
            "op": "aten::add",
            "phase": "forward",
            "in": [],
            "out": [],
            "shapes": [],
            "dtypes": [],
            "module": "M",
            "line": "a.py:2",
            "extra": [1],
        },  # another shape of record: json's encoder
    ]
    for record in records:
        line = _encode_record(record)
        assert "\n" not in line and json.loads(line) == record
