"""The perturbation matrix: two real runs of one small script that differ in exactly one thing, and
what `twice diff` says about them. Each row is one kind of change; the cause must name it (or
name the evidence that is missing), and never blame "nondeterminism inside the run".

Each change is tried in each shape of training loop (LOOPS: a validation pass between steps, an
evaluation forward before the update, an update by hand), so that what a loop reads or runs
besides its training never hides the change. A new kind of change is one row of CHANGES, a new
shape of loop one entry of LOOPS. `make test` draws a seeded sample of the pairs;
`make test-slow` (TWICE_EXHAUSTIVE=1) runs them all.
"""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from conftest import clean_env

EXHAUSTIVE = os.environ.get("TWICE_EXHAUSTIVE") == "1"
SAMPLE = 6

# What every script does once its prelude has set LR and batches(): train a linear model, in one
# of several shapes of loop (LOOPS). {before} runs before the step's forward, {step} ends it.
TRAIN = """
if __name__ == "__main__":  # a spawned worker imports the script: it must not train
    model = torch.nn.Linear(4, 1)
    {load}
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    VAL = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(torch.ones(8, 4), torch.ones(8, 1)), batch_size=4)
    TEACHER = torch.nn.Linear(4, 1)
    for x, y in batches():
{before}
        loss = ((model(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
{step}
"""
BY_HAND = """\
            for p in model.parameters():
                p -= LR * p.grad
                p.grad = None"""
LOOPS = {  # (what runs before the forward, how the step ends)
    "an optimizer loop": ("", "        opt.step()"),
    "a validation loader after each step": (
        "",
        "        opt.step()\n        with torch.no_grad():\n"
        "            for vx, vy in VAL:\n                model(vx)",
    ),
    "a validation loader read with gradients on": (
        "",
        "        opt.step()\n        for vx, vy in VAL:\n"
        "            with torch.no_grad():\n                model(vx)",
    ),
    "an evaluation forward before the update": (
        "",
        "        with torch.no_grad():\n            model(torch.ones(2, 4))\n        opt.step()",
    ),
    "a teacher without gradients, the labels through functions only": (
        "        with torch.no_grad():\n            t = TEACHER(x)\n        y = (y + t) / 2",
        "        opt.step()",
    ),
    "an update by hand": ("", "        with torch.no_grad():\n" + BY_HAND),
    "an update by hand after a validation loader": (
        "",
        "        with torch.no_grad():\n            for vx, vy in VAL:\n"
        "                model(vx)\n" + BY_HAND,
    ),
}
HEAD = "import json, os, random, sys, time\nimport numpy as np\nimport torch\n"
ROWS = "torch.frombuffer(bytearray({data}), dtype=torch.float32).reshape(-1, 5)"
FROM_FILE = ROWS.format(data="open(DATA, 'rb').read()")
MAIN_BATCHES = f"""
DATA = os.path.join('..', 'data', 'train.bin')
LR = 0.1
rows = {FROM_FILE}
def batches():
    return [(rows[i:i + 8, :4], rows[i:i + 8, 4:]) for i in range(0, 32, 8)]
"""
INSIDE_BATCHES = MAIN_BATCHES.replace("os.path.join('..', 'data', 'train.bin')", "'train.bin'")
MEMMAP_BATCHES = MAIN_BATCHES.replace(
    FROM_FILE,
    "torch.from_numpy(np.array(np.memmap(DATA, dtype=np.float32, mode='r'))).reshape(-1, 5)",
)
WORKER_BATCHES = """
DATA = os.path.abspath(os.path.join('..', 'data', 'train.bin'))
LR = 0.1
class Rows(torch.utils.data.Dataset):
    def __len__(self):
        return 32
    def __getitem__(self, i):
        with open(DATA, 'rb') as f:  # read in the worker only
            f.seek(i * 20)
            row = torch.frombuffer(bytearray(f.read(20)), dtype=torch.float32)
        return row[:4], row[4:]
def batches():
    workers = WORKERS
    return torch.utils.data.DataLoader(
        Rows(), batch_size=8, num_workers=workers,
        multiprocessing_context='{method}' if workers else None)
WORKERS = 1
"""
RANDOM_BATCHES = """
def batches():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 4, generator=g)
    return [(x[i:i + 8], x[i:i + 8].sum(1, keepdim=True)) for i in range(0, 32, 8)]
"""

# The script seeds torch once with a constant and draws its batches from torch's generator.
SEEDED_ONCE = "torch.manual_seed(1234)\nLR = 0.1\n" + RANDOM_BATCHES.replace(
    "torch.Generator().manual_seed(0)", "None"
).replace("generator=g", "generator=None")


def _data(value: float, first: int = 16, last: int = 32) -> bytes:
    """32 rows of 5 values (4 batches of 8); `value` scales rows [first, last): by default
    the first two batches of every run are the same, so a change first shows at a later step,
    after a loop's evaluation ran."""
    import numpy as np

    rows = np.arange(32 * 5, dtype=np.float32).reshape(32, 5) / 100
    rows[first:last] *= value
    return rows.tobytes()


@dataclass
class Change:
    """One kind of change between two runs of one script."""

    name: str
    prelude: str  # code that sets LR and defines batches()
    says: str  # a regex `twice diff`'s output must match
    exits: tuple[int, ...] = (1,)
    load: str = ""  # code run after the model is made (a weights file loaded)
    files: tuple[dict, dict] = ({}, {})  # per run: {path relative to the work folder: bytes}
    env: tuple[dict, dict] = ({}, {})
    args: tuple[list, list] = ([], [])
    options: tuple[list, list] = ([], [])  # twice run's own options
    extra: dict = field(default_factory=dict)  # files both runs share
    # the script's name in each run: a path, or "-m" and a module in the folder
    scripts: tuple[str, str] = ("script.py", "script.py")
    batch: bool = False  # the change reaches the training batches: the diff must say so
    unseen: bool = False  # it reaches them first at a step not traced: no stage may be blamed


def _pkg(version: str) -> dict:
    """An installed package, fakepkg, at `version`, in a folder of its own (another environment)."""
    return {
        f"../pkgs-{version}/fakepkg/__init__.py": f"SCALE = {version}\n".encode(),
        f"../pkgs-{version}/fakepkg-{version}.dist-info/METADATA": (
            f"Metadata-Version: 2.1\nName: fakepkg\nVersion: {version}\n".encode()
        ),
    }


CHANGES = [
    Change(
        "a data file outside the folder, read in the main process",
        MAIN_BATCHES,
        r"train\.bin",
        files=({"../data/train.bin": _data(1)}, {"../data/train.bin": _data(2)}),
        batch=True,
    ),
    Change(
        "a data file outside the folder, changed where a step is not traced",
        MAIN_BATCHES,
        r"train\.bin",
        files=({"../data/train.bin": _data(1, 8, 16)}, {"../data/train.bin": _data(2, 8, 16)}),
        options=(["--trace-every", "2"], ["--trace-every", "2"]),
        unseen=True,
    ),
    Change(
        "a data file inside the folder, read in the main process",
        INSIDE_BATCHES,
        r"train\.bin",
        files=({"train.bin": _data(1)}, {"train.bin": _data(2)}),
        batch=True,
    ),
    Change(
        "a data file outside the folder, read in a forked DataLoader worker",
        WORKER_BATCHES.format(method="fork"),
        r"train\.bin",
        files=({"../data/train.bin": _data(1)}, {"../data/train.bin": _data(2)}),
        batch=True,
    ),
    Change(
        "a data file outside the folder, read in a spawned DataLoader worker",
        WORKER_BATCHES.format(method="spawn"),
        r"train\.bin",
        files=({"../data/train.bin": _data(1)}, {"../data/train.bin": _data(2)}),
        batch=True,
    ),
    Change(
        "a data file outside the folder, read through a memmap",
        MEMMAP_BATCHES,
        r"train\.bin",
        files=({"../data/train.bin": _data(1)}, {"../data/train.bin": _data(2)}),
        batch=True,
    ),
    Change(
        "a config read with exec",
        "exec(open('config/cfg.py').read())\n" + RANDOM_BATCHES,
        r"cfg\.py",
        files=({"config/cfg.py": b"LR = 0.1\n"}, {"config/cfg.py": b"LR = 0.2\n"}),
    ),
    Change(
        "a YAML config",
        "import yaml\nLR = yaml.safe_load(open('cfg.yaml'))['lr']\n" + RANDOM_BATCHES,
        r"cfg\.yaml",
        files=({"cfg.yaml": b"lr: 0.1\n"}, {"cfg.yaml": b"lr: 0.2\n"}),
    ),
    Change(
        "a JSON config outside the folder",
        "LR = json.load(open('../cfg.json'))['lr']\n" + RANDOM_BATCHES,
        r"cfg\.json",
        files=({"../cfg.json": b'{"lr": 0.1}'}, {"../cfg.json": b'{"lr": 0.2}'}),
    ),
    Change(
        "a config on the command line",
        "LR = float(sys.argv[1])\n" + RANDOM_BATCHES,
        r"command lines differ|argv",
        args=(["0.1"], ["0.2"]),
    ),
    Change(
        "a config in an environment variable",
        "LR = float(os.environ['LR'])\n" + RANDOM_BATCHES,
        r"\bLR\b",
        env=({"LR": "0.1"}, {"LR": "0.2"}),
    ),
    Change(
        "the script seeds torch with a constant",
        SEEDED_ONCE,
        r"bit-identical",
        exits=(0,),
    ),
    *(
        Change(
            f"the script {how}renamed (its seeding the same line)",
            SEEDED_ONCE,
            r"bit-identical(?![\s\S]*seeds torch)",
            exits=(0,),
            scripts=scripts,
        )
        for how, scripts in (
            ("", ("script.py", "renamed.py")),
            ("run as a module, ", ("-m pkg.train", "-m pkg.renamed")),
        )
    ),
    Change(
        "the script seeds torch from the clock",
        "torch.manual_seed(time.time_ns())\nLR = 0.1\n"
        "def batches():\n    x = torch.randn(32, 4)\n"
        "    return [(x[i:i + 8], x[i:i + 8].sum(1, keepdim=True)) for i in range(0, 32, 8)]\n",
        r"seeds torch itself at script\.py:\d+, with another value in each run",
    ),
    Change(
        "the script seeds torch from os.urandom",
        "torch.manual_seed(int.from_bytes(os.urandom(7), 'little'))\nLR = 0.1\n"
        "def batches():\n    x = torch.randn(32, 4)\n"
        "    return [(x[i:i + 8], x[i:i + 8].sum(1, keepdim=True)) for i in range(0, 32, 8)]\n",
        r"seeds torch itself at script\.py:\d+",
    ),
    Change(
        "a package version",
        "import fakepkg\nLR = 0.1 * fakepkg.SCALE\n" + RANDOM_BATCHES,
        r"fakepkg",
        files=(_pkg("1.0"), _pkg("2.0")),
        env=({"PYTHONPATH": "../pkgs-1.0"}, {"PYTHONPATH": "../pkgs-2.0"}),
    ),
    Change(
        "the thread count",
        "torch.set_num_threads(int(sys.argv[1]))\nLR = 0.1\n" + RANDOM_BATCHES,
        r"thread",
        exits=(0, 1),
        args=(["1"], ["2"]),
    ),
    Change(
        "the hash seed",
        "LR = 0.1\norder = sorted(range(4), key=lambda i: hash(str(i)))\n"
        + RANDOM_BATCHES.replace("for i in range(0, 32, 8)]", "for i in [o * 8 for o in order]]"),
        r"PYTHONHASHSEED",
        env=({"PYTHONHASHSEED": "5"}, {"PYTHONHASHSEED": "7"}),
        batch=True,
    ),
    Change(
        "num_workers",
        WORKER_BATCHES.format(method="fork").replace(
            "num_workers=1", "num_workers=int(sys.argv[1])"
        ),
        r"command lines differ|argv",
        exits=(0, 1),
        args=(["0"], ["1"]),
        extra={"../data/train.bin": _data(1)},
    ),
    Change(
        "a weights file loaded at start",
        "LR = 0.1\n" + RANDOM_BATCHES,
        r"weights\.pt",
        load="model.load_state_dict(torch.load('../weights.pt'))",
        files=({"../weights.pt": "w1"}, {"../weights.pt": "w2"}),
    ),
    *(
        Change(
            f"the recording setting {option} {value}",
            "LR = 0.1\n" + RANDOM_BATCHES,
            r"recorded differently",
            exits=(0,),
            options=([], [option, value]),
        )
        for option, value in (
            ("--trace-every", "2"),
            ("--params-every", "0"),
            ("--full-every", "1"),
            ("--max-steps", "2"),
        )
    ),
]


def _weights(name: str) -> bytes:
    """A weights file for the linear model, different per name, written by torch.save."""
    import io

    import torch

    generator = torch.Generator().manual_seed(len(name) + ord(name[-1]))
    state = {"weight": torch.randn(1, 4, generator=generator), "bias": torch.zeros(1)}
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def _script_file(entry: str) -> str:
    """Where a Change's script lies: its path, or a module's file (`-m pkg.train`)."""
    if entry.startswith("-m "):
        return entry[3:].replace(".", "/") + ".py"
    return entry


def _plant(work: Path, files: dict) -> None:
    for relative, content in files.items():
        path = (work / relative).resolve()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(_weights(content) if isinstance(content, str) else content)


def _rows() -> list:
    pairs = [(change, loop) for change in CHANGES for loop in LOOPS]
    chosen = pairs if EXHAUSTIVE else random.Random(51).sample(pairs, SAMPLE)
    return [
        pytest.param(change, loop, id=f"{change.name} in {loop}".replace(" ", "_"))
        for change, loop in chosen
    ]


@pytest.mark.parametrize(("change", "loop"), _rows())
def test_the_cause_names_the_one_change_between_two_runs(tmp_path, change, loop):
    work = tmp_path / "work"
    work.mkdir()
    for script in {_script_file(entry) for entry in change.scripts}:
        (work / script).parent.mkdir(parents=True, exist_ok=True)
        (work / script).write_text(
            HEAD
            + change.prelude
            + TRAIN.format(load=change.load, before=LOOPS[loop][0], step=LOOPS[loop][1])
        )
    _plant(work, change.extra)
    for side, name in enumerate("ab"):
        _plant(work, change.files[side])
        result = subprocess.run(
            [sys.executable, "-m", "twice", "run", "--name", name, *change.options[side], "--",
             sys.executable, *change.scripts[side].split(), *change.args[side]],
            cwd=work, env=clean_env(**change.env[side]), capture_output=True, text=True,
            timeout=300,
        )  # fmt: skip
        assert result.returncode == 0, (change.name, result.stderr[-3000:])
    diff = subprocess.run(
        [sys.executable, "-m", "twice", "diff", "a", "b"],
        cwd=work, env=clean_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    said = diff.stdout + diff.stderr
    assert diff.returncode in change.exits, (change.name, loop, said)
    assert re.search(change.says, said), (change.name, loop, said)
    assert "nondeterminism inside the run" not in said, (change.name, loop, said)
    if change.unseen:  # the step before the first traced difference was not compared
        assert "; steps before it bit-identical" not in said, (change.name, loop, said)
        assert "was not recorded in both runs" in said, (change.name, loop, said)
        assert not re.search(r"(computation|update) differs", said), (change.name, loop, said)
    if change.batch:  # seen where it first shows, and never denied
        assert "batches differ" in said, (change.name, loop, said)
        assert not re.search(r"batches\b[^.;]* identical", said), (change.name, loop, said)
