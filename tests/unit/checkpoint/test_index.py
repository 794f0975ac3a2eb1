"""A checkpoint's index: its own digest, so one flipped bit anywhere is refused; resealed by a
crafter, it still cannot point outside its folder or drop an entry."""

import json

import pytest
import torch

from twice import checkpoint
from twice.checkpoint import CheckpointError
from unit.checkpoint.test_saveload import Model, trained


def _reseal(target, edit):
    """Edit a checkpoint's index as a crafter would: change it, then recompute its own digest."""
    from twice.checkpoint.index import index_bytes

    index = json.loads((target / "checkpoint.json").read_text())
    index.pop("self")
    edit(index)
    (target / "checkpoint.json").write_bytes(index_bytes(index))


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


def test_an_index_reads_back_with_its_entries_kinds_and_files(tmp_path):
    from twice.checkpoint.index import (
        FORMAT,
        STATE,
        TENSORS,
        CheckpointIndex,
        part_name,
        read_index,
        step_name,
    )

    model, opt, _ = trained()
    target = checkpoint.save(tmp_path / step_name(12), model=model, optimizer=opt)
    assert target.name == "step-00000012" and part_name(3) == "rank-00003"
    index = read_index(target)
    assert isinstance(index, CheckpointIndex) and index.format == FORMAT
    assert {name: kind.name for name, kind in index.entries.items()} == {
        "model": "stateful",
        "optimizer": "stateful",
    }
    assert set(index.files) == {TENSORS, STATE}
    with pytest.raises(CheckpointError, match="has no checkpoint.json"):
        read_index(tmp_path)
