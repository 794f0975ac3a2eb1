"""`twice sweep` and `twice stats` in process (click's CliRunner): a sweep's bad input refused
before any trial runs, and a sweep's arms compared from its trials' metrics (the trials as real
runs: tests/e2e/test_sweep.py)."""

import json

import pytest
from click.testing import CliRunner

from twice.app.sweepplan import plan_trials
from twice.cli.group import main
from twice.cli.studies import stats
from twice.store.files import write_json_atomic
from twice.store.layout import RunFolder
from twice.store.runs import new_run_dir
from twice.store.sweeps import SWEEP_FILE, SweepSpec


@pytest.mark.parametrize(
    "args, message",
    [
        (["--vary", "lr", "--", "python", "x.py", "{lr}"], "is not NAME=VALUE"),
        (["--vary", "lr=0.1,", "--", "python", "x.py", "{lr}"], "is not NAME=VALUE"),
        (["--vary", "lr=0.1", "--", "python", "x.py", "--lr", "0.1"], "no placeholder for {lr}"),
        (
            ["--vary", "lr=0.1", "--", "python", "x.py", "{lr}", "{wd}"],
            "uses {wd}, which nothing varies",
        ),
    ],
)
def test_bad_sweep_input_is_a_clear_error(tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["sweep", *args])
    assert (
        result.exit_code == 2 and result.output.startswith("error: ") and message in result.output
    )
    assert "hint: " in result.output and not (tmp_path / "runs").exists()


def _sweep(folder, losses):
    """A sweep folder of completed trials, each with its final loss from `losses[arm][seed]`."""
    spec = SweepSpec({"lr": list(losses)}, 3, ["python", "t.py", "--lr", "{lr}"])
    folder.mkdir()
    write_json_atomic(folder / SWEEP_FILE, spec.to_json())
    for trial in plan_trials(spec.grid, spec.seeds, spec.command):
        run = new_run_dir(folder / "trials", trial.name)
        manifest = {
            "identity": {"argv": trial.command(spec.command)},
            "context": {"status": "completed"},
        }
        write_json_atomic(RunFolder(run).manifest, manifest)
        value = losses[dict(trial.arm)["lr"]][trial.seed]
        write_json_atomic(RunFolder(run).final_metrics, {"final_loss": value})


def test_stats_compares_the_arms_paired_by_seed(tmp_path):
    assert main.commands["stats"] is stats
    _sweep(tmp_path / "sweep", {"0.1": [1.0, 2.0, 4.0], "0.2": [1.5, 2.5, 4.5]})
    result = CliRunner().invoke(main, ["stats", str(tmp_path / "sweep"), "--json"])
    assert result.exit_code == 0, result.output
    found = json.loads(result.output)
    assert found["metric"] == "final_loss"
    assert [(a["arm"], a["n"], a["mean"]) for a in found["arms"]] == [
        ("lr=0.1", 3, 7 / 3),
        ("lr=0.2", 3, 17 / 6),
    ]
    (pair,) = found["pairs"]
    assert pair["mean_difference"] == 0.5 and pair["verdict"] == "effect exceeds seed noise"


def test_stats_of_a_folder_that_is_not_a_sweep_is_exit_2(tmp_path):
    result = CliRunner().invoke(main, ["stats", str(tmp_path)])
    assert result.exit_code == 2 and "is not a sweep folder" in result.output
