"""Inputs: the files a run read are recorded and compared, a loop without a DataLoader records
its batch, and a changed data file is named as the cause, never nondeterminism (real processes,
real files)."""

import json
import sys

import numpy as np
import pytest
from conftest import clean_env, runs, script, twice

from twice.store.traces import read_trace


def _env(tmp_path):
    return clean_env(XDG_CACHE_HOME=str(tmp_path / "cache"))


def _two_runs(tmp_path, name, prepare, change, labels=("a", "b", "c")):
    script(name, tmp_path)
    prepare(tmp_path)
    env = _env(tmp_path)
    for label in labels:
        if label == "c":
            change(tmp_path)
        result = twice("run", "--name", label, "--", sys.executable, name, cwd=tmp_path, env=env)
        assert result.returncode == 0, result.stderr
    return runs(tmp_path), env


def _diff(tmp_path, a, b, env):
    result = twice("diff", "--json", a, b, cwd=tmp_path, env=env)
    return result.returncode, json.loads(result.stdout)


def _tokens(tmp_path):
    (tmp_path / "data").mkdir()
    tokens = np.random.default_rng(0).integers(0, 64, 2000).astype(np.uint16)
    tokens.tofile(tmp_path / "data" / "train.bin")


def _change_one_token_in_fifty(tmp_path):
    path = tmp_path / "data" / "train.bin"
    tokens = np.fromfile(path, dtype=np.uint16)
    tokens[::50] = (tokens[::50] + 1) % 64
    tokens.tofile(path)


def test_a_changed_token_file_is_named_as_the_cause_in_a_get_batch_loop(tmp_path):
    (a, b, c), env = _two_runs(tmp_path, "getbatch_train.py", _tokens, _change_one_token_in_fifty)
    manifest = json.loads((a / "manifest.json").read_text())
    (entry,) = manifest["context"]["inputs"]
    assert entry["path"] == "data/train.bin" and entry["size"] == 4000
    assert manifest["identity"]["inputs"] == {"data/train.bin": entry["xxh3"]}
    assert all(r.batch is not None for r in read_trace(a / "trace.jsonl"))
    code, same = _diff(tmp_path, a, b, env)
    assert code == 0, same["verdict"]
    code, report = _diff(tmp_path, a, c, env)
    assert code == 1
    assert report["divergence"]["first"] == "batch"
    assert "the runs read different data: data/train.bin differs" in report["explanation"]
    assert "nondeterminism" not in report["explanation"]


@pytest.mark.slow
def test_a_changed_npy_file_is_named_as_the_cause_in_a_slicing_loop(tmp_path):
    def prepare(folder):
        np.save(
            folder / "train.npy",
            np.random.default_rng(1).standard_normal((40, 5)).astype(np.float32),
        )

    def change(folder):
        table = np.load(folder / "train.npy")
        table[20, 1] += 1.0
        np.save(folder / "train.npy", table)

    (a, c), env = _two_runs(tmp_path, "npload_train.py", prepare, change, labels=("a", "c"))
    code, report = _diff(tmp_path, a, c, env)
    assert code == 1 and report["divergence"]["step"] == 2
    assert report["divergence"]["first"] == "batch"
    assert "the runs read different data: train.npy differs" in report["explanation"]
    result = twice("show", c, cwd=tmp_path, env=env)
    assert "inputs read: 1 files" in result.stdout and "train.npy (xxh3 " in result.stdout


def test_inputs_outside_the_working_folder_are_recorded_and_exclusions_hold(tmp_path):
    work, data = tmp_path / "work", tmp_path / "datasets"
    work.mkdir(), data.mkdir()
    (data / "a.txt").write_text("a")
    (work / "skip").mkdir()
    (work / "skip" / "b.txt").write_text("b")
    (work / "read.py").write_text(
        f"open({str(data / 'a.txt')!r}).read()\nopen('skip/b.txt').read()\n"
    )
    env = _env(tmp_path)
    for extra in ((), ("--inputs", str(data), "--inputs-exclude", "skip")):
        result = twice("run", *extra, "--", sys.executable, "read.py", cwd=work, env=env)
        assert result.returncode == 0, result.stderr
    plain, named = (json.loads((r / "manifest.json").read_text()) for r in runs(work))
    assert sorted(plain["identity"]["inputs"]) == [str(data / "a.txt"), "skip/b.txt"]
    assert list(named["identity"]["inputs"]) == [str(data / "a.txt")]
    outside = {e["path"]: e for e in plain["context"]["inputs"]}[str(data / "a.txt")]
    assert outside["outside"] and len(outside["xxh3"]) == 32  # within the budget: hashed
    assert "outside" not in {e["path"]: e for e in named["context"]["inputs"]}[str(data / "a.txt")]


def test_a_learning_rate_read_from_the_environment_is_named_as_a_configuration(tmp_path):
    """The class of the issue's example: the data, the code and the arguments equal, the
    configuration read from elsewhere (here an environment variable): never nondeterminism."""
    (tmp_path / "t.py").write_text(
        "import os, torch\n"
        "torch.manual_seed(0)\n"
        "model = torch.nn.Linear(4, 1)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=float(os.environ.get('LR', '0.1')))\n"
        "x = torch.randn(8, 4)\n"
        "for _ in range(3):\n"
        "    opt.zero_grad(); model(x).pow(2).mean().backward(); opt.step()\n"
    )
    for name, lr in (("a", "0.1"), ("b", "0.2")):
        env = {**_env(tmp_path), "LR": lr}
        result = twice("run", "--name", name, "--", sys.executable, "t.py", cwd=tmp_path, env=env)
        assert result.returncode == 0, result.stderr
    a, b = runs(tmp_path)
    code, report = _diff(tmp_path, a, b, _env(tmp_path))
    assert code == 1 and report["divergence"]["first"] == "lr"
    assert "their environments differ in LR" in report["explanation"]
    assert "nondeterminism" not in report["explanation"]


def test_reads_in_a_forked_child_a_subprocess_and_runpy_are_recorded(tmp_path):
    """A forked child that ends with os._exit (no exit handler runs) and a Python subprocess
    record what they read; a config run with runpy is code read as data; an imported module and
    a source line read for a traceback are not."""
    work, data = tmp_path / "work", tmp_path / "data"
    work.mkdir(), data.mkdir()
    for name in ("forked.txt", "sub.txt"):
        (data / name).write_text(name)
    (data / "conf.py").write_text("lr = 0.1\n")
    (work / "helper.py").write_text("VALUE = 1\n")
    (work / "reads.py").write_text(
        "import linecache, os, runpy, subprocess, sys\n"
        "import helper\n"
        "linecache.getline(helper.__file__, 1)\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    open('../data/forked.txt').read()\n"
        "    os._exit(0)\n"
        "os.waitpid(pid, 0)\n"
        "subprocess.run([sys.executable, '-c', \"open('../data/sub.txt').read()\"], check=True)\n"
        "runpy.run_path('../data/conf.py')\n"
    )
    result = twice("run", "--", sys.executable, "reads.py", cwd=work, env=_env(tmp_path))
    assert result.returncode == 0, result.stderr
    (run,) = runs(work)
    identity = json.loads((run / "manifest.json").read_text())["identity"]
    assert sorted(identity["inputs"]) == [str(data / "forked.txt"), str(data / "sub.txt")]
    assert list(identity["code"]["read_as_data"]) == [str(data / "conf.py")]
    assert "helper.py" in identity["code"]["sources"]
