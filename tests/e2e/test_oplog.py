"""Op logs: the recorder writes each chosen step's operations; the reader gives them back exactly
and
refuses a damaged log (CorruptRecord) instead of comparing it."""

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


def test_the_same_step_recorded_in_two_processes_gives_byte_identical_logs(tmp_path):
    import subprocess
    import sys

    script = (
        "import sys, torch\n"
        "from twice.record.oplog import OpLog, OpRecorder\n"
        "torch.manual_seed(0)\n"
        "model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Tanh())\n"
        "with OpRecorder(0) as ops:\n"
        "    model(torch.randn(4, 3)).sum().backward()\n"
        "log = OpLog(sys.argv[1])\n"
        "ops.close(); ops.write(log); log.close()\n"
    )
    logs = []
    for name in ("a", "b"):
        subprocess.run(
            [sys.executable, "-c", script, str(tmp_path / name)], check=True, cwd=tmp_path
        )
        logs.append(RunFolder(tmp_path / name).op_log().read_bytes())
    assert logs[0] == logs[1] and step_ops(tmp_path / "a", 0)


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
