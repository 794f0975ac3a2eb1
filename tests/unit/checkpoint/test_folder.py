"""One checkpoint folder on disk: verified against its index, removed only when twice wrote it,
and what a writer killed mid-save left swept by the next save."""

import os

import pytest
import torch

from twice import checkpoint
from twice.checkpoint.folder import is_twice_folder, remove_checkpoint, verify
from twice.checkpoint.index import INDEX, STATE, TENSORS, CheckpointIndex
from twice.core.errors import CheckpointError

DEAD_PID = 2**22 + 1  # above Linux's largest process id: no process has it


def test_a_saved_folder_verifies_to_its_index_of_files(tmp_path):
    target = checkpoint.save(tmp_path / "step-00000001", model=torch.nn.Linear(2, 2))
    index = verify(target)
    assert isinstance(index, CheckpointIndex) and set(index.files) == {TENSORS, STATE}
    assert index.files[TENSORS].size == (target / TENSORS).stat().st_size
    assert sorted(p.name for p in target.iterdir()) == sorted([INDEX, TENSORS, STATE])


def test_a_file_a_missing_path_and_a_linked_file_are_refused(tmp_path):
    target = checkpoint.save(tmp_path / "c", model=torch.nn.Linear(2, 2))
    with pytest.raises(CheckpointError, match="is a file, not a twice checkpoint folder"):
        verify(target / STATE)
    with pytest.raises(CheckpointError, match="no checkpoint at"):
        verify(tmp_path / "absent")
    (target / STATE).rename(tmp_path / "elsewhere.json")
    (target / STATE).symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises(CheckpointError, match=f"{STATE} is missing"):
        verify(target)


def test_only_a_folder_twice_wrote_is_removed(tmp_path):
    ours = checkpoint.save(tmp_path / "step-00000002", model=torch.nn.Linear(2, 2))
    theirs = tmp_path / "step-00000001"
    theirs.mkdir()
    (theirs / "notes.txt").write_text("mine")
    assert is_twice_folder(ours) and not is_twice_folder(theirs)
    assert not remove_checkpoint(theirs) and (theirs / "notes.txt").exists()
    assert remove_checkpoint(ours) and sorted(p.name for p in tmp_path.iterdir()) == [theirs.name]


def test_the_next_save_sweeps_what_a_dead_writer_left_and_spares_a_live_ones(tmp_path):
    dead = tmp_path / f".step-00000003.{DEAD_PID}.abc.tmp"
    live = tmp_path / f".step-00000004.{os.getpid()}.abc.tmp"
    for leftover in (dead, live):
        leftover.mkdir()
        (leftover / TENSORS).write_bytes(b"half")
    checkpoint.save(tmp_path / "step-00000005", model=torch.nn.Linear(2, 2))
    assert not dead.exists() and live.exists()
