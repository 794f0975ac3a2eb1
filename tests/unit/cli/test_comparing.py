"""`twice diff` in process (click's CliRunner): identical runs are exit 0, a difference is exit 1
with its first step and field, in words and as JSON."""

import json

from click.testing import CliRunner

from twice.cli.comparing import diff
from twice.cli.group import main
from twice.core.records import StepRecord
from twice.store.layout import RunFolder
from twice.store.traces import TraceWriter
from unit.cli.test_group import _run_folder


def _traced(runs, name, losses):
    path = _run_folder(runs, name, steps=len(losses))
    writer = TraceWriter(RunFolder(path).trace())
    for step, loss in enumerate(losses):
        writer.write(StepRecord(step=step, loss=loss.hex(), params=f"{step:032x}"))
    writer.close()
    return path


def test_identical_runs_are_exit_0_and_a_changed_loss_is_exit_1_naming_its_step(tmp_path):
    runs = tmp_path / "runs"
    a = _traced(runs, "a", [1.0, 0.5, 0.25])
    b = _traced(runs, "b", [1.0, 0.5, 0.25])
    c = _traced(runs, "c", [1.0, 0.5, 0.3])
    assert main.commands["diff"] is diff  # registered on the one group
    same = CliRunner().invoke(main, ["diff", str(a), str(b)])
    assert same.exit_code == 0 and "identical" in same.output
    differs = CliRunner().invoke(main, ["diff", str(a), str(c), "--json"])
    assert differs.exit_code == 1
    report = json.loads(differs.output)
    assert report["divergence"]["step"] == 2 and report["divergence"]["first"] == "loss"


def test_a_run_that_is_not_there_is_exit_2_never_a_verdict(tmp_path):
    a = _traced(tmp_path / "runs", "a", [1.0])
    result = CliRunner().invoke(main, ["diff", str(a), str(tmp_path / "nothing")])
    assert result.exit_code == 2 and "error: " in result.output and "identical" not in result.output
