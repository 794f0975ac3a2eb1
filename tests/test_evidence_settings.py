"""A cause only from evidence: a run recorded differently is compared on what both runs recorded,
never called different for it (recording settings are settings, not training); the script's
own seeding calls are recorded by API and line, and named where they make two runs differ.

Real processes through the real `twice run`, all started at once; each kind of change is one row
of a table."""

import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from click.testing import CliRunner
from conftest import clean_env
from torch.utils.data import DataLoader

from twice.cli import main
from twice.record import hooks
from twice.store.runs import read_manifest
from twice.store.traces import read_trace

# One script for every row: a DataLoader that shuffles, dropout, Python's `random` in the data, a
# file read from outside the working folder (argv[1]); the row's seeding calls replace SEEDING.
SCRIPT = """\
import os, random, sys, time
import numpy as np
import torch
from torch.utils.data import DataLoader
SEEDING
scale = float(open(sys.argv[1]).read())
data = torch.arange(48, dtype=torch.float32).reshape(12, 4) * scale
noise = torch.tensor([random.random() for _ in range(12)])
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.2), torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for x, n in DataLoader(list(zip(data, noise)), batch_size=2, shuffle=True):
    opt.zero_grad()
    (model(x).squeeze(1) - n).pow(2).mean().backward()
    opt.step()
"""

# (a) Recording settings: run B's options against run A (constant-a below, recorded with none);
# the two runs differ in nothing else. "{outside}" is a folder beside the working folder, holding
# the file the script reads.
SETTINGS = [
    ("--trace-every", ["--trace-every", "2"]),
    ("--params-every", ["--params-every", "0"]),
    ("--full-every", ["--full-every", "1"]),
    ("--max-steps", ["--max-steps", "3"]),
    ("--record-ops", ["--record-ops", "2"]),
    ("--numerics", ["--numerics", "warn"]),
    ("--inputs", ["--inputs", "{outside}"]),
]

# (d) Every seeding API the record covers, each called once with a constant.
SEEDING_APIS = [
    ("torch.manual_seed", "torch.manual_seed(1)"),
    ("torch.cuda.manual_seed", "torch.cuda.manual_seed(2)"),
    ("torch.cuda.manual_seed_all", "torch.cuda.manual_seed_all(3)"),
    ("torch.Generator.manual_seed", "torch.Generator().manual_seed(4)"),
    ("numpy.random.seed", "np.random.seed(5)"),
    ("numpy.random.default_rng", "np.random.default_rng(6)"),
    ("numpy.random.RandomState", "np.random.RandomState(7)"),
    ("random.seed", "random.seed(8)"),
]

# (b, c) The script's own seeding, run twice: its lines, the exit code of `twice diff`, and what
# the output must say (an empty list: nothing more than the exit code).
SEEDINGS = [
    ("clock", "torch.manual_seed(time.time_ns())", 1, ["clock.py:5", "another value in each run"]),
    ("constant", "\n".join(call for _, call in SEEDING_APIS), 0, []),
]


def _twice_run(folder, name, options, script):
    import subprocess

    command = [sys.executable, "-m", "twice", "run", "--name", name, *options, "--"]
    command += [sys.executable, script, str(folder.parent / "outside" / "scale.txt")]
    done = subprocess.run(
        command, cwd=folder, env=clean_env(), capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return name


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """Every row's runs, made at once: {name: run folder}."""
    root = tmp_path_factory.mktemp("evidence")
    folder, outside = root / "work", root / "outside"
    folder.mkdir()
    outside.mkdir()
    (outside / "scale.txt").write_text("0.1")
    jobs = []
    for name, lines, _, _ in SEEDINGS:
        (folder / f"{name}.py").write_text(SCRIPT.replace("SEEDING", lines))
        jobs += [(f"{name}-a", [], f"{name}.py"), (f"{name}-b", [], f"{name}.py")]
    jobs += [
        (f"setting{i}", [o.format(outside=outside) for o in options], "constant.py")
        for i, (_, options) in enumerate(SETTINGS)
    ]
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda job: _twice_run(folder, *job), jobs))
    runs = sorted(p for p in (folder / "runs").iterdir() if (p / "manifest.json").is_file())
    return {name: next(r for r in runs if r.name.endswith(f"-{name}")) for name, _, _ in jobs}


def _diff(a, b):
    result = CliRunner().invoke(main, ["diff", str(a), str(b)])
    assert result.exit_code in (0, 1), result.output
    return result.exit_code, result.output


@pytest.mark.parametrize("index", range(len(SETTINGS)), ids=[row[0] for row in SETTINGS])
def test_a_recording_setting_alone_is_never_a_difference_of_training(recorded, index):
    option, _ = SETTINGS[index]
    base, other = recorded["constant-a"], recorded[f"setting{index}"]
    for a, b in ((base, other), (other, base)):
        code, output = _diff(a, b)
        assert code == 0, output
        verdict = output.splitlines()[0]
        assert verdict.startswith("runs are bit-identical at the "), output
        assert f"recorded differently: {option} " in verdict, output
        assert "nondeterminism" not in output and "runs differ" not in output


@pytest.mark.parametrize("name, lines, code, phrases", SEEDINGS, ids=[row[0] for row in SEEDINGS])
def test_the_scripts_own_seeding_is_named_where_it_makes_runs_differ(
    recorded, name, lines, code, phrases
):
    found, output = _diff(recorded[f"{name}-a"], recorded[f"{name}-b"])
    assert found == code, output
    cause = next((line for line in output.splitlines() if line.startswith("cause: ")), "")
    for phrase in phrases:
        assert phrase in cause, output
    assert "nondeterminism" not in output


def test_every_seeding_api_is_recorded_with_its_line(recorded):
    seeding = read_manifest(recorded["constant-a"]).context["seeding"]
    calls = {(c["api"], c["site"]): c for c in seeding["calls"]}
    lines = SCRIPT.replace("SEEDING", SEEDINGS[1][1]).splitlines()
    for api, call in SEEDING_APIS:
        line = lines.index(call) + 1
        assert api in seeding["watched"]
        entry = calls.pop((api, f"constant.py:{line}"))
        assert entry["calls"] == 1 and entry["entropy"] == 0 and entry["values"], (api, entry)
    # twice's own seeding, and the DataLoader's inside torch, are not the script's
    assert calls == {}, calls
    other = read_manifest(recorded["constant-b"]).context["seeding"]
    assert other == seeding


def _one_optimizer():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.3), torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x in DataLoader(torch.randn(14, 4), batch_size=2, shuffle=True):
        optimizer.zero_grad()
        model(x).pow(2).mean().backward()
        optimizer.step()


def _two_optimizers():
    critic, maker = torch.nn.Linear(4, 1), torch.nn.Linear(2, 4)
    for_critic = torch.optim.SGD(critic.parameters(), lr=0.1)
    for_maker = torch.optim.SGD(maker.parameters(), lr=0.1)
    for x in DataLoader(torch.randn(14, 4), batch_size=2, shuffle=True):
        for_critic.zero_grad()
        (critic(x).mean() - critic(maker(torch.randn(2, 2)).detach()).mean()).backward()
        for_critic.step()
        for_maker.zero_grad()
        critic(maker(torch.randn(2, 2))).mean().backward()
        for_maker.step()


@pytest.mark.parametrize("loop", [_one_optimizer, _two_optimizers])
def test_a_traced_step_holds_its_own_batches_and_losses_whatever_the_interval(tmp_path, loop):
    """What an untraced step consumed is not carried into the next traced step's record."""
    traces = {}
    for every in (1, 2, 3):
        torch.manual_seed(0)
        hooks.install(hooks.Recorder(tmp_path / str(every), trace_every=every))
        try:
            loop()
        finally:
            hooks.uninstall()
        traces[every] = {
            r.step: r.to_json() for r in read_trace(tmp_path / str(every) / "trace.jsonl")
        }
    for every in (2, 3):
        assert sorted(traces[every]) == list(range(0, 7, every))
        for step, record in traces[every].items():
            expected = {k: v for k, v in traces[1][step].items() if k != "time"}
            assert {k: v for k, v in record.items() if k != "time"} == expected, step
