"""Sharded training (FSDP2, tensor parallel, both on a 2-D mesh) under torchrun on gloo, real
processes: traced per rank from the local shards, compared rank by rank, checkpointed and resumed
through Distributed Checkpoint; and the pieces underneath (DTensor and wrapper-subclass digests,
replica groups, DCP's metadata read without running code)."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import clean_env, runs, script, twice

from twice.core.digests import digest, digest_tensor
from twice.core.fastpath import digest_many

# Every torchrun here runs --standalone: a free port of its own, so that torchrun tests can run
# side by side under xdist.
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
needs_torchrun = pytest.mark.skipif(
    not Path(TORCHRUN).exists() and shutil.which("torchrun") is None,
    reason="torchrun is not installed beside this Python",
)


def sharded(tmp, layout, *options, name, procs=2, env=None):
    result = twice(
        "run",
        "--name",
        name,
        "--",
        TORCHRUN,
        "--standalone",
        "--nproc_per_node",
        str(procs),
        "sharded_train.py",
        layout,
        *options,
        cwd=tmp,
        env=env or clean_env(TWICE_REPLICA_EVERY="1"),
    )
    return result


def _verify_resume(tmp, layout, procs):
    """`twice verify-resume --at 3` of the layout (a checkpoint every 3 steps, through DCP):
    bit-exact on every rank. Its outcome."""
    result = twice(
        "verify-resume", "--at", "3", "--json", "--",
        TORCHRUN, "--standalone", "--nproc_per_node", str(procs), "sharded_train.py", layout,
        "every3",
        cwd=tmp, env=clean_env(TWICE_REPLICA_EVERY="1"),
    )  # fmt: skip
    outcome = json.loads(result.stdout)
    assert result.returncode == 0 and outcome["identical"], outcome
    assert f"on every one of the {procs} ranks" in outcome["verdict"]
    return outcome


def _run(tmp, suffix):
    return next(r for r in runs(tmp) if r.name.endswith(f"-{suffix}"))


def _two_runs_and_a_learning_rate(tmp, layout, procs, twins=True):
    """Two runs bit-identical (`twins`); a learning rate changed from step 2 found there on
    every rank."""
    script("sharded_train.py", tmp)
    names = (("a", ("every3",)), ("a2", ("every3",)), ("lr", ("lr=0.02",)))
    for name, options in names if twins else (names[0], names[2]):
        result = sharded(tmp, layout, *options, name=name, procs=procs)
        assert result.returncode == 0, result.stderr[-3000:]
    a, lr = _run(tmp, "a"), _run(tmp, "lr")
    ranks = {f"rank{r}" for r in range(procs)}
    if twins:
        same = json.loads(twice("diff", a, _run(tmp, "a2"), "--json", cwd=tmp).stdout)
        assert same["identical"] and set(same["steps"]) == ranks, same
        assert same["compared_steps"] == 6 * procs
    differ = json.loads(twice("diff", a, lr, "--json", cwd=tmp).stdout)
    assert not differ["identical"] and differ["divergence"]["identical_steps_before"] == 2
    assert differ["diverged"] == {r: {"step": 2, "first": "lr"} for r in ranks}
    assert "the command lines differ" in differ["explanation"]
    identity = json.loads((a / "manifest.json").read_text())["identity"]["distributed"]
    assert identity["world_size"] == procs and identity["sharding"]["placements"]
    return a


@needs_torchrun
@pytest.mark.slow  # costly on two cores; run by make test-slow and CI
def test_fsdp2_on_two_processes_is_traced_from_its_shards_and_checkpointed_through_dcp(tmp_path):
    script("sharded_train.py", tmp_path)
    result = sharded(tmp_path, "fsdp", "every3", name="a")
    assert result.returncode == 0, result.stderr[-3000:]
    a = _run(tmp_path, "a")
    assert "capture stopped" not in result.stderr
    for rank in (0, 1):  # every step traced on every rank, from its own shards
        records = [json.loads(line) for line in (a / f"trace.rank{rank}.jsonl").open()]
        assert [r["step"] for r in records] == list(range(6))
    identity = json.loads((a / "manifest.json").read_text())["identity"]["distributed"]
    assert identity["world_size"] == 2 and identity["sharding"]["meshes"] == ["(dp=2)"]
    assert identity["sharding"]["placements"]["0.weight"] == "(dp=2) ['S(0)']"
    # the checkpoint: rank parts for RNGs and the data position, DCP for the sharded state
    saved = a / "checkpoints" / "step-00000003"
    assert sorted(p.name for p in saved.iterdir()) == [
        "checkpoint.json",
        "dcp",
        "rank-00000",
        "rank-00001",
    ]
    assert sorted(p.name for p in (saved / "dcp").iterdir()) == [
        ".metadata",
        "__0_0.distcp",
        "__1_0.distcp",
    ]
    index = json.loads((saved / "checkpoint.json").read_text())
    assert index["sharded"]["entries"] == ["model", "optimizer"]
    assert twice("checkpoint", "verify", saved, cwd=tmp_path).returncode == 0
    _damaged_dcp_folders_are_not_valid(tmp_path, saved)


def _damaged_dcp_folders_are_not_valid(tmp, saved):
    from twice.checkpoint.index import index_bytes

    def copy(name):
        target = tmp / name
        shutil.copytree(saved, target)
        return target

    flipped = copy("flipped")
    data = flipped / "dcp" / "__1_0.distcp"
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 1
    data.write_bytes(bytes(raw))
    extra = copy("extra")
    (extra / "dcp" / "__2_0.distcp").write_bytes(b"x")
    crafted = copy("crafted")  # a pickle that would run code, the index resealed to match it
    evil = b"cos\nsystem\n(S'true'\ntR."
    (crafted / "dcp" / ".metadata").write_bytes(evil)
    body = json.loads((crafted / "checkpoint.json").read_text())
    body.pop("self")
    body["sharded"]["files"][".metadata"] = {
        "size": len(evil),
        "digest": __import__("xxhash").xxh3_128_hexdigest(evil),
    }
    (crafted / "checkpoint.json").write_bytes(index_bytes(body))
    for folder, words in (
        (flipped, "is corrupt"),
        (extra, "did not record"),
        (crafted, "os.system is not part of DCP's metadata"),
    ):
        result = twice("checkpoint", "verify", folder, cwd=tmp)
        assert result.returncode == 2, (folder, result.stdout, result.stderr)
        assert words in result.stderr and "Traceback" not in result.stderr


@needs_torchrun
@pytest.mark.slow  # costly on two cores; run by make test-slow and CI
def test_fsdp2_resumes_bit_exactly_through_dcp_and_warns_on_another_world_size(tmp_path):
    script("sharded_train.py", tmp_path)
    outcome = _verify_resume(tmp_path, "fsdp", 2)
    interrupted = Path(outcome["runs"]["interrupted"])
    other = twice(
        "run",
        "--name",
        "four",
        "--resume",
        interrupted,
        "--",
        TORCHRUN,
        "--standalone",
        "--nproc_per_node",
        "4",
        "sharded_train.py",
        "fsdp",
        cwd=tmp_path,
    )
    # refused by default, as any multi-process checkpoint at another world size
    assert other.returncode != 0
    assert "written by 2 processes; this run has 4" in other.stderr


@needs_torchrun
@pytest.mark.slow  # four processes: costly on two cores
@pytest.mark.parametrize(("layout", "procs"), [("fsdp", 2), ("fsdp", 4), ("tp", 2), ("2d", 4)])
def test_every_layout_gives_identical_runs_and_finds_a_learning_rate_change_on_every_rank(
    tmp_path, layout, procs
):
    a = _two_runs_and_a_learning_rate(tmp_path, layout, procs)
    _verify_resume(tmp_path, layout, procs)
    assert (a / "checkpoints" / "step-00000003" / "dcp" / ".metadata").is_file()


@needs_torchrun
@pytest.mark.slow
def test_replica_checks_compare_replicated_placements_and_skip_shards(tmp_path):
    script("sharded_train.py", tmp_path)
    # under FSDP2 every parameter is sharded over the whole mesh: a shard changed on one rank
    # has no replica to disagree with, and the run goes on
    fsdp = sharded(tmp_path, "fsdp", "perturb", name="fsdp")
    assert fsdp.returncode == 0, fsdp.stderr[-2000:]
    # under tensor parallelism layer 2's bias is replicated: the change is a desync
    tp = sharded(tmp_path, "tp", "perturb", name="tp")
    assert tp.returncode != 0
    assert (
        "replicas out of sync at step 3: rank 1 holds different parameters from rank 0 among "
        "those placed (tp=2) ['R'], first in 2.bias" in tp.stderr
    )


@needs_torchrun
@pytest.mark.slow
def test_a_script_that_saves_and_loads_dcp_itself_is_lined_up_by_content(tmp_path):
    script("sharded_train.py", tmp_path)
    for name in ("a", "b"):
        assert sharded(tmp_path, "fsdp", "selfdcp", name=name).returncode == 0
    a, b = _run(tmp_path, "a"), _run(tmp_path, "b")
    same = json.loads(twice("diff", a, b, "--json", cwd=tmp_path).stdout)
    assert same["identical"]
    # the two saves differ only in DCP's random save id and folder: named as such
    assert same["outputs"]["dcp_save_id"] == ["dcp-step3/.metadata"]
    assert "dcp-step3/__0_0.distcp" in same["outputs"]["identical"]
    shutil.copytree(tmp_path / "dcp-step3", tmp_path / "kept")
    env = clean_env(SHARDED_RESUME=str(tmp_path / "kept"))
    assert sharded(tmp_path, "fsdp", "selfdcp", name="resumed", env=env).returncode == 0
    resumed = _run(tmp_path, "resumed")
    diff = twice("diff", a, resumed, cwd=tmp_path)
    assert diff.returncode == 0, diff.stdout
    assert diff.stdout.startswith(
        "runs are bit-identical: 6 steps compared; B starts at A's step 3 (parameters identical)"
    )


# -- the pieces, in one process -------------------------------------------------------------------


def test_a_dtensor_is_digested_as_its_local_shard(one_rank_mesh):
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    full = torch.randn(6, 4, generator=torch.Generator().manual_seed(0))
    for placement in (Shard(0), Replicate()):
        sharded_tensor = distribute_tensor(full, one_rank_mesh, [placement])
        local = sharded_tensor.to_local()
        assert digest_tensor(sharded_tensor) == digest_tensor(local) == digest(sharded_tensor)
        digests, norms = digest_many([sharded_tensor, local], norms=True)
        assert digests[0] == digests[1] and norms[0] == norms[1]
        parameter = torch.nn.Parameter(sharded_tensor)
        assert digest_many([parameter])[0][0] == digests[1]


def test_any_wrapper_subclass_is_digested_by_the_tensors_it_wraps():
    two_tensor = pytest.importorskip("torch.testing._internal.two_tensor")
    a, b = torch.randn(5), torch.randn(5)
    wrapped = two_tensor.TwoTensor(a, b)
    again = two_tensor.TwoTensor(a.clone(), b.clone())
    other = two_tensor.TwoTensor(a.clone(), b + 1)
    assert digest(wrapped) == digest(again) == digest_many([again])[0][0]
    assert digest(wrapped) != digest(other)
    assert digest(wrapped) not in (digest(a), digest(b))


@needs_torchrun
@pytest.mark.slow
def test_whole_tensor_digests_compare_fsdp2_across_world_sizes(tmp_path):
    """Every rank on the same batches: FSDP2 on 1 and on 2 processes computes the same whole
    tensors, which --full-every shows where the per-rank shards cannot be compared."""
    script("sharded_train.py", tmp_path)
    for procs in (1, 2):
        result = twice(
            "run", "--full-every", "2", "--name", f"w{procs}", "--",
            TORCHRUN, "--standalone", "--nproc_per_node", str(procs), "sharded_train.py", "fsdp",
            "same",
            cwd=tmp_path, env=clean_env(OMP_NUM_THREADS="1"),
        )  # fmt: skip
        assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(
        twice("diff", _run(tmp_path, "w1"), _run(tmp_path, "w2"), "--json", cwd=tmp_path).stdout
    )
    assert not report["identical"] and "world sizes 1 and 2" in report["explanation"]
    assert report["whole_tensors"] == {"steps": 3, "first_differs": None}


def test_whole_tensor_digests_are_compared_step_by_step(tmp_path):
    from twice.core.records import StepRecord
    from twice.store.traces import record_line
    from twice.store.traceseries import compare_whole_tensors

    def trace(name, fulls):
        path = tmp_path / name
        path.write_bytes(
            b"".join(
                record_line(StepRecord(step=s, params=f"{s:032x}", params_full=full))
                for s, full in enumerate(fulls)
            )
        )
        return path

    same = trace("a", ["a" * 32, None, "b" * 32])
    assert compare_whole_tensors(same, trace("b", ["a" * 32, None, "b" * 32])) == {
        "steps": 2,
        "first_differs": None,
    }
    assert compare_whole_tensors(same, trace("c", ["a" * 32, None, "c" * 32]))["first_differs"] == 2
    assert compare_whole_tensors(same, trace("d", [None, None, None])) is None


@needs_torchrun
@pytest.mark.slow
def test_a_dcp_checkpoint_of_two_processes_loads_into_four_with_a_warning(tmp_path):
    """DCP reshards: the whole parameters and optimizer moments saved by 2 ranks are what 4
    ranks hold after loading (the run itself cannot continue bit for bit, as warned)."""
    script("sharded_reshard.py", tmp_path)
    found = []
    for procs, mode in ((2, "save"), (4, "load")):
        result = subprocess.run(
            [TORCHRUN, "--standalone", "--nproc_per_node", str(procs), "sharded_reshard.py", mode,
             "ck"],
            cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr[-3000:]
        found.append(result.stdout)
    whole = [next(line for line in out.splitlines() if line.startswith("WHOLE")) for out in found]
    assert whole[0] == whole[1]
    assert "WARNED True" in found[1]
