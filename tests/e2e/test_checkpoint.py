import json
import pickle
import random

import numpy as np
import pytest
import torch
from conftest import twice as twice_cli

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


@pytest.mark.parametrize(
    "damage, message",
    [
        (
            lambda d: (d / "tensors.safetensors").write_bytes(
                (d / "tensors.safetensors").read_bytes()[:-10]
            ),
            "truncated",
        ),
        (lambda d: _flip_byte(d / "tensors.safetensors"), "corrupt"),
        (lambda d: _flip_byte(d / "state.json"), "corrupt"),
        (lambda d: (d / "state.json").unlink(), "missing"),
        (lambda d: (d / "checkpoint.json").unlink(), "incomplete"),
        (lambda d: (d / "notes.txt").write_text("hi"), "did not write: notes.txt"),
    ],
)
def test_damaged_checkpoints_are_errors_naming_the_file_and_exit_2_in_the_cli(
    tmp_path, damage, message
):
    model, _, _ = trained()
    target = checkpoint.save(tmp_path / "step-00000001", model=model)
    damage(target)
    with pytest.raises(CheckpointError, match=message):
        checkpoint.load(target, model=Model())
    result = twice_cli("checkpoint", "verify", target, cwd=tmp_path)
    assert (
        result.returncode == 2 and result.stderr.startswith("error: ") and "hint: " in result.stderr
    )
    assert "Traceback" not in result.stderr


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


def _bits(tensor):
    """The tensor's bytes in logical order: compares dtypes torch.equal has no kernel for."""
    return tensor.contiguous().reshape(-1).view(torch.uint8)


def test_dtypes_safetensors_cannot_name_round_trip_exactly(tmp_path):
    """complex128 (a physics model's state), complex32 and float8_e8m0fnu have no safetensors dtype:
    they are stored as their bytes, and come back with their dtype, shape and every bit."""
    torch.manual_seed(0)
    values = {
        "c128": torch.randn(3, 2, dtype=torch.complex128),
        "c128_t": torch.randn(3, 4, dtype=torch.complex128).t(),
        "c128_0d": torch.tensor(1 - 2j, dtype=torch.complex128),
        "odd": torch.tensor([1, 2, 3], dtype=torch.uint8),
        "c32": torch.randn(4, dtype=torch.complex64).to(torch.complex32),
        "empty": torch.empty(0, 2, dtype=torch.complex128),
    }
    if hasattr(torch, "float8_e8m0fnu"):
        values["e8m0"] = torch.tensor([0.5, 1.0, 8.0]).to(torch.float8_e8m0fnu)
    back = checkpoint.load(checkpoint.save(tmp_path / "c", extra=values))["extra"]
    for name, value in values.items():
        assert back[name].dtype == value.dtype and back[name].shape == value.shape, name
        assert torch.equal(_bits(back[name]), _bits(value)), name


def test_a_quantized_tensor_is_refused_naming_where_it_is(tmp_path):
    quantized = torch.quantize_per_tensor(torch.randn(3), 0.1, 0, torch.qint8)
    with pytest.raises(
        CheckpointError, match=r"cannot save extra\.q: a quantized tensor"
    ) as refused:
        checkpoint.save(tmp_path / "c", extra={"q": quantized})
    assert "int_repr" in refused.value.hint and not (tmp_path / "c").exists()


def test_a_save_the_filesystem_refuses_is_an_error_with_a_hint_and_the_old_checkpoint_stays(
    tmp_path,
):
    """A parent that is a file, and a write that fails half-way (the process may write no more
    than 4 kB to a file: RLIMIT_FSIZE, a real short write): a CheckpointError naming the folder,
    the previous checkpoint intact and no temporary left behind."""
    import subprocess
    import sys

    (tmp_path / "a_file").write_text("")
    with pytest.raises(CheckpointError, match="cannot write checkpoint") as refused:
        checkpoint.save(tmp_path / "a_file" / "step-1", model=Model())
    assert (
        "a part of the path is a file" in refused.value.hint and "a_file" in refused.value.message
    )
    code = (
        "import resource, signal, sys, torch\n"
        "from twice import checkpoint\n"
        "from twice.checkpoint import CheckpointError\n"
        "checkpoint.save('c', model=torch.nn.Linear(2, 2), extra={'v': 1})\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))\n"
        "try:\n"
        "    checkpoint.save('c', model=torch.nn.Linear(100, 100), extra={'v': 2})\n"
        "except CheckpointError as exc:\n"
        "    print(exc.render())\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert result.stdout.startswith("error: cannot write checkpoint c: File too large"), (
        result.stdout + result.stderr
    )
    assert "hint: a file is larger than this process may write (ulimit -f)" in result.stdout
    assert checkpoint.load(tmp_path / "c", model=torch.nn.Linear(2, 2))["extra"] == {"v": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file", "c"]


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


def _reseal(target, edit):
    """Edit a checkpoint's index as a crafter would: change it, then recompute its own digest."""
    from twice.checkpoint.index import index_bytes

    index = json.loads((target / "checkpoint.json").read_text())
    index.pop("self")
    edit(index)
    (target / "checkpoint.json").write_bytes(index_bytes(index))


@pytest.mark.parametrize("kind", ["statefum", "", None, 3, ["stateful"]])
def test_an_entry_kind_twice_does_not_write_is_refused_not_left_at_its_fresh_state(tmp_path, kind):
    """One flipped byte in the index ("stateful" -> "statefum") once loaded as success with the
    model untouched. The index's own digest catches the flip; resealed, the kind is still refused:
    kinds come from one table and a name outside it is a CheckpointError everywhere."""
    model, opt, _ = trained()
    target = checkpoint.save(tmp_path / "step-00000001", model=model, optimizer=opt)
    index = json.loads((target / "checkpoint.json").read_text())
    index["entries"]["model"] = kind
    (target / "checkpoint.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="do not match its own digest"):
        checkpoint.verify(target)
    _reseal(target, lambda index: index["entries"].__setitem__("model", kind))
    with pytest.raises(CheckpointError, match="'model'"):
        checkpoint.verify(target)
    fresh = Model()
    with pytest.raises(CheckpointError, match="not a kind twice writes"):
        checkpoint.load(target, model=fresh, optimizer=torch.optim.Adam(fresh.parameters()))
    result = twice_cli("checkpoint", "verify", target, cwd=tmp_path)
    assert (
        result.returncode == 2 and "error: " in result.stderr and "Traceback" not in result.stderr
    )


def test_one_flipped_bit_anywhere_in_the_index_is_refused(tmp_path):
    """Every single-bit flip of checkpoint.json (sampled across its bytes) is an error, never
    `valid`."""
    model, opt, _ = trained()
    target = checkpoint.save(tmp_path / "step-00000001", model=model, optimizer=opt)
    original = (target / "checkpoint.json").read_bytes()
    for position in range(0, len(original), max(1, len(original) // 97)):
        for bit in (0, 3, 6):
            flipped = bytearray(original)
            flipped[position] ^= 1 << bit
            (target / "checkpoint.json").write_bytes(bytes(flipped))
            try:
                checkpoint.verify(target)
            except CheckpointError:
                continue
            # whitespace that JSON ignores may flip to other whitespace: the same index
            assert json.loads(bytes(flipped)) == json.loads(original), (position, bit)


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda i: i["files"].__setitem__("../x", i["files"].pop("state.json")), "files"),
        (lambda i: i["files"].__setitem__("/etc/passwd", {"size": 1, "digest": "0" * 32}), "files"),
        # checked as verify checks it, before any target: the state holds an entry it does not
        (lambda i: i["entries"].pop("model"), r"the index lists \['optimizer'\]"),
    ],
)
def test_a_crafted_index_cannot_point_outside_its_folder_or_drop_an_entry(tmp_path, edit, message):
    model, opt, _ = trained()
    target = checkpoint.save(tmp_path / "step-00000001", model=model, optimizer=opt)
    _reseal(target, edit)
    fresh = Model()
    with pytest.raises(CheckpointError, match=message):
        checkpoint.load(target, model=fresh, optimizer=torch.optim.Adam(fresh.parameters()))


def test_every_kind_in_the_table_round_trips_through_save_and_load(tmp_path):
    from twice.checkpoint.kinds import KINDS, kind_of

    model, opt, _ = trained()
    generator = torch.Generator().manual_seed(3)
    rng = np.random.default_rng(4)
    objects = {"model": model, "generator": generator, "rng": rng, "value": {"epoch": 2}}
    assert {kind_of(obj).name for obj in objects.values()} | {"sharded_optimizer"} == {
        kind.name for kind in KINDS
    }
    path = checkpoint.save(tmp_path / "step-00000002", **objects)
    expected_torch, expected_np = torch.rand(4, generator=generator), rng.random(4)
    fresh, new_generator, new_rng = (
        Model(),
        torch.Generator().manual_seed(9),
        np.random.default_rng(9),
    )
    restored = checkpoint.load(path, model=fresh, generator=new_generator, rng=new_rng)
    assert restored["value"] == {"epoch": 2}
    assert all(
        torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), model.state_dict().values())
    )
    assert torch.equal(torch.rand(4, generator=new_generator), expected_torch)
    assert np.array_equal(new_rng.random(4), expected_np)


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


_SAVER = """
import sys, torch
from twice import checkpoint
model = torch.nn.Linear(256, 256)
step = int(sys.argv[2])
print("ready", flush=True)
while True:
    checkpoint.save(f"{sys.argv[1]}/step-{step:08d}", keep_last=2, model=model)
    step += 1
    print(step, flush=True)
"""


@pytest.mark.slow
def test_retention_survives_kills_and_the_next_save_cleans_what_they_left(tmp_path):
    """SIGKILL a process that saves with keep_last=2 at moments spread over its saves: every
    `step-*` folder left is a whole, valid checkpoint, and the next save removes every leftover
    (temporaries, folders moved aside or half deleted)."""
    import signal
    import subprocess
    import sys
    import time

    script = tmp_path / "saver.py"
    script.write_text(_SAVER)
    folder = tmp_path / "ckpt"
    step = 0
    for attempt in range(12):
        proc = subprocess.Popen(
            [sys.executable, str(script), str(folder), str(step)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout.readline().strip() == "ready"
        for _ in range(3):  # let a few saves (and deletions) complete
            proc.stdout.readline()
        time.sleep(0.003 * attempt)  # then kill at a moment that moves with each attempt
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        step += 10  # the next process starts further on (or overwrites: both are tested)
        for path in checkpoint.list_checkpoints(folder):
            checkpoint.verify(path)  # raises for a half-written or half-deleted checkpoint
    model = torch.nn.Linear(256, 256)
    checkpoint.save(folder / f"step-{step + 1000:08d}", keep_last=2, model=model)
    assert sorted(p.name for p in folder.iterdir()) == [
        p.name for p in checkpoint.list_checkpoints(folder)
    ]
    assert len(checkpoint.list_checkpoints(folder)) == 2


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
