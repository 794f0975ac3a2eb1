"""sweep.json and where a sweep's trials go: a folder named for the sweep, never a path out of the
runs folder; a spec read validated."""

import json

import pytest

from twice.core.errors import CorruptRecord, UsageError
from twice.store.files import write_json_atomic
from twice.store.sweeps import SWEEP_FILE, SweepSpec, read_sweep, sweep_folder


def test_the_same_sweep_lands_in_the_same_folder_and_another_sweep_in_another(tmp_path):
    grid = {"lr": ["0.1", "0.2"], "wd": ["0"]}
    first = sweep_folder(tmp_path, grid, seeds=3, command=["python", "t.py"])
    assert first.parent == tmp_path and first.name.startswith("sweep-lr-wd-")
    assert sweep_folder(tmp_path, grid, seeds=3, command=["python", "t.py"]) == first
    assert sweep_folder(tmp_path, grid, seeds=4, command=["python", "t.py"]) != first
    assert sweep_folder(tmp_path, {"a b/../c": ["1"]}).name.startswith("sweep-a_b_.._c-")
    assert sweep_folder(tmp_path, grid, name="mine") == tmp_path / "mine"
    with pytest.raises(UsageError):
        sweep_folder(tmp_path, grid, name="../elsewhere")


def test_a_spec_reads_back_as_written(tmp_path):
    spec = SweepSpec({"lr": ["0.1", "0.2"]}, 5, ["python", "t.py"], metric="val_loss")
    write_json_atomic(tmp_path / SWEEP_FILE, spec.to_json())
    assert read_sweep(tmp_path) == spec


@pytest.mark.parametrize(
    "change",
    [
        {"grid": {"lr": []}},
        {"grid": {"l r": ["1"]}},
        {"grid": {"lr": [0.1]}},
        {"seeds": 0},
        {"seeds": True},
        {"command": []},
        {"metric": 3},
    ],
)
def test_a_damaged_spec_is_a_corrupt_record(tmp_path, change):
    spec = {"grid": {"lr": ["0.1"]}, "seeds": 2, "command": ["python", "t.py"], **change}
    (tmp_path / SWEEP_FILE).write_text(json.dumps(spec))
    with pytest.raises(CorruptRecord, match="is not a sweep spec"):
        read_sweep(tmp_path)


def test_a_folder_without_a_spec_is_not_a_sweep_folder(tmp_path):
    with pytest.raises(UsageError, match="is not a sweep folder"):
        read_sweep(tmp_path)
