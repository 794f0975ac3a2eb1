"""`twice verify RUN --segments K`: sampled segments between checkpoints, re-run in real
processes, each compared with the recorded steps and the recorded checkpoint at its end."""

import json
import sys

import pytest
from conftest import runs, script, twice

from twice.store.layout import RunFolder


@pytest.fixture
def recorded(tmp_path):
    """A 12-step run checkpointed after steps 3, 6, 9 and 12: four segments."""
    script("segments.py", tmp_path)
    result = twice("run", "--name", "orig", "--", sys.executable, "segments.py", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    return runs(tmp_path)[-1]


def _verify(tmp_path, run, *args):
    return twice("verify", run, "--json", *args, cwd=tmp_path)


def test_every_segment_of_a_deterministic_run_reproduces_with_its_checkpoints(tmp_path, recorded):
    result = _verify(tmp_path, recorded, "--segments", "all", "--jobs", "2")
    outcome = json.loads(result.stdout)
    assert result.returncode == 0 and outcome["identical"], outcome
    assert [s["steps"] for s in outcome["checked"]] == [[0, 3], [3, 6], [6, 9], [9, 12]]
    assert outcome["verdict"].startswith("4 of 4 segments re-run bit-identical (steps 0-3, ")
    assert outcome["cost"] == 1.0
    assert json.loads(RunFolder(recorded).segments_check.read_text())["seed"] == outcome["seed"]


@pytest.mark.slow
def test_sampled_segments_keep_the_first_and_last_and_say_what_they_show(tmp_path, recorded):
    result = _verify(tmp_path, recorded, "--segments", "3", "--seed", "5")
    outcome = json.loads(result.stdout)
    assert result.returncode == 0, outcome
    steps = [s["steps"] for s in outcome["checked"]]
    assert steps[0] == [0, 3] and steps[-1] == [9, 12] and len(steps) == 3
    assert outcome["seed"] == 5 and outcome["cost"] == 0.75
    assert "3 of 4 segments re-run bit-identical" in outcome["verdict"]
    assert "caught with probability 1-(1-p)^3 (27% for p = 10%)" in outcome["verdict"]
    again = json.loads(_verify(tmp_path, recorded, "--segments", "3", "--seed", "5").stdout)
    assert [s["steps"] for s in again["checked"]] == steps  # the seed decides the draw


@pytest.mark.slow
def test_a_difference_planted_inside_one_segment_is_found_there_only(tmp_path, recorded):
    (tmp_path / "plant").touch()  # step 7 draws one more random number in every re-run
    result = _verify(tmp_path, recorded, "--segments", "all", "--jobs", "2")
    outcome = json.loads(result.stdout)
    assert result.returncode == 1 and not outcome["identical"]
    verdicts = {tuple(s["steps"]): s for s in outcome["checked"]}
    assert [k for k, s in verdicts.items() if not s["identical"]] == [(6, 9)]
    assert "first divergence at step 7 (RNG state)" in verdicts[(6, 9)]["verdict"]
    assert "twice locate" in verdicts[(6, 9)]["verdict"]
    plain = twice("verify", recorded, "--segments", "all", cwd=tmp_path)
    assert plain.stdout.startswith("NOT reproducible: 1 of 4 segments re-run differ (steps 6-9)")


def test_a_segment_whose_process_is_killed_is_reported_cleanly(tmp_path, recorded):
    (tmp_path / "kill").touch()  # SIGKILL at step 10, inside the last segment
    result = twice("verify", recorded, "--segments", "2", "--seed", "0", cwd=tmp_path)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert "steps 9-12: DIFFERS: the re-run crashed" in result.stdout
    assert "steps 0-3: same" in result.stdout


def test_a_run_without_checkpoints_is_an_error_with_a_hint(tmp_path):
    (tmp_path / "plain.py").write_text("print('no training')\n")
    twice("run", "--", sys.executable, "plain.py", cwd=tmp_path)
    result = twice("verify", runs(tmp_path)[-1], "--segments", "4", cwd=tmp_path)
    assert result.returncode == 2 and "has no checkpoints to start segments from" in result.stderr
    assert "hint: checkpoint as the run goes" in result.stderr
    bad = twice("verify", runs(tmp_path)[-1], "--segments", "many", cwd=tmp_path)
    assert bad.returncode == 2 and "--segments takes a count or 'all'" in bad.stderr


@pytest.mark.slow
def test_segments_run_as_ray_tasks_on_a_local_ray_instance(tmp_path, recorded):
    pytest.importorskip("ray", reason="the ray extra is not installed")
    result = twice(
        "verify", recorded, "--json", "--segments", "all", "--executor", "ray", cwd=tmp_path
    )
    outcome = json.loads(result.stdout)
    assert result.returncode == 0 and outcome["identical"], result.stderr[-3000:]
    assert len(outcome["checked"]) == 4


@pytest.mark.slow
def test_a_torchrun_run_is_verified_by_segments_with_per_rank_checkpoints(tmp_path):
    from e2e.test_distributed import TORCHRUN

    script("ddp_resume.py", tmp_path)
    command = [TORCHRUN, "--nproc_per_node", "2", "ddp_resume.py", "every3"]
    assert twice("run", "--name", "ddp", "--", *command, cwd=tmp_path).returncode == 0
    run = runs(tmp_path)[-1]
    assert (run / "checkpoints" / "step-00000003" / "rank-00001").is_dir()
    result = _verify(tmp_path, run, "--segments", "all")
    outcome = json.loads(result.stdout)
    assert result.returncode == 0 and outcome["identical"], outcome
    assert [s["steps"] for s in outcome["checked"]] == [[0, 3], [3, 6], [6, 9], [9, 10]]
