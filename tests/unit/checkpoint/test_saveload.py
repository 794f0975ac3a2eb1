"""Saving and loading checkpoints: every kind of state back bit for bit, strict about what is
restored, no pickle ever run, the latest good one found, the last N kept."""

import pickle
import random

import numpy as np
import pytest
import torch

from twice import checkpoint
from twice.checkpoint import CheckpointError
from twice.rng.seeding import capture_rng


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(3, 4)
        self.b = torch.nn.Linear(4, 2)
        self.tied = (
            self.a
        )  # the same tensors under two names: safetensors refuses shared memory unless handled
        self.register_buffer("steps", torch.tensor(0))


def trained():
    torch.manual_seed(0)
    model = Model()
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5)
    for _ in range(3):
        opt.zero_grad()
        model.b(model.a(torch.randn(5, 3))).sum().backward()
        opt.step()
        sched.step()
    return model, opt, sched


def test_save_and_load_restore_model_optimizer_scheduler_generators_rng_and_extras_exactly(
    tmp_path,
):
    model, opt, sched = trained()
    gen = torch.Generator().manual_seed(5)
    npgen = np.random.default_rng(7)
    gen.manual_seed(5), torch.rand(2, generator=gen), npgen.random(3)
    extras = {
        "epoch": 3,
        "best": float("nan"),
        "huge": 2**70,
        "ratio": 1 / 3,
        "tags": ("a", 1),
        "ids": {1: "x"},
    }
    checkpoint.save(
        tmp_path / "step-00000003",
        model=model,
        optimizer=opt,
        scheduler=sched,
        gen=gen,
        npgen=npgen,
        extras=extras,
        rng=capture_rng(),
    )
    expected_gen, expected_np = torch.rand(4, generator=gen), npgen.random(4)
    model2, opt2, sched2 = Model(), None, None
    opt2 = torch.optim.Adam(model2.parameters(), lr=0.1)
    sched2 = torch.optim.lr_scheduler.StepLR(opt2, 1, gamma=0.5)
    gen2, npgen2 = torch.Generator(), np.random.default_rng(0)
    out = checkpoint.load(
        tmp_path / "step-00000003",
        model=model2,
        optimizer=opt2,
        scheduler=sched2,
        gen=gen2,
        npgen=npgen2,
    )
    for (k, v), v2 in zip(model.state_dict().items(), model2.state_dict().values()):
        assert torch.equal(v, v2), k
    assert torch.equal(
        opt.state[opt.param_groups[0]["params"][0]]["exp_avg"],
        opt2.state[opt2.param_groups[0]["params"][0]]["exp_avg"],
    )
    assert (
        opt2.param_groups[0]["lr"] == opt.param_groups[0]["lr"]
        and sched2.last_epoch == sched.last_epoch
    )
    assert torch.equal(torch.rand(4, generator=gen2), expected_gen)
    assert npgen2.random(4).tobytes() == expected_np.tobytes()
    got = out["extras"]
    assert (
        got["epoch"] == 3
        and got["huge"] == 2**70
        and got["ratio"] == 1 / 3
        and got["tags"] == ("a", 1)
    )
    assert got["ids"] == {1: "x"} and got["best"] != got["best"]
    random.random()
    from twice.rng.seeding import restore_rng

    restore_rng(out["rng"])


def test_loading_is_strict_about_missing_and_unexpected_entries(tmp_path):
    model, opt, _ = trained()
    checkpoint.save(tmp_path / "c", model=model, optimizer=opt)
    with pytest.raises(CheckpointError, match="has no state for 'scaler'") as missing:
        checkpoint.load(tmp_path / "c", model=Model(), optimizer=opt, scaler=torch.nn.Linear(1, 1))
    assert "hint" not in missing.value.message and missing.value.hint
    with pytest.raises(
        CheckpointError, match="has state for 'optimizer' that nothing restores"
    ) as unexpected:
        checkpoint.load(tmp_path / "c", model=Model())
    # As a traceback prints it: the message, then the hint (here: how twice.Run users restore it).
    assert str(unexpected.value) == f"{unexpected.value.message}\nhint: {unexpected.value.hint}"
    assert "run.track(name=obj) before run.resume()" in unexpected.value.hint
    partial = Model()
    checkpoint.load(tmp_path / "c", strict=False, model=partial)
    assert torch.equal(partial.a.weight, model.a.weight)


def test_a_planted_malicious_pickle_is_refused_without_running_it(tmp_path):
    model, _, _ = trained()
    target = tmp_path / "c"
    checkpoint.save(target, model=model)
    marker = tmp_path / "pwned"

    class Exploit:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    (target / "model.pt").write_bytes(pickle.dumps(Exploit()))
    with pytest.raises(CheckpointError, match="files twice did not write: model.pt"):
        checkpoint.load(target, model=Model())
    # Replacing the tensors file itself with a pickle fails its digest, and safetensors never
    # unpickles.
    (target / "model.pt").unlink()
    torch.save({"x": Exploit()}, target / "tensors.safetensors")
    with pytest.raises(CheckpointError, match="tensors.safetensors is"):
        checkpoint.load(target, model=Model())
    with pytest.raises(CheckpointError, match="is a file, not a twice checkpoint"):
        checkpoint.load(target / "tensors.safetensors")
    assert not marker.exists()


def _flip_byte(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x40
    path.write_bytes(bytes(data))


def test_latest_skips_incomplete_and_corrupt_checkpoints_with_a_warning_and_keep_last_retains(
    tmp_path,
):
    model, _, _ = trained()
    for step in (1, 2, 3, 4):
        checkpoint.save(tmp_path / f"step-{step:08d}", keep_last=3, model=model)
    assert [p.name for p in checkpoint.list_checkpoints(tmp_path)] == [
        "step-00000002",
        "step-00000003",
        "step-00000004",
    ]
    _flip_byte(tmp_path / "step-00000004" / "tensors.safetensors")
    (tmp_path / "step-00000003" / "checkpoint.json").unlink()
    with pytest.warns(RuntimeWarning, match="skipping checkpoint step-00000004"):
        assert checkpoint.latest(tmp_path).name == "step-00000002"


def test_overwriting_a_checkpoint_replaces_it_whole(tmp_path):
    model, _, _ = trained()
    checkpoint.save(tmp_path / "c", model=model, extra={"v": 1})
    checkpoint.save(tmp_path / "c", model=model, extra={"v": 2})
    assert checkpoint.load(tmp_path / "c", model=Model())["extra"] == {"v": 2}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c"]


def test_objects_that_cannot_be_saved_are_refused_with_a_fix(tmp_path):
    with pytest.raises(CheckpointError, match="cannot save thing: a builtins.object") as refused:
        checkpoint.save(tmp_path / "c", thing=object())
    assert "state_dict" in refused.value.hint
    assert not (tmp_path / "c").exists() and not list(tmp_path.iterdir())


@pytest.mark.filterwarnings("ignore:Sparse")
def test_sparse_optimizer_state_round_trips_and_resumes_bit_for_bit(tmp_path):
    """SGD with momentum over sparse gradients keeps sparse momentum buffers: saved as their index
    and value tensors (uncoalesced as they are), and a resumed run matches the straight one."""
    import twice

    def setup():
        torch.manual_seed(0)
        embedding = torch.nn.Embedding(20, 3, sparse=True)
        return embedding, torch.optim.SGD(embedding.parameters(), lr=0.1, momentum=0.9)

    def train(embedding, optimizer, steps, seed):
        generator = torch.Generator().manual_seed(seed)
        for _ in range(steps):
            optimizer.zero_grad()
            embedding(torch.randint(0, 20, (6,), generator=generator)).pow(2).sum().backward()
            optimizer.step()

    straight, straight_opt = setup()
    train(straight, straight_opt, 3, seed=1)
    checkpoint.save(
        tmp_path / "c",
        model=straight,
        optimizer=straight_opt,
        extra={"csr": torch.eye(3).to_sparse_csr(), "bsc": torch.eye(4).to_sparse_bsc((2, 2))},
    )
    train(straight, straight_opt, 3, seed=2)
    resumed, resumed_opt = setup()
    restored = checkpoint.load(tmp_path / "c", model=resumed, optimizer=resumed_opt)
    buffer = resumed_opt.state[resumed.weight]["momentum_buffer"]
    assert buffer.layout == torch.sparse_coo and not buffer.is_coalesced()
    assert restored["extra"]["csr"].layout == torch.sparse_csr and torch.equal(
        restored["extra"]["csr"].to_dense(), torch.eye(3)
    )
    assert restored["extra"]["bsc"].layout == torch.sparse_bsc and torch.equal(
        restored["extra"]["bsc"].to_dense(), torch.eye(4)
    )
    train(resumed, resumed_opt, 3, seed=2)
    assert torch.equal(resumed.weight, straight.weight)
    assert twice.digest(resumed_opt.state[resumed.weight]["momentum_buffer"]) == twice.digest(
        straight_opt.state[straight.weight]["momentum_buffer"]
    )


@pytest.mark.filterwarnings(
    "ignore::DeprecationWarning"
)  # torch.compile's import of torch.jit internals
def test_a_state_saved_through_a_wrapper_and_restored_into_the_bare_module_names_the_wrapper(
    tmp_path,
):
    """torch.compile's `_orig_mod.` and DDP's `module.` prefixes: the usual reason a model's
    checkpoint does not fit. The hint names the wrapper, both ways round."""
    model = torch.nn.Linear(3, 2)
    compiled = torch.compile(model)  # no compilation happens until it is called
    checkpoint.save(tmp_path / "c", model=compiled)
    with pytest.raises(CheckpointError, match="does not fit") as bare:
        checkpoint.load(tmp_path / "c", model=torch.nn.Linear(3, 2))
    assert "torch.compile wrapper (its keys start with '_orig_mod.')" in bare.value.hint
    checkpoint.save(tmp_path / "d", model=model)
    with pytest.raises(CheckpointError, match="does not fit") as wrapped:
        checkpoint.load(
            tmp_path / "d", model=torch.nn.ModuleDict({"module": torch.nn.Linear(3, 2)})
        )
    assert "restored into a DistributedDataParallel or DataParallel wrapper" in wrapped.value.hint
    assert torch.equal(
        checkpoint.load(tmp_path / "c", model=torch.compile(torch.nn.Linear(3, 2)))[
            "model"
        ]._orig_mod.weight,
        model.weight,
    )


def test_keep_last_deletes_only_checkpoints_twice_wrote(tmp_path):
    """A foreign `step-1/` (someone's notes) beside the checkpoints is never deleted by
    retention."""
    foreign = tmp_path / "step-1"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    model, _, _ = trained()
    for step in range(2, 6):
        checkpoint.save(tmp_path / f"step-{step:08d}", keep_last=2, model=model)
    assert (foreign / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "step-00000004",
        "step-00000005",
        "step-1",
    ]


def test_a_resumed_optimizer_saves_the_same_bytes_as_the_straight_one(tmp_path):
    """Adam fills its per-parameter state 'step' first; a loaded state lists it in key order.
    Tensors are keyed in key order, so saving what was loaded gives the same files."""
    import twice.checkpoint

    model = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    twice.checkpoint.save(tmp_path / "straight", model=model, optimizer=opt)
    again = torch.optim.Adam(model.parameters(), lr=0.1)
    twice.checkpoint.load(tmp_path / "straight", model=model, optimizer=again)
    assert list(again.state_dict()["state"][0]) != list(opt.state_dict()["state"][0])
    twice.checkpoint.save(tmp_path / "resumed", model=model, optimizer=again)
    for name in ("state.json", "tensors.safetensors"):
        assert (tmp_path / "straight" / name).read_bytes() == (
            tmp_path / "resumed" / name
        ).read_bytes()


def test_checkpoints_are_listed_by_step_number_and_a_link_named_like_one_is_none(tmp_path):
    from twice.checkpoint.saveload import latest, list_checkpoints, step_dir

    assert list_checkpoints(tmp_path / "absent") == [] and latest(tmp_path / "absent") is None
    for step in (10, 9, 100):
        step_dir(tmp_path, step).mkdir()
    (tmp_path / "step-7").mkdir()
    (tmp_path / "step-00000200").symlink_to(tmp_path / "step-7")
    (tmp_path / "notes").mkdir()
    assert [p.name for p in list_checkpoints(tmp_path)] == [
        "step-7",
        "step-00000009",
        "step-00000010",
        "step-00000100",
    ]
