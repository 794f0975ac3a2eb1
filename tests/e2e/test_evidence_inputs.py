"""Evidence of inputs (issue 51): every file a run's processes read is recorded wherever it lies,
and a changed one is named as the cause of a difference, never nondeterminism inside the run.

ROWS is the matrix: each row is one kind of change between two runs of
tests/e2e/scripts/reads_everywhere.py, which reads its data from a folder beside the working folder
(`../data`, as most datasets lie outside the code). A new kind of read is one row. The rows share
one first run where they can (each changes one file, runs again and puts the file back); the
spawn row has its own pair, as a spawned worker costs a torch import. Real processes, the real
CLI, real files.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
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


# What no record can compare: each row a way a run's data escaped the record, or was taken for
# the run's own product, and the cause must name the file or the gap instead of nondeterminism.
GAPS = '''"""Trains on data read in the ways named in argv[2] from argv[1]."""
import os, subprocess, sys
import numpy as np
import torch

data, modes = sys.argv[1], sys.argv[2].split(",")
values = np.zeros(4, dtype=np.float32)
for mode in ("stale", "future", "gone"):
    if mode in modes:
        with open(f"{data}/{mode}.f32", "rb") as handle:
            values += np.frombuffer(handle.read(), dtype=np.float32)
if "gone" in modes:
    os.remove(f"{data}/gone.f32")  # an inbox, emptied once read
if "stdin" in modes:
    values += np.array(sys.stdin.read().split(), dtype=np.float32)
if "cat" in modes:
    values += np.frombuffer(subprocess.check_output(["cat", f"{data}/cat.f32"]), np.float32)
model = torch.nn.Linear(4, 1)
batch = torch.from_numpy(values).view(1, 4).repeat(2, 1)
for _ in range(2):  # by hand: torch.optim's first import draws entropy of its own
    model.zero_grad()
    model(batch).pow(2).mean().backward()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter -= 0.1 * parameter.grad
'''
FUTURE = 10**9 * 86_400 * 365  # a year ahead, in nanoseconds


def _in_place_mtime_kept(path: Path) -> None:
    """`cp -p`, `rsync --inplace -t`, `touch -r`: new bytes, the same inode, size and mtime."""
    info = path.stat()
    with open(path, "r+b") as handle:
        handle.write(np.float32(7.0).tobytes())
    os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns))


def _bump(path: Path) -> None:
    (np.fromfile(path, dtype=np.float32) + 1).tofile(path)


def _bump_keep_future(path: Path) -> None:
    _bump(path)
    os.utime(path, ns=(time.time_ns() + FUTURE,) * 2)


@dataclass(frozen=True)
class Gap:
    changed: str  # the file changed, from the working folder; "-" for the piped text
    change: object
    named: str
    modes: str = "stale,future,gone,stdin"
    stdin: str = "file"  # the command's standard input: "file" (stdin.txt) or "pipe"


GAP_ROWS = {
    "a file rewritten in place with its inode, size and mtime kept": Gap(
        "../data/stale.f32", _in_place_mtime_kept, "the runs read different data: ../data/stale"
    ),
    "a data file whose mtime is in the future": Gap(
        "../data/future.f32", _bump_keep_future, "the runs read different data: ../data/fut"
    ),
    "a data file the run reads and deletes": Gap(
        "../data/gone.f32", _bump, "../data/gone.f32 was read but is gone: not compared"
    ),
    "data on standard input from a file": Gap(
        "stdin.txt", lambda p: p.write_text("9 9 9 9\n"), "read different data: stdin.txt"
    ),
    "data on standard input from a pipe": Gap(
        "-", None, "standard input was a pipe in A and B", "stdin,cat", "pipe"
    ),
    "data read by a program that is not Python": Gap(
        "../data/cat.f32",
        _bump,
        "a process that is not Python (cat) may have read files twice cannot see",
        "stdin,cat",
        "pipe",
    ),  # fmt: skip
}


class GapFolder(Folder):
    """The working folder for GAP_ROWS: the first run of each set of modes, shared."""

    def __init__(self, root: Path):
        super().__init__(root)
        (self.work / "gaps.py").write_text(GAPS)
        self.piped = "1 2 3 4\n"
        (self.work / "stdin.txt").write_text("1 2 3 4\n")
        for index, name in enumerate(("stale", "future", "cat")):
            path = root / "data" / f"{name}.f32"
            np.random.default_rng(10 + index).standard_normal(4).astype(np.float32).tofile(path)
        os.utime(root / "data" / "future.f32", ns=(time.time_ns() + FUTURE,) * 2)

    def restock(self) -> None:
        """The inbox the script deletes, back before each run."""
        inbox = self.root / "data" / "gone.f32"
        if not inbox.exists():
            np.arange(4, dtype=np.float32).tofile(inbox)

    def run(self, kinds: str, stdin: str = "file") -> Path:
        self.restock()
        self.count += 1
        name = f"g{self.count}"
        command = ("run", "--name", name, "--", sys.executable, "gaps.py", "../data", kinds)
        if stdin == "pipe":
            result = twice(*command, cwd=self.work, env=self.env, input=self.piped)
        else:
            with open(self.work / "stdin.txt", "rb") as handle:
                result = twice(*command, cwd=self.work, env=self.env, stdin=handle)
        assert result.returncode == 0, result.stderr
        (found,) = (self.work / "runs").glob(f"*-{name}")
        return found

    def base(self, kinds: str, stdin: str = "file") -> Path:
        if (kinds, stdin) not in self.first:
            self.first[kinds, stdin] = self.run(kinds, stdin)
        return self.first[kinds, stdin]


@pytest.fixture(scope="module")
def gaps(tmp_path_factory) -> GapFolder:
    root = tmp_path_factory.mktemp("gaps")
    _prepare(root)
    return GapFolder(root)


@pytest.mark.parametrize("row", list(GAP_ROWS.values()), ids=list(GAP_ROWS))
def test_data_no_record_compares_is_named_never_nondeterminism(gaps, row):
    first = gaps.base(row.modes, row.stdin)
    gaps.restock()
    if row.changed == "-":
        gaps.piped, before = "5 6 7 8\n", gaps.piped
    else:
        path = gaps.work / row.changed
        before = path.read_bytes()
        row.change(path)
    try:
        second = gaps.run(row.modes, row.stdin)
    finally:
        if row.changed == "-":
            gaps.piped = before
        else:
            path.write_bytes(before)  # the other rows compare against the first run
    code, report = gaps.diff(first, second)
    assert code == 1, report["verdict"]
    assert row.named in report["explanation"], report["explanation"]
    assert "nondeterminism" not in report["explanation"]
