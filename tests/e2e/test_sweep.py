"""Sweeps: real trials, resumed, and their seed-noise statistics as the command prints them."""

import json
import sys

import numpy as np
import pytest
from conftest import script
from conftest import twice as twice_cli
from scipy import stats as scipy_stats


def test_sweep_runs_paired_trials_resumes_and_its_stats_match_scipy(tmp_path):
    script("sweep_train.py", tmp_path)
    args = [
        "sweep",
        "--vary",
        "lr=0.05,0.2",
        "--seeds",
        "3",
        "--name",
        "lr",
        "-j",
        "2",
        "--metric",
        "weight_error",
        "--",
        sys.executable,
        "sweep_train.py",
        "--lr",
        "{lr}",
    ]
    first = twice_cli(*args, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert "6 trials completed (0 from before)" in first.stdout
    # A second invocation skips every completed trial.
    again = twice_cli(*args, cwd=tmp_path)
    assert again.returncode == 0 and "6 trials completed (6 from before)" in again.stdout
    trials = sorted(
        p.name.split("-", 4)[-1] for p in (tmp_path / "runs" / "lr" / "trials").iterdir()
    )
    assert trials == sorted(f"lr={lr}-seed{s}" for lr in ("0.05", "0.2") for s in range(3))
    report = json.loads(twice_cli("stats", tmp_path / "runs" / "lr", "--json", cwd=tmp_path).stdout)
    arms = {a["arm"]: a for a in report["arms"]}
    low, high = [arms[f"lr={lr}"]["values"] for lr in ("0.05", "0.2")]
    a_values = [low[str(s)] for s in range(3)]
    b_values = [high[str(s)] for s in range(3)]
    assert arms["lr=0.05"]["mean"] == pytest.approx(np.mean(a_values), rel=1e-12)
    assert arms["lr=0.05"]["std"] == pytest.approx(np.std(a_values, ddof=1), rel=1e-12)
    pair = report["pairs"][0]
    assert pair["p_paired_t"] == pytest.approx(
        scipy_stats.ttest_rel(b_values, a_values).pvalue, rel=1e-9
    )
    assert pair["mean_difference"] == pytest.approx(
        np.mean(np.subtract(b_values, a_values)), rel=1e-12
    )
    assert (
        sorted(arms["lr=0.05"]["values"]) == sorted(arms["lr=0.2"]["values"]) == ["0", "1", "2"]
    )  # paired


@pytest.mark.slow  # costly; its capability keeps a faster test in `make test`
def test_an_interrupted_sweep_continues_and_failed_trials_are_retried(tmp_path):
    script("sweep_train.py", tmp_path)
    failing = [
        "sweep",
        "--vary",
        "lr=0.1",
        "--vary",
        "fail=--fail,--lr",
        "--seeds",
        "1",
        "--name",
        "f",
        "--",
        sys.executable,
        "sweep_train.py",
        "{fail}",
        "0.1",
        "--lr",
        "{lr}",
    ]
    result = twice_cli(*failing, cwd=tmp_path)
    assert result.returncode == 1 and "1 failed" in result.stdout
    # The failure says why: the last lines of its stderr, and where its log is.
    failure = result.stdout[result.stdout.index("  failed: ") :]
    assert "      | " in failure and "      log: " in failure and "stderr.log" in failure
    # Without a terminal, progress is a line per change, never the same line again.
    progress = [line for line in result.stderr.splitlines() if line.startswith("twice sweep: ")]
    assert progress and all(a != b for a, b in zip(progress, progress[1:]))
    again = twice_cli(*failing[:1], "--json", *failing[1:], cwd=tmp_path)
    outcome = json.loads(again.stdout)  # the failure was retried
    assert (outcome["completed"], outcome["skipped"], len(outcome["failed"])) == (1, 1, 1)
    assert again.returncode == 1


def test_an_unknown_metric_is_a_clear_error(tmp_path):
    script("sweep_train.py", tmp_path)
    twice_cli(
        "sweep",
        "--vary",
        "lr=0.1",
        "--seeds",
        "2",
        "--name",
        "m",
        "--",
        sys.executable,
        "sweep_train.py",
        "--lr",
        "{lr}",
        cwd=tmp_path,
    )
    result = twice_cli("stats", tmp_path / "runs" / "m", "--metric", "accuracy", cwd=tmp_path)
    assert result.returncode == 2 and "error: unknown metric 'accuracy'" in result.stderr
    assert "weight_error" in result.stderr


@pytest.mark.slow
def test_a_sweep_runs_its_trials_as_ray_tasks_on_a_local_ray_instance(tmp_path):
    pytest.importorskip("ray", reason="the ray extra is not installed")
    script("sweep_train.py", tmp_path)
    result = twice_cli(
        "sweep",
        "--executor",
        "ray",
        "--jobs",
        "2",
        "--vary",
        "lr=0.05,0.2",
        "--seeds",
        "2",
        "--name",
        "r",
        "--",
        sys.executable,
        "sweep_train.py",
        "--lr",
        "{lr}",
        cwd=tmp_path,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "4 trials completed (0 from before), 0 failed" in result.stdout
    trials = sorted(
        p.name.split("-", 4)[-1] for p in (tmp_path / "runs" / "r" / "trials").iterdir()
    )
    assert trials == sorted(f"lr={lr}-seed{s}" for lr in ("0.05", "0.2") for s in range(2))
    report = json.loads(twice_cli("stats", tmp_path / "runs" / "r", "--json", cwd=tmp_path).stdout)
    assert {a["arm"] for a in report["arms"]} == {"lr=0.05", "lr=0.2"} and all(
        a["n"] == 2 for a in report["arms"]
    )


@pytest.mark.parametrize("name", ["../../x", "/tmp/abs", "..", ".hidden", "a/b"])
def test_a_sweep_name_that_is_a_path_is_refused(tmp_path, name):
    (tmp_path / "t.py").write_text("pass\n")
    result = twice_cli(
        "sweep",
        "--name",
        name,
        "--vary",
        "lr=1,2",
        "--",
        sys.executable,
        "t.py",
        "{lr}",
        cwd=tmp_path,
    )
    assert result.returncode == 2 and "error: invalid run name" in result.stderr
    assert not (tmp_path / "runs").exists() and not (tmp_path.parent / "x").exists()


def test_two_sweeps_on_one_folder_never_run_a_trial_twice_or_mix_grids(tmp_path):
    """Started together, two `twice sweep`s share the trials between them; a third with another
    grid on the same folder is refused."""
    import subprocess

    from conftest import clean_env

    (tmp_path / "t.py").write_text(
        "import os, sys, time\n"
        "with open('log.txt', 'a') as log:\n"
        "    log.write(' '.join(sys.argv[1:]) + '\\n')\n"
        "time.sleep(0.5)\n"
    )
    command = [
        sys.executable,
        "-m",
        "twice",
        "sweep",
        "--name",
        "s",
        "--vary",
        "lr=1,2,3",
        "--seeds",
        "2",
        "--",
        sys.executable,
        "t.py",
        "{lr}",
        "{seed}",
    ]
    procs = [
        subprocess.Popen(command, cwd=tmp_path, env=clean_env(), stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outputs = [proc.communicate(timeout=300)[0] for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], outputs
    lines = (tmp_path / "log.txt").read_text().splitlines()
    assert sorted(lines) == sorted(f"{lr} {seed}" for lr in (1, 2, 3) for seed in (0, 1))
    other = twice_cli(
        "sweep",
        "--name",
        "s",
        "--vary",
        "lr=4,5",
        "--seeds",
        "2",
        "--",
        sys.executable,
        "t.py",
        "{lr}",
        "{seed}",
        cwd=tmp_path,
    )
    assert other.returncode == 2 and "holds a different sweep" in other.stderr
