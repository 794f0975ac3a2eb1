"""Checkpoints with real processes: `twice checkpoint verify` on damaged and crafted checkpoints,
a filesystem that refuses a write, kills in the middle of retention (saving and loading in
process: tests/unit/checkpoint/)."""

import json

import pytest
import torch
from conftest import twice as twice_cli
from unit.checkpoint.test_index import _reseal
from unit.checkpoint.test_saveload import Model, _flip_byte, trained

from twice import checkpoint
from twice.checkpoint import CheckpointError


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
