"""Issue scenarios for verify and diff, each with real processes and small scripts."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from conftest import clean_env, runs, script, twice

from twice.store.traces import read_trace


def diff_json(tmp, a, b, *extra):
    result = twice("diff", a, b, "--json", *extra, cwd=tmp)
    assert result.returncode in (0, 1), result.stderr
    return result.returncode, json.loads(result.stdout)


def test_the_same_script_twice_verify_and_diff_say_identical(tmp_path):
    path = script("tiny_train.py", tmp_path)
    first = twice("run", "--", sys.executable, path, "w.pt", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    [original] = runs(tmp_path)
    verified = twice("verify", original, "-q", cwd=tmp_path)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert verified.stdout.startswith("reproducible\nruns are bit-identical: 8 steps compared")
    a, b = runs(tmp_path)
    code, report = diff_json(tmp_path, a, b)
    assert code == 0 and report["identical"] and report["compared_steps"] == 8
    assert report["differences"] == []


def test_verify_steps_stops_the_rerun_after_n_steps(tmp_path):
    path = script("tiny_train.py", tmp_path)
    twice("run", "--", sys.executable, path, "w.pt", cwd=tmp_path)
    [original] = runs(tmp_path)
    result = twice("verify", original, "--steps", "3", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stdout
    report = json.loads(result.stdout)
    assert report["compared_steps"] == 3
    rerun = [r for r in runs(tmp_path) if r != original][0]
    assert len(read_trace(rerun / "trace.jsonl")) == 3
    assert json.loads((rerun / "manifest.json").read_text())["context"]["status"] == "stopped"


@pytest.mark.slow  # costly; its capability keeps a faster test in `make test`
def test_unseeded_python_random_in_a_dataset_differs_under_observe_and_not_under_run(tmp_path):
    path = script("seeds_torch_only.py", tmp_path)
    for name in ("obs1", "obs2"):
        twice("run", "--observe", "--name", name, "--", sys.executable, path, cwd=tmp_path)
    obs1, obs2 = runs(tmp_path)
    code, report = diff_json(tmp_path, obs1, obs2)
    assert code == 1
    assert report["divergence"]["step"] == 0 and report["divergence"]["first"] == "batch"
    assert "--observe" in report["explanation"]
    for name in ("run1", "run2"):
        twice("run", "--name", name, "--", sys.executable, path, cwd=tmp_path)
    run1, run2 = [r for r in runs(tmp_path) if r.name.endswith(("run1", "run2"))]
    code, report = diff_json(tmp_path, run1, run2)
    assert code == 0 and report["identical"]


def test_a_changed_hyperparameter_is_named_by_diff(tmp_path):
    path = script("tiny_train.py", tmp_path)
    for lr in ("0.05", "0.01"):
        twice("run", "--", sys.executable, path, "w.pt", "--lr", lr, cwd=tmp_path)
    a, b = runs(tmp_path)
    result = twice("diff", a, b, cwd=tmp_path)
    assert result.returncode == 1
    assert result.stdout.startswith(
        "runs differ: first divergence at step 0 (learning rate (schedule))"
    )
    assert "the command lines differ (0.05 vs 0.01)" in result.stdout


def test_a_different_thread_count_is_named_by_diff(tmp_path):
    path = script("threads_reduce.py", tmp_path)
    twice(
        "run",
        "--name",
        "one",
        "--",
        sys.executable,
        path,
        cwd=tmp_path,
        env=clean_env(OMP_NUM_THREADS="1"),
    )
    twice(
        "run",
        "--name",
        "two",
        "--",
        sys.executable,
        path,
        cwd=tmp_path,
        env=clean_env(OMP_NUM_THREADS="2"),
    )
    one, two = runs(tmp_path)
    code, report = diff_json(tmp_path, one, two)
    assert code == 1
    # The parallel reduction rounds differently in forward or backward; batches stay identical.
    assert report["divergence"]["first"] in ("loss", "grads")
    assert "the runs used 1 and 2 torch threads" in report["explanation"]
    assert any(
        d["key"] == "threads.intra_op_threads" and d["group"] == "threads"
        for d in report["differences"]
    )


def test_hogwild_updates_fail_verify_with_identical_batches_and_name_nondeterminism_inside_the_run(
    tmp_path,
):
    path = script("hogwild.py", tmp_path)
    assert twice("run", "--", sys.executable, path, cwd=tmp_path).returncode == 0
    [original] = runs(tmp_path)
    # Races are probabilistic: a few attempts make a false "reproducible" practically impossible.
    for _ in range(4):
        result = twice("verify", original, "--json", cwd=tmp_path)
        if result.returncode == 1:
            break
    report = json.loads(result.stdout)
    assert result.returncode == 1, report["verdict"]
    divergence = report["divergence"]
    assert divergence["stream"].startswith("fork")
    assert (
        "batch" not in divergence["fields"]
        and "params" in divergence["fields"]
        or "loss" in divergence["fields"]
    )
    assert "nondeterminism inside the run" in report["explanation"]


def test_a_run_killed_half_way_compares_correctly_with_a_full_run(tmp_path):
    (tmp_path / "slow.py").write_text(
        "import time, torch\nm = torch.nn.Linear(3, 1)\no = torch.optim.SGD(m.parameters(), "
        "lr=0.1)\n"
        "for i in range(40):\n    o.zero_grad(); m(torch.randn(4, 3)).sum().backward(); o.step()\n"
        "    time.sleep(0.1 if i > 5 else 0)\n"
    )
    assert twice("run", "--name", "full", "slow.py", cwd=tmp_path).returncode == 0
    launcher = subprocess.Popen(
        [sys.executable, "-m", "twice", "run", "--name", "killed", "slow.py"],
        cwd=tmp_path,
        env=clean_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    killed = None
    deadline = time.time() + 60
    while time.time() < deadline:
        found = [r for r in runs(tmp_path) if r.name.endswith("killed")]
        if found and len(read_trace(found[0] / "trace.jsonl")) >= 10:
            killed = found[0]
            break
        time.sleep(0.05)
    child = json.loads((killed / "manifest.json").read_text())["context"]["child_pid"]
    os.kill(child, signal.SIGKILL)
    launcher.wait(timeout=60)
    full = [r for r in runs(tmp_path) if r.name.endswith("full")][0]
    code, report = diff_json(tmp_path, full, killed)
    assert code == 1 and report["divergence"] is None
    steps_killed = report["steps"]["main"][1]
    assert 10 <= steps_killed < 40 and report["compared_steps"] == steps_killed
    assert report["verdict"].startswith(
        f"runs differ: step {steps_killed} was recorded in A only (40 vs {steps_killed} steps"
    )
    assert f"the {steps_killed} steps both recorded are bit-identical" in report["verdict"]
    assert "B is crashed" in report["verdict"]


def test_run_api_records_a_hand_written_sgd_loop_identically_twice(tmp_path):
    code = (
        "import torch, twice\n"
        "with twice.Run(runs_dir='runs', determinism='warn', config={'lr': 0.1}) as run:\n"
        "    model = torch.nn.Linear(4, 1)\n"
        "    for i in range(6):\n"
        "        x = torch.randn(8, 4)\n"
        "        loss = model(x).pow(2).mean()\n"
        "        model.zero_grad(); loss.backward()\n"
        "        with torch.no_grad():\n"
        "            for p in model.parameters(): p -= 0.1 * p.grad\n"
        "        run.step(loss=loss, batch=x, model=model)\n"
        "    torch.save(model.state_dict(), f'{run.dir.name}.pt')\n"
    )
    (tmp_path / "manual.py").write_text(code)
    for _ in range(2):
        result = subprocess.run(
            [sys.executable, "manual.py"],
            cwd=tmp_path,
            env=clean_env(),
            capture_output=True,
            text=True,
        )
        assert result.returncode == 0, result.stderr
    a, b = runs(tmp_path)
    assert len(read_trace(a / "trace.jsonl")) == 6
    assert json.loads((a / "manifest.json").read_text())["identity"]["config"] == {"lr": 0.1}
    assert torch.equal(
        torch.load(tmp_path / f"{a.name}.pt")["weight"],
        torch.load(tmp_path / f"{b.name}.pt")["weight"],
    )
    code, report = diff_json(tmp_path, a, b)
    assert code == 0, report["verdict"]
    # Under the launcher the same script joins the launcher's run instead of making its own.
    assert twice("run", "manual.py", cwd=tmp_path).returncode == 0
    launched = runs(tmp_path)[-1]
    assert len(read_trace(launched / "trace.jsonl")) == 6


def test_gan_style_two_optimizers_make_one_step_per_round(tmp_path):
    (tmp_path / "gan.py").write_text(
        "import torch\nd = torch.nn.Linear(2, 1); g = torch.nn.Linear(2, 2)\n"
        "od = torch.optim.SGD(d.parameters(), lr=0.1); og = torch.optim.Adam(g.parameters(), "
        "lr=0.1)\n"
        "for i in range(5):\n"
        "    od.zero_grad(); d(g(torch.randn(4, 2)).detach()).mean().backward(); od.step()\n"
        "    og.zero_grad(); (-d(g(torch.randn(4, 2)))).mean().backward(); og.step()\n"
    )
    assert twice("run", "gan.py", cwd=tmp_path).returncode == 0
    records = read_trace(runs(tmp_path)[0] / "trace.jsonl")
    assert [r.step for r in records] == [0, 1, 2, 3, 4]
    assert all(isinstance(r.loss, list) and len(r.loss) == 2 and len(r.lr) == 2 for r in records)


def test_lbfgs_closure_steps_are_traced_with_their_gradients(tmp_path):
    (tmp_path / "lbfgs.py").write_text(
        "import torch\nm = torch.nn.Linear(3, 1)\nx = torch.randn(16, 3)\no = "
        "torch.optim.LBFGS(m.parameters(), max_iter=4)\n"
        "def closure():\n    o.zero_grad(); loss = m(x).pow(2).mean(); loss.backward(); return "
        "loss\n"
        "for i in range(3):\n    o.step(closure)\n"
    )
    assert twice("run", "lbfgs.py", cwd=tmp_path).returncode == 0
    records = read_trace(runs(tmp_path)[0] / "trace.jsonl")
    assert len(records) == 3 and all(r.grads and r.params and r.loss for r in records)


def test_diff_says_when_gradscaler_skipped_the_diverging_step_in_one_run_only(tmp_path):
    """Two runs with different initial loss scales: in one, GradScaler skips the first updates
    (overflow), in the other it does not. diff names the argument and says where the skip was."""
    path = script("scaled_train.py", tmp_path)
    for scale in ("100", "60"):
        result = twice("run", "--", sys.executable, path, scale, cwd=tmp_path)
        assert result.returncode == 0, result.stderr
    a, b = runs(tmp_path)
    assert [r.skipped for r in read_trace(a / "trace.jsonl")][:2] == [True, True]
    assert not any(r.skipped for r in read_trace(b / "trace.jsonl"))
    result = twice("diff", a, b, cwd=tmp_path)
    assert result.returncode == 1
    first_line = result.stdout.splitlines()[0]
    assert first_line.startswith("runs differ: first divergence at step 0")
    assert first_line.endswith(
        "; GradScaler skipped the update at step 0 in A only (its scaled gradients were inf/NaN)"
    )
    assert "the command lines differ (100 vs 60)" in result.stdout


def test_diff_lists_the_settings_chosen_away_from_their_defaults_first(tmp_path):
    """Where a run knows its settings' defaults (the Hugging Face callback records them), the
    config differences that are not defaults come first."""
    for name, config in (("a", {"alpha": 1, "zeta": 1}), ("b", {"alpha": 2, "zeta": 2})):
        (tmp_path / f"{name}.py").write_text(
            f"import twice\nwith twice.Run(config={config!r}):\n    pass\n"
        )
        assert twice("run", "--name", name, f"{name}.py", cwd=tmp_path).returncode == 0
    folders = runs(tmp_path)
    listed = lambda: [  # noqa: E731
        d["key"]
        for d in json.loads(twice("diff", *folders, "--json", cwd=tmp_path).stdout)["differences"]
        if d["key"].startswith("config.")
    ]
    assert listed() == ["config.alpha", "config.zeta"]
    for folder in folders:  # zeta was chosen, alpha left at its default (1) in run a
        (folder / "config_defaults.json").write_text('{"alpha": 1, "zeta": 0}')
    assert listed() == ["config.zeta", "config.alpha"]
