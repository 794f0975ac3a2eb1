"""Op logs: one step recorded in two processes gives byte-identical logs (the readers, on a
damaged log too: tests/unit/store/test_oplogs.py)."""

from twice.store.layout import RunFolder
from twice.store.oplogs import step_ops


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
