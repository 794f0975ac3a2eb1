"""Evidence of inputs (issue 51): every file a run's processes read is recorded wherever it lies,
and a changed one is named as the cause of a difference, never nondeterminism inside the run.

ROWS is the matrix: each row is one kind of change between two runs of
tests/scripts/reads_everywhere.py, which reads its data from a folder beside the working folder
(`../data`, as most datasets lie outside the code). A new kind of read is one row. The rows share
one first run where they can (each changes one file, runs again and puts the file back); the
spawn row has its own pair, as a spawned worker costs a torch import. Real processes, the real
CLI, real files.
"""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import SCRIPTS, clean_env, twice

SHARED = "main,fork,memmap,json,weights,exec"  # what the shared first run reads


def _add_one(path: Path) -> None:
    values = np.fromfile(path, dtype=np.float32)
    values[5] += 1.0
    values.tofile(path)


def _lr(path: Path) -> None:
    path.write_text("lr = 0.2\n")


def _scale(path: Path) -> None:
    path.write_text(json.dumps({"scale": 0.25}))


def _weights(path: Path) -> None:
    torch.manual_seed(1)
    torch.save(torch.nn.Linear(4, 1).state_dict(), path)


@dataclass(frozen=True)
class Row:
    kind: str  # how the file is read
    changed: str  # the file changed, from the working folder
    change: object  # what is done to it
    named: str  # what the cause must say
    kinds: str = SHARED  # what both runs read


ROWS = {
    "a data file outside the folder, read in the main process": Row(
        "main", "../data/main.bin", _add_one, "the runs read different data: ../data/main.bin"
    ),
    "the same read in a DataLoader worker started by fork": Row(
        "fork", "../data/fork.bin", _add_one, "the runs read different data: ../data/fork.bin"
    ),
    "the same read in a DataLoader worker started by spawn": Row(
        "spawn", "../data/spawn.bin", _add_one, "../data/spawn.bin differs", kinds="spawn"
    ),
    "a data file read through np.memmap": Row(
        "memmap", "../data/mapped.bin", _add_one, "the runs read different data: ../data/mapped"
    ),
    "a config .py read with exec": Row(
        "exec", "config/train.py", _lr, "the code differs (config/train.py, read as data)"
    ),
    "a JSON config outside the folder": Row(
        "json", "../data/config.json", _scale, "the runs read different data: ../data/config.json"
    ),
    "a weights file loaded at start with torch.load": Row(
        "weights", "../data/init.pt", _weights, "the runs read different data: ../data/init.pt"
    ),
}


def _prepare(root: Path) -> None:
    work, data = root / "work", root / "data"
    (work / "config").mkdir(parents=True)
    data.mkdir()
    shutil.copy(SCRIPTS / "reads_everywhere.py", work)
    (work / "config" / "train.py").write_text("lr = 0.1\n")
    for index, name in enumerate(("main", "fork", "spawn", "mapped")):
        values = np.random.default_rng(index).standard_normal(16).astype(np.float32)
        values.tofile(data / f"{name}.bin")
    (data / "config.json").write_text(json.dumps({"scale": 0.5}))
    torch.manual_seed(0)
    torch.save(torch.nn.Linear(4, 1).state_dict(), data / "init.pt")


class Folder:
    """The working folder, its data beside it, and the first run of each set of kinds."""

    def __init__(self, root: Path):
        self.root, self.work = root, root / "work"
        self.env = clean_env(XDG_CACHE_HOME=str(root / "cache"))
        self.first: dict[str, Path] = {}
        self.count = 0

    def run(self, kinds: str) -> Path:
        self.count += 1
        name = f"r{self.count}"
        result = twice(
            "run", "--name", name, "--", sys.executable, "reads_everywhere.py", "../data", kinds,
            cwd=self.work, env=self.env,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        (found,) = (self.work / "runs").glob(f"*-{name}")
        return found

    def base(self, kinds: str) -> Path:
        if kinds not in self.first:
            self.first[kinds] = self.run(kinds)
        return self.first[kinds]

    def diff(self, a: Path, b: Path) -> tuple[int, dict]:
        result = twice("diff", "--json", a, b, cwd=self.work, env=self.env)
        assert result.returncode in (0, 1), result.stderr
        return result.returncode, json.loads(result.stdout)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Folder:
    root = tmp_path_factory.mktemp("evidence")
    _prepare(root)
    return Folder(root)


@pytest.mark.parametrize("row", list(ROWS.values()), ids=list(ROWS))
def test_a_changed_input_is_named_as_the_cause(folder, row):
    first = folder.base(row.kinds)
    path = folder.work / row.changed
    before = path.read_bytes()
    row.change(path)
    try:
        second = folder.run(row.kinds)
    finally:
        path.write_bytes(before)  # the other rows compare against the first run
    code, report = folder.diff(first, second)
    assert code == 1, report["verdict"]
    assert row.named in report["explanation"], report["explanation"]
    assert "nondeterminism" not in report["explanation"]


def test_nothing_changed_is_bit_identical_and_every_read_is_recorded(folder):
    first = folder.base(SHARED)
    code, report = folder.diff(first, folder.run(SHARED))
    assert code == 0 and report["verdict"].startswith("runs are bit-identical"), report
    manifest = json.loads((first / "manifest.json").read_text())
    data = str(folder.root / "data")
    assert sorted(manifest["identity"]["inputs"]) == [
        f"{data}/{name}"
        for name in ("config.json", "fork.bin", "init.pt", "main.bin", "mapped.bin")
    ]
    assert list(manifest["identity"]["code"]["read_as_data"]) == ["config/train.py"]
    entries = {e["path"]: e for e in manifest["context"]["inputs"]}
    fork = entries[f"{data}/fork.bin"]
    assert fork["outside"] and fork["inode"] > 0 and len(fork["xxh3"]) == 32
    coverage = manifest["context"]["inputs_coverage"]
    assert coverage["scope"] == "everywhere" and coverage["not_hashed"] == 0
    assert coverage["files"] == 5 and not coverage["unrecorded"]
