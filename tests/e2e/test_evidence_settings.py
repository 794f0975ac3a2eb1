"""A cause only from evidence: a run recorded differently is compared on what both runs recorded,
never called different for it (recording settings are settings, not training); the script's
own seeding calls are recorded by API and line, and named where they make two runs differ.

Real processes through the real `twice run`, all started at once; each kind of change is one row
of a table."""

import subprocess
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
    ("random.Random", "rng = random.Random(9)"),
    ("random.Random.seed", "rng.seed(10)"),
    ("numpy.random.SeedSequence", "np.random.SeedSequence(11)"),
    ("numpy.random.PCG64", "np.random.Generator(np.random.PCG64(12))"),
    ("numpy.random.PCG64DXSM", "np.random.PCG64DXSM(13)"),
    ("numpy.random.Philox", "np.random.Philox(14)"),
    ("numpy.random.MT19937", "np.random.MT19937(15)"),
    ("numpy.random.SFC64", "np.random.SFC64(16)"),
    ("torch.default_generator.manual_seed", "torch.default_generator.manual_seed(17)"),
]

# Until a forked child writes its own process record (bootstrap), a worker's calls are lost.

# A forked DataLoader worker seeding torch from the clock, and training from its RNG state.
WORKER = """\
def init(worker): torch.manual_seed(time.time_ns() % 2**32)
class State(torch.utils.data.Dataset):
    __len__, __getitem__ = lambda self: 1, lambda self, i: torch.get_rng_state()
fork = dict(num_workers=1, worker_init_fn=init, multiprocessing_context="fork")
states = DataLoader(State(), None, **fork)
torch.set_rng_state(next(iter(states)))"""

# (b, c) The script's own seeding, run twice: its lines, the exit code of `twice diff`, and what
# the output must say (an empty list: nothing more than the exit code).
SEEDINGS = [
    ("clock", "torch.manual_seed(time.time_ns())", 1, ["clock.py:5", "another value in each run"]),
    ("constant", "\n".join(call for _, call in SEEDING_APIS), 0, []),
    (
        "instance",
        "random.random = random.Random(time.time_ns()).random",
        1,
        ["instance.py:5", "random.Random"],
    ),
    (
        "bitgen",
        "g = np.random.Generator(np.random.PCG64(time.time_ns()))\n"
        "random.random = lambda: float(g.random())",
        1,
        ["bitgen.py:5", "a NumPy PCG64", "another value in each run"],
    ),
    (
        "entropy",
        "torch.default_generator.seed()\ntorch.random.seed()\ntorch.Generator().seed()",
        1,
        ["seeds torch from OS entropy at entropy.py:5", "(2 more seeding calls differ)"],
    ),
    pytest.param("worker", WORKER, 1, ["worker.py:5", "another value in each run"]),
]

_SEEDINGS = [getattr(row, "values", row) for row in SEEDINGS]  # a pytest.param's values

# (e) An installed package's code changed without a new version (`pip install .` of an edited
# local package): its source in run A and run B, each installed by pip outside the working folder.
PACKAGE = "import mylib\ntorch.rand(mylib.DRAWS)"
EDITED = ("DRAWS = 1\n", "DRAWS = 2\n")


def _twice_run(folder, name, options, script, packages=None):
    command = [sys.executable, "-m", "twice", "run", "--name", name, *options, "--"]
    command += [sys.executable, script, str(folder.parent / "outside" / "scale.txt")]
    env = clean_env(**({"PYTHONPATH": str(packages)} if packages else {}))
    done = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return name


def _install(root, side, source):
    """`pip install .` of a local package `mylib` 1.0 holding `source`, into root/side."""
    project = root / f"mylib-{side}"
    (project / "mylib").mkdir(parents=True)
    (project / "mylib" / "__init__.py").write_text(source)
    (project / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n'
        '[project]\nname = "mylib"\nversion = "1.0"\n'
    )
    target = root / side / "site-packages"  # where twice leaves files read to their package
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps"]
    pip += ["--no-index", "--target", str(target), str(project)]
    done = subprocess.run(pip, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return target


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """Every row's runs, made at once: {name: run folder}."""
    root = tmp_path_factory.mktemp("evidence")
    folder, outside = root / "work", root / "outside"
    folder.mkdir()
    outside.mkdir()
    (outside / "scale.txt").write_text("0.1")
    with ThreadPoolExecutor(3) as pool:
        sides = [("a", EDITED[0]), ("b", EDITED[1]), ("same", EDITED[0])]
        installed = dict(
            zip(("a", "b", "same"), pool.map(lambda side: _install(root, *side), sides))
        )
    (folder / "package.py").write_text(SCRIPT.replace("SEEDING", PACKAGE))
    jobs = [(f"package-{side}", [], "package.py", installed[side]) for side in "ab"]
    for name, lines, _, _ in _SEEDINGS:
        (folder / f"{name}.py").write_text(SCRIPT.replace("SEEDING", lines))
        jobs += [(f"{name}-a", [], f"{name}.py"), (f"{name}-b", [], f"{name}.py")]
    jobs += [
        (f"setting{i}", [o.format(outside=outside) for o in options], "constant.py")
        for i, (_, options) in enumerate(SETTINGS)
    ]
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda job: _twice_run(folder, *job), jobs))
    runs = sorted(p for p in (folder / "runs").iterdir() if (p / "manifest.json").is_file())
    found = {name: next(r for r in runs if r.name.endswith(f"-{name}")) for name, *_ in jobs}
    return {**found, "installed": installed}


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


@pytest.mark.parametrize("name, lines, code, phrases", SEEDINGS, ids=[row[0] for row in _SEEDINGS])
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


def test_the_entropy_seeding_apis_are_recorded_as_such(recorded):
    seeding = read_manifest(recorded["entropy-a"]).context["seeding"]
    calls = {(c["api"], c["site"]): c for c in seeding["calls"]}
    for line, api in enumerate(
        ("torch.default_generator.seed", "torch.seed", "torch.Generator.seed"), start=5
    ):
        entry = calls.pop((api, f"entropy.py:{line}"))
        assert entry["calls"] == entry["entropy"] == 1 and entry["values"] is None, entry
    assert calls == {}, calls  # torch.seed's own call of default_generator.seed is torch's


def test_a_forked_workers_seeding_reaches_the_manifest(recorded):
    seeding = read_manifest(recorded["worker-a"]).context["seeding"]
    assert [(c["api"], c["site"], c["calls"]) for c in seeding["calls"]] == [
        ("torch.manual_seed", "worker.py:5", 1)
    ]


def test_an_installed_package_changed_without_a_new_version_is_named(recorded):
    a, b = (read_manifest(recorded[f"package-{side}"]).identity for side in "ab")
    assert a["packages"]["mylib"] == b["packages"]["mylib"] == "1.0"
    assert a["package_files"]["mylib"] != b["package_files"]["mylib"]
    found, output = _diff(recorded["package-a"], recorded["package-b"])
    assert found == 1, output
    cause = next((line for line in output.splitlines() if line.startswith("cause: ")), "")
    assert "mylib" in cause and "package" in cause, output
    assert "nondeterminism" not in output and "seeds" not in cause


def test_the_same_files_installed_from_another_folder_are_the_same_package_files(recorded):
    """pip's RECORD of the same files, installed from another folder into another: the rows
    that name folders (direct_url.json, scripts' interpreters) are left out of the digest."""
    from twice.runtime.capture import package_files_facts

    a, same, b = (package_files_facts([str(recorded["installed"][k])]) for k in ("a", "same", "b"))
    assert a == same and a != b and set(a) == {"mylib"}


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
