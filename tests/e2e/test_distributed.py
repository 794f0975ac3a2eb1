"""twice under torchrun (gloo, CPU, real processes): per-rank traces, replica checks, rank-aware
diff."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import clean_env, runs, script, twice
from safetensors.torch import load_file

TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
pytestmark = pytest.mark.skipif(
    not Path(TORCHRUN).exists() and shutil.which("torchrun") is None,
    reason="torchrun is not installed beside this Python",
)


def torchrun(tmp, *args, name, env=None):
    return twice(
        "run",
        "--name",
        name,
        "--",
        TORCHRUN,
        "--nproc_per_node",
        "2",
        "ddp_train.py",
        *args,
        cwd=tmp,
        env=env or clean_env(TWICE_REPLICA_EVERY="1"),
    )


def test_two_process_torchrun_twice_gives_identical_per_rank_traces_and_verify_passes(tmp_path):
    script("ddp_train.py", tmp_path)
    for name in ("a", "b"):
        result = torchrun(tmp_path, name=name)
        assert result.returncode == 0, result.stderr[-3000:]
    a, b = runs(tmp_path)
    assert sorted(p.name for p in a.glob("trace*.jsonl")) == [
        "trace.rank0.jsonl",
        "trace.rank1.jsonl",
    ]
    identity = json.loads((a / "manifest.json").read_text())["identity"]
    assert identity["distributed"] == {"world_size": 2, "backend": "gloo", "ranks_recorded": [0, 1]}
    assert identity["env"]["NCCL_ALGO"] == "Ring"
    diff = json.loads(twice("diff", a, b, "--json", cwd=tmp_path).stdout)
    assert (
        diff["identical"]
        and set(diff["steps"]) == {"rank0", "rank1"}
        and diff["compared_steps"] == 24
    )
    verified = twice("verify", a, "-q", cwd=tmp_path, env=clean_env(TWICE_REPLICA_EVERY="1"))
    assert verified.returncode == 0, verified.stdout


def test_a_planted_desync_is_detected_at_its_step_with_the_rank_named(tmp_path):
    script("ddp_train.py", tmp_path)
    result = torchrun(tmp_path, "desync", name="desync")
    assert result.returncode != 0
    assert (
        "replicas out of sync at step 5: rank 1 holds different parameters from rank 0, first in "
        "module.0.bias" in result.stderr
    )
    found = json.loads((runs(tmp_path)[0] / "replicas.json").read_text())
    assert (found["step"], found["rank"], found["tensor"]) == (5, 1, "module.0.bias")


@pytest.mark.slow  # costly; its capability keeps a faster test in `make test`
def test_diff_explains_a_world_size_difference(tmp_path):
    script("ddp_train.py", tmp_path)
    assert torchrun(tmp_path, name="two").returncode == 0
    one = twice(
        "run",
        "--name",
        "one",
        "--",
        TORCHRUN,
        "--nproc_per_node",
        "1",
        "ddp_train.py",
        cwd=tmp_path,
    )
    assert one.returncode == 0, one.stderr[-2000:]
    two_run, one_run = [
        next(r for r in runs(tmp_path) if r.name.endswith(n)) for n in ("-two", "-one")
    ]
    diff = json.loads(twice("diff", two_run, one_run, "--json", cwd=tmp_path).stdout)
    assert not diff["identical"] and "world sizes 2 and 1" in diff["explanation"]


@pytest.mark.slow
def test_a_two_process_run_resumes_bit_exactly_and_refuses_another_world_size(tmp_path):
    script("ddp_resume.py", tmp_path)
    result = twice(
        "verify-resume",
        "--at",
        "3",
        "--json",
        "--",
        TORCHRUN,
        "--nproc_per_node",
        "2",
        "ddp_resume.py",
        cwd=tmp_path,
    )
    outcome = json.loads(result.stdout)
    assert result.returncode == 0 and outcome["identical"], outcome
    assert "on every one of the 2 ranks" in outcome["verdict"]
    interrupted = Path(outcome["runs"]["interrupted"])
    saved = interrupted / "checkpoints" / "step-00000003"
    assert sorted(p.name for p in saved.iterdir()) == [
        "checkpoint.json",
        "rank-00000",
        "rank-00001",
    ]
    assert twice("checkpoint", "verify", saved, cwd=tmp_path).returncode == 0

    other = twice(
        "run",
        "--name",
        "one",
        "--resume",
        interrupted,
        "--",
        TORCHRUN,
        "--nproc_per_node",
        "1",
        "ddp_resume.py",
        cwd=tmp_path,
    )
    assert other.returncode != 0
    assert "checkpoint step-00000003 was written by 2 processes; this run has 1" in other.stderr

    # A rank's part that is damaged or missing makes the whole checkpoint invalid, naming the part.
    (saved / "rank-00001" / "state.json").write_text("{}")
    damaged = twice("checkpoint", "verify", saved, cwd=tmp_path)
    assert damaged.returncode == 2 and "rank-00001/state.json" in damaged.stderr


def _final_params(tmp, n, mode):
    """Start `n` ranks directly (as torchrun would, without its agent process) and read rank 0's
    parameters."""
    import socket

    out = tmp / f"{mode}{n}.safetensors"
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    ranks = [
        subprocess.Popen(
            [sys.executable, "invariant_train.py", mode, str(out)],
            cwd=tmp,
            stderr=subprocess.PIPE,
            text=True,
            env=clean_env(
                OMP_NUM_THREADS="1",
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port),
                RANK=str(r),
                LOCAL_RANK=str(r),
                WORLD_SIZE=str(n),
            ),
        )
        for r in range(n)
    ]
    for rank in ranks:
        _, err = rank.communicate(timeout=300)
        assert rank.returncode == 0, err[-3000:]
    return load_file(out)


@pytest.mark.slow  # costly; its capability keeps a faster test in `make test`
def test_invariant_mode_trains_identical_parameters_on_1_2_and_4_processes_where_ddp_does_not(
    tmp_path,
):
    script("invariant_train.py", tmp_path)
    one, two, four = (_final_params(tmp_path, n, "invariant") for n in (1, 2, 4))
    assert one.keys() == two.keys() == four.keys()
    for name in one:
        assert torch.equal(one[name], two[name]) and torch.equal(one[name], four[name]), name
    # Plain DDP on the same model and data: the all-reduce adds the ranks' gradients in another
    # order than one process does, and after six Adam steps the low bits differ.
    ddp_one, ddp_two = _final_params(tmp_path, 1, "ddp"), _final_params(tmp_path, 2, "ddp")
    assert not all(torch.equal(ddp_one[k], ddp_two[k]) for k in ddp_one)


@pytest.mark.slow  # costly; its capability keeps a faster test in `make test`
def test_two_node_torchrun_with_a_rendezvous_endpoint_records_every_rank(tmp_path):
    """Two torchrun agents on this machine stand in for two nodes: each node's `twice run`
    records its ranks."""
    import socket

    script("ddp_train.py", tmp_path)
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    nodes = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "twice",
                "run",
                "--name",
                f"node{n}",
                "--",
                TORCHRUN,
                "--nnodes",
                "2",
                "--nproc_per_node",
                "1",
                "--node_rank",
                str(n),
                "--rdzv_backend",
                "c10d",
                "--rdzv_endpoint",
                f"127.0.0.1:{port}",
                "--rdzv_id",
                "twice-test",
                "ddp_train.py",
            ],
            cwd=tmp_path,
            env=clean_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(2)
    ]
    for node in nodes:
        _, err = node.communicate(timeout=300)
        assert node.returncode == 0, err[-3000:]
    ranks = []
    for run in runs(tmp_path):
        distributed = json.loads((run / "manifest.json").read_text())["identity"]["distributed"]
        assert distributed["world_size"] == 2 and distributed["backend"] == "gloo"
        ranks += distributed["ranks_recorded"]
        for rank in distributed["ranks_recorded"]:
            assert len((run / f"trace.rank{rank}.jsonl").read_text().splitlines()) == 12
    assert sorted(ranks) == [0, 1]


@pytest.mark.slow  # costly; its capability keeps a faster test in `make test`
def test_a_zero_redundancy_optimizer_resumes_bit_exactly_from_each_ranks_shard(tmp_path):
    """ZeroRedundancyOptimizer's state_dict() needs a consolidation collective; twice saves each
    rank's shard in that rank's part instead, and restores it with the scheduled learning rate."""
    script("ddp_resume.py", tmp_path)
    result = twice(
        "verify-resume",
        "--at",
        "5",
        "--json",
        "--",
        TORCHRUN,
        "--nproc_per_node",
        "2",
        "ddp_resume.py",
        "zero",
        cwd=tmp_path,
    )
    outcome = json.loads(result.stdout)
    assert result.returncode == 0 and outcome["identical"], outcome
    assert "on every one of the 2 ranks" in outcome["verdict"]
