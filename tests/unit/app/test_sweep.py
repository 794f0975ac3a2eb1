"""app/sweep: a sweep's outcome and exit code, and its results read back from its completed
trials, by arm and seed."""

from pathlib import Path

import pytest

from twice.app.sweep import SWEEP_FILE, SweepOutcome, sweep_results
from twice.app.sweepplan import Trial
from twice.core.errors import TwiceError
from twice.store.files import write_json_atomic
from twice.store.sweeps import SweepSpec
from unit.app.folders import steps, write_run

COMMAND = ["python", "train.py", "--lr", "{lr}", "--seed", "{seed}"]


def _sweep(tmp_path, finals, status="completed") -> Path:
    """A sweep folder of lr 0.1 and 0.2 times two seeds, each trial ending at its final loss."""
    folder = tmp_path / "sweep"
    folder.mkdir(parents=True)
    write_json_atomic(folder / SWEEP_FILE, SweepSpec({"lr": ["0.1", "0.2"]}, 2, COMMAND).to_json())
    for (lr, seed), final in finals.items():
        name = f"20260101-000000-000-abcdef-lr={lr}-seed{seed}"
        write_run(folder / "trials" / name, steps([3.0, final]), status=status)
    return folder


def test_results_are_each_arms_metric_by_seed_from_completed_trials(tmp_path):
    folder = _sweep(tmp_path, {("0.1", 0): 1.5, ("0.1", 1): 1.25, ("0.2", 0): 2.0})
    spec, values = sweep_results(folder)
    assert spec["metric"] == "final_loss" and spec["grid"] == {"lr": ["0.1", "0.2"]}
    assert values == {"lr=0.1": {0: 1.5, 1: 1.25}, "lr=0.2": {0: 2.0}}
    assert sweep_results(folder, "best_loss")[1]["lr=0.1"] == {0: 1.5, 1: 1.25}
    crashed = _sweep(tmp_path / "other", {("0.1", 0): 1.5}, status="crashed")
    assert sweep_results(crashed)[1] == {}  # a trial that did not complete is not a result


def test_a_non_finite_metric_is_an_error_not_a_result(tmp_path):
    folder = _sweep(tmp_path, {("0.1", 0): float("inf")})
    with pytest.raises(TwiceError, match="an effect against seed noise cannot be judged"):
        sweep_results(folder)


def test_the_outcome_counts_each_trial_and_exits_as_it_went(tmp_path):
    outcome = SweepOutcome(tmp_path, completed=0)
    outcome.record(Trial((("lr", "0.1"),), 0), 0)
    outcome.record(Trial((("lr", "0.1"),), 1), None)  # another sweep on the folder ran it
    assert outcome.exit_code == 0 and (outcome.completed, outcome.elsewhere) == (1, 1)
    outcome.record(Trial((("lr", "0.2"),), 0), 3)
    assert outcome.failed == ["lr=0.2 seed 0 (exit 3)"] and outcome.exit_code == 1
    outcome.interrupted = True
    assert outcome.exit_code == 130 and outcome.to_json()["failed"] == outcome.failed
