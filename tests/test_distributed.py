"""twice under torchrun (gloo, CPU, real processes): per-rank traces, replica checks, rank-aware diff."""

import json
import shutil
import sys
from pathlib import Path

import pytest

from conftest import clean_env, runs, script, twice

TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
pytestmark = pytest.mark.skipif(not Path(TORCHRUN).exists() and shutil.which("torchrun") is None,
                                reason="torchrun is not installed beside this Python")


def torchrun(tmp, *args, name, env=None):
    return twice("run", "--name", name, "--", TORCHRUN, "--nproc_per_node", "2", "ddp_train.py", *args, cwd=tmp,
                 env=env or clean_env(TWICE_REPLICA_EVERY="1"))


def test_two_process_torchrun_twice_gives_identical_per_rank_traces_and_verify_passes(tmp_path):
    script("ddp_train.py", tmp_path)
    for name in ("a", "b"):
        result = torchrun(tmp_path, name=name)
        assert result.returncode == 0, result.stderr[-3000:]
    a, b = runs(tmp_path)
    assert sorted(p.name for p in a.glob("trace*.jsonl")) == ["trace.rank0.jsonl", "trace.rank1.jsonl"]
    identity = json.loads((a / "manifest.json").read_text())["identity"]
    assert identity["distributed"] == {"world_size": 2, "backend": "gloo", "ranks_recorded": [0, 1]}
    assert identity["env"]["NCCL_ALGO"] == "Ring"
    diff = json.loads(twice("diff", a, b, "--json", cwd=tmp_path).stdout)
    assert diff["identical"] and set(diff["steps"]) == {"rank0", "rank1"} and diff["compared_steps"] == 24
    verified = twice("verify", a, "-q", cwd=tmp_path, env=clean_env(TWICE_REPLICA_EVERY="1"))
    assert verified.returncode == 0, verified.stdout


def test_a_planted_desync_is_detected_at_its_step_with_the_rank_named(tmp_path):
    script("ddp_train.py", tmp_path)
    result = torchrun(tmp_path, "desync", name="desync")
    assert result.returncode != 0
    assert "replicas out of sync at step 5: rank 1 holds different parameters from rank 0, first in module.0.bias" in result.stderr
    found = json.loads((runs(tmp_path)[0] / "replicas.json").read_text())
    assert (found["step"], found["rank"], found["tensor"]) == (5, 1, "module.0.bias")


def test_diff_explains_a_world_size_difference(tmp_path):
    script("ddp_train.py", tmp_path)
    assert torchrun(tmp_path, name="two").returncode == 0
    one = twice("run", "--name", "one", "--", TORCHRUN, "--nproc_per_node", "1", "ddp_train.py", cwd=tmp_path)
    assert one.returncode == 0, one.stderr[-2000:]
    two_run, one_run = [next(r for r in runs(tmp_path) if r.name.endswith(n)) for n in ("-two", "-one")]
    diff = json.loads(twice("diff", two_run, one_run, "--json", cwd=tmp_path).stdout)
    assert not diff["identical"] and "world sizes 2 and 1" in diff["explanation"]
