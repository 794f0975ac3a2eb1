"""Only twice's decoders read a checkpoint. A real sharded checkpoint (two gloo processes, FSDP2,
saved through DCP) whose `dcp/.metadata`, or one of whose pieces, is a crafted pickle, with
every digest resealed, is refused alike by `twice checkpoint verify`, by twice.checkpoint.load
and by `twice run --resume`, and the pickle never runs; the valid one loads bit for bit."""

import dataclasses
import json
import os
import pickle
import shutil
import subprocess
import sys
import warnings

import pytest
import torch
import xxhash
from conftest import SCRIPTS, clean_env, twice

import twice.checkpoint as checkpoint
from twice.checkpoint.index import index_bytes
from twice.store import dcpmeta


class _Touch:
    """A pickle that, when unpickled by plain pickle, runs `touch MARKER`."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A checkpoint of an FSDP2 model and its AdamW, saved by two real processes through DCP,
    and beside it the whole tensors they held (`.whole.safetensors`)."""
    root = tmp_path_factory.mktemp("sharded")
    folder = root / "checkpoints" / "step-00000001"
    store = root / "store"
    procs = [
        subprocess.Popen(
            [sys.executable, str(SCRIPTS / "sharded_save.py"), str(folder), str(rank), str(store)],
            env=clean_env(OMP_NUM_THREADS="1"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for rank in (0, 1)
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err.decode()[-3000:]
    assert sorted(p.name for p in (folder / "dcp").iterdir()) == [
        ".metadata",
        "__0_0.distcp",
        "__1_0.distcp",
    ]
    return folder


def _fresh(mesh):
    """The saved model's shape, other values, sharded on this process's mesh."""
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    fully_shard(model, mesh=mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=0.5)


def _load(folder, mesh):
    model, opt = _fresh(mesh)
    with warnings.catch_warnings():  # saved by 2 processes, loaded by 1: warned, as it should be
        warnings.simplefilter("ignore", RuntimeWarning)
        checkpoint.load(folder, world_size_change=True, model=model, optimizer=opt)
    return model, opt


def _reseal(folder):
    """Every digest recomputed, as anyone who can write the folder can: each DCP file's size and
    digest, each rank part's, and the index's own."""
    body = json.loads((folder / "checkpoint.json").read_text())
    body.pop("self")
    for name in body["sharded"]["files"]:
        data = (folder / "dcp" / name).read_bytes()
        body["sharded"]["files"][name] = {
            "size": len(data),
            "digest": xxhash.xxh3_128_hexdigest(data),
        }
    for part in body["parts"]:
        body["parts"][part] = xxhash.xxh3_128_hexdigest(
            (folder / part / "checkpoint.json").read_bytes()
        )
    (folder / "checkpoint.json").write_bytes(index_bytes(body))


def _crafted_metadata(folder, marker):
    (folder / "dcp" / ".metadata").write_bytes(pickle.dumps(_Touch(marker)))


def _crafted_piece(folder, marker):
    """The optimizer's learning rate (a value DCP stores as a `torch.save` pickle, which its
    default planner unpickles with weights_only=False) replaced by one that runs code; the
    metadata, a genuine record, re-pointed at it."""
    where = folder / "dcp" / ".metadata"
    metadata = dcpmeta.read(where.read_bytes(), str(where))
    key = next(k for k in metadata.storage_data if k.fqn == "optimizer.param_groups.0.lr")
    info = metadata.storage_data[key]
    data = folder / "dcp" / info.relative_path
    evil = __import__("io").BytesIO()
    torch.save(_Touch(marker), evil)
    offset = data.stat().st_size
    with data.open("ab") as handle:
        handle.write(evil.getvalue())
    metadata.storage_data[key] = dataclasses.replace(
        info, offset=offset, length=len(evil.getvalue())
    )
    where.write_bytes(pickle.dumps(metadata))


@pytest.mark.parametrize(
    ("craft", "refusal"),
    [
        (_crafted_metadata, "posix.system is not part of DCP's metadata"),
        (_crafted_piece, "optimizer.param_groups.0.lr cannot be read"),
    ],
)
def test_a_crafted_pickle_in_a_resealed_sharded_checkpoint_is_refused_and_never_run(
    saved, tmp_path, one_rank_mesh, craft, refusal
):
    marker = tmp_path / "MARKER"
    crafted = tmp_path / "checkpoints" / "step-00000001"
    shutil.copytree(saved, crafted)
    craft(crafted, marker)
    _reseal(crafted)
    # the index checks itself and every digest: only decoding can tell
    from twice.checkpoint.folder import verify as digests_only

    digests_only(crafted)
    result = twice("checkpoint", "verify", crafted, cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert refusal in result.stderr and "Traceback" not in result.stderr
    with pytest.raises(checkpoint.CheckpointError, match=refusal):
        _load(crafted, one_rank_mesh)
    with pytest.warns(RuntimeWarning, match="skipping checkpoint step-00000001"):
        assert checkpoint.latest(crafted.parent) is None
    # `twice run --resume`, of the checkpoint or of the folder holding it: refused before the
    # command starts (it would write RAN)
    (tmp_path / "train.py").write_text("open('RAN', 'w').close()\n")
    for source in (crafted, crafted.parent):
        result = twice("run", "--resume", source, "--", sys.executable, "train.py", cwd=tmp_path)
        assert result.returncode == 2, result.stdout + result.stderr
        assert "\nerror: " in f"\n{result.stderr}" and "Traceback" not in result.stderr
    assert not (tmp_path / "RAN").exists()
    assert not marker.exists()


def test_a_valid_sharded_checkpoint_loads_bit_for_bit(saved, one_rank_mesh):
    from safetensors.torch import load_file

    assert twice("checkpoint", "verify", saved, cwd=saved.parent).returncode == 0
    model, opt = _load(saved, one_rank_mesh)
    whole = load_file(f"{saved}.whole.safetensors")
    for name, param in model.named_parameters():
        assert torch.equal(param.full_tensor(), whole[name]), name
        for moment in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(opt.state[param][moment].full_tensor(), whole[f"{name}.{moment}"])
    assert opt.param_groups[0]["lr"] == 0.01  # a value DCP stores as bytes, decoded weights-only
    assert checkpoint.latest(saved.parent) == saved


def test_state_that_does_not_fit_the_objects_is_a_checkpoint_error(saved, one_rank_mesh):
    from torch.distributed.fsdp import fully_shard

    wider = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    fully_shard(wider, mesh=one_rank_mesh)
    opt = torch.optim.AdamW(wider.parameters())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        with pytest.raises(checkpoint.CheckpointError, match="does not load into 'model'"):
            checkpoint.load(saved, world_size_change=True, model=wider, optimizer=opt)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({}, "holds no step counters and RNG states of twice.Run"),
        (
            {"__counters__": {"step": 1, "epoch": 0}, "__rng__": {"torch": torch.arange(3)}},
            "holds RNG states this process cannot take",
        ),
    ],
)
def test_run_resume_of_a_checkpoint_without_twice_runs_counters_or_rngs_is_a_checkpoint_error(
    tmp_path, extra, message
):
    import twice

    saved = checkpoint.save(tmp_path / "plain", model=torch.nn.Linear(2, 1), **extra)
    with twice.Run(runs_dir=tmp_path / "runs", determinism="warn") as run:
        run.track(model=torch.nn.Linear(2, 1))
        with pytest.raises(checkpoint.CheckpointError, match=message):
            run.resume(saved)
