"""The commands about one run and its checkpoints, in process (click's CliRunner): a checkpoint
verified (exit 0) or refused (exit 2), a run's checkpoints listed each valid or why not, this
machine's hazards as JSON."""

import json

import torch
from click.testing import CliRunner

from twice import checkpoint
from twice.cli.group import main
from twice.cli.runs import checkpoint_group
from twice.store.layout import RunFolder
from unit.cli.test_group import _run_folder


def _checkpointed_run(tmp_path):
    run = _run_folder(tmp_path / "runs")
    for step in (1, 2):
        checkpoint.save(
            RunFolder(run).checkpoints / f"step-{step:08d}", model=torch.nn.Linear(2, 2)
        )
    return run


def test_a_checkpoint_is_verified_exit_0_and_a_damaged_one_refused_exit_2(tmp_path):
    assert main.commands["checkpoint"] is checkpoint_group
    good = _checkpointed_run(tmp_path) / "checkpoints" / "step-00000001"
    result = CliRunner().invoke(main, ["checkpoint", "verify", str(good), "--json"])
    assert result.exit_code == 0 and json.loads(result.output)["entries"] == ["model"]
    (good / "state.json").write_text("{}")
    refused = CliRunner().invoke(main, ["checkpoint", "verify", str(good)])
    assert refused.exit_code == 2 and "error: " in refused.output and "hint: " in refused.output


def test_a_runs_checkpoints_are_listed_newest_last_each_valid_or_why_not(tmp_path):
    run = _checkpointed_run(tmp_path)
    (run / "checkpoints" / "step-00000002" / "checkpoint.json").unlink()
    result = CliRunner().invoke(main, ["checkpoint", "ls", str(run)])
    first, second = result.output.splitlines()
    assert result.exit_code == 0 and first == "step-00000001  valid"
    assert second.startswith("step-00000002  INVALID: ") and "checkpoint.json" in second


def test_the_machines_hazards_are_json_with_the_facts_behind_them(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    result = CliRunner().invoke(main, ["env", "--json"])
    found = json.loads(result.output)
    assert result.exit_code == 0 and found["facts"]["env"]["OMP_NUM_THREADS"] == "2"
    assert all({"name", "detail", "fix"} == set(h) for h in found["hazards"])
