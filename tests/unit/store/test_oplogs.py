"""The op-log readers: a recorded step's operations read back, the one-file-per-step form still
read, a damaged log refused naming its line."""

import json

import pytest
import torch

from twice.core.errors import CorruptRecord
from twice.record.oplog import OpLog, OpRecorder
from twice.store.layout import RunFolder
from twice.store.oplogs import read_oplog, step_ops, steps_ops


def _record_step(tmp_path, step=0):
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Tanh())
    with OpRecorder(step) as ops:
        model(torch.ones(4, 3)).sum().backward()
    log = OpLog(tmp_path)
    ops.close()
    ops.write(log)
    log.close()
    return ops


@pytest.mark.parametrize(
    "damage",
    [
        lambda text: text.replace('{"step":0', '{"step":"0"', 1),
        lambda text: text.replace('"ops":', '"ops":-', 1),
        lambda text: text.replace('{"i":0', "[1,2", 1),
        lambda text: text.replace('{"i":0', '{"i":0,', 1),
    ],
    ids=["step-a-string", "negative-count", "record-not-an-object", "record-not-json"],
)
def test_a_damaged_op_log_is_a_corrupt_record_naming_its_line(tmp_path, damage):
    _record_step(tmp_path)
    path = RunFolder(tmp_path).op_log()
    path.write_text(damage(path.read_text()))
    with pytest.raises(CorruptRecord, match=r"ops\.jsonl"):
        steps_ops(tmp_path, [0])


def test_the_one_file_per_step_form_still_reads(tmp_path):
    folder = RunFolder(tmp_path)
    folder.ops.mkdir()
    record = {"i": 0, "op": "aten::add.Tensor", "phase": "forward", "in": [], "out": []}
    (folder.ops / "step-5.jsonl").write_text(json.dumps(record) + "\n")
    assert step_ops(tmp_path, 5) == [record] == read_oplog(folder.ops / "step-5.jsonl")
