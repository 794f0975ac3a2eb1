"""Lightning, the Hugging Face Trainer and MLflow, each against the real library (installed by
the test extras)."""

import json
import sys
from pathlib import Path

import pytest
import torch
from conftest import SCRIPTS, clean_env, runs, script, twice

from twice import first_divergence, read_trace


def _same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture
def scripts_importable(monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPTS))


def _trace(folder, name):
    return read_trace(next(Path(folder).glob(f"runs/*-{name}")) / "trace.jsonl")


# -- Lightning ------------------------------------------------------------------------------------


def test_lightning_resumes_bit_for_bit_with_the_callback_and_not_without(
    tmp_path, monkeypatch, scripts_importable, capfd
):
    pytest.importorskip("pytorch_lightning")
    from lightning_train import fit

    from twice.integrations.lightning import Twice

    monkeypatch.chdir(tmp_path)
    callback = Twice(name="straight")
    straight = fit(12, callbacks=[callback])
    # The run folder stays known after fit, and fit said where it is.
    assert callback.run_dir is not None and callback.run_dir.name.endswith("-straight")
    assert f"twice: run recorded in {callback.run_dir}" in capfd.readouterr().err
    fit(5, callbacks=[Twice(name="stopped")], ckpt_dir="ck", every=5)
    (checkpoint,) = Path("ck").glob("*step=5.ckpt")
    resumed = fit(12, callbacks=[Twice(name="resumed")], resume=str(checkpoint))
    assert _same(straight, resumed)
    # The resumed run's trace continues at step 5 and equals the straight run's, step by step.
    after = _trace(tmp_path, "resumed")
    assert [r.step for r in after] == list(range(5, 12))
    straight = [r for r in _trace(tmp_path, "straight") if r.step >= 5]
    assert first_divergence(straight, after, resumed=True) is None
    assert json.loads(next(tmp_path.glob("runs/*-straight/config.json")).read_text()) == {
        "lr": 0.01
    }

    # Lightning alone: the checkpoint has no RNG state, so dropout and noise draw differently.
    fit(5, ckpt_dir="plain", every=5)
    (plain,) = Path("plain").glob("*step=5.ckpt")
    assert not _same(fit(12), fit(12, resume=str(plain)))


@pytest.mark.slow  # costly; its capability keeps a faster test in `make test`
def test_lightning_script_under_twice_run_records_its_steps(tmp_path):
    pytest.importorskip("pytorch_lightning")
    script("lightning_train.py", tmp_path)
    result = twice(
        "run", "--name", "pl", "--", sys.executable, "lightning_train.py", "4", cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (run,) = runs(tmp_path)
    assert [r.step for r in read_trace(run / "trace.jsonl")] == [0, 1, 2, 3]
    assert json.loads((run / "manifest.json").read_text())["context"]["status"] == "completed"


# -- Hugging Face Trainer -------------------------------------------------------------------------


def test_hf_trainer_resume_matches_the_uninterrupted_run_and_the_trace_shows_a_lost_data_position(
    tmp_path, monkeypatch, scripts_importable
):
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from hf_train import fit

    from twice.integrations.huggingface import TwiceCallback

    monkeypatch.chdir(tmp_path)
    straight = fit("a", 10, callbacks=[TwiceCallback(name="straight")])
    fit("b", 10, stop_at=4, callbacks=[TwiceCallback(name="stopped")])
    resumed = fit("c", 10, resume="b/checkpoint-4", callbacks=[TwiceCallback(name="resumed")])
    assert _same(straight, resumed)
    full, after = _trace(tmp_path, "straight"), _trace(tmp_path, "resumed")
    assert [r.step for r in after] == list(range(4, 10))
    assert first_divergence([r for r in full if r.step >= 4], after, resumed=True) is None
    assert (
        json.loads(next(tmp_path.glob("runs/*-straight/config.json")).read_text())["learning_rate"]
        == 1e-3
    )

    # Resuming without skipping the consumed batches: the trace says the data differs first.
    fit(
        "d",
        10,
        resume="b/checkpoint-4",
        ignore_data_skip=True,
        callbacks=[TwiceCallback(name="noskip")],
    )
    found = first_divergence(
        [r for r in full if r.step >= 4], _trace(tmp_path, "noskip"), resumed=True
    )
    assert (found.step, found.first) == (4, "batch")

    # The Trainer's own seed is the run's seed, and the folder stays known after training.
    callback = TwiceCallback(name="seeded")
    fit("e", 2, seed=42, callbacks=[callback])
    assert callback.run_dir is not None and callback.run_dir.name.endswith("-seeded")
    manifest = json.loads((callback.run_dir / "manifest.json").read_text())
    assert manifest["identity"]["seed"] == 42
    # Of the ~100 TrainingArguments, `show` puts those not at their defaults first.
    shown = twice("show", callback.run_dir, cwd=tmp_path).stdout.splitlines()
    header = next(i for i, line in enumerate(shown) if line.startswith("  config ("))
    assert "values not at their defaults" in shown[header]
    chosen = shown[header + 1]
    assert "learning_rate=0.001" in chosen and "max_steps=2" in chosen
    assert "seed=" not in chosen  # 42 is the Trainer's default


# -- MLflow ---------------------------------------------------------------------------------------

LOGGING_SCRIPT = """
import torch, twice
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
with twice.Run(config={"lr": 0.1, "layers": [4, 1]}):
    for step in range(6):
        opt.zero_grad()
        model(torch.randn(8, 4)).pow(2).mean().backward()
        opt.step()
    twice.log_metric("accuracy", 0.75)
"""


@pytest.mark.slow  # costly; its capability keeps a faster test in `make test`
def test_a_run_goes_into_a_real_mlflow_store_live_and_by_export(tmp_path):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    (tmp_path / "train.py").write_text(LOGGING_SCRIPT)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    result = twice(
        "run",
        "--name",
        "live",
        "--mlflow",
        uri,
        "--",
        sys.executable,
        "train.py",
        "--batch-size",
        "8",
        "--fast",
        "--lr=0.5",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (run,) = runs(tmp_path)
    losses = [float.fromhex(r.loss) for r in read_trace(run / "trace.jsonl")]

    client = MlflowClient(tracking_uri=uri)

    def check(experiment):
        (exported,) = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
        data = exported.data
        assert data.params["lr"] == "0.1" and data.params["layers"] == "[4, 1]"  # config wins
        assert data.params["batch_size"] == "8" and data.params["fast"] == "true"
        assert (
            data.params["twice.seed"] == "0" and data.params["twice.determinism.mode"] == "strict"
        )
        assert data.tags["twice.run"] == run.name and data.tags["twice.status"] == "completed"
        history = client.get_metric_history(exported.info.run_id, "loss")
        assert [
            m.value for m in sorted(history, key=lambda m: m.step)
        ] == losses  # exact: no rounding on the way
        assert data.metrics["accuracy"] == 0.75
        artifacts = {a.path for a in client.list_artifacts(exported.info.run_id)}
        assert {"manifest.json", "trace.jsonl", "config.json"} <= artifacts
        assert exported.info.status == "FINISHED"
        return exported.info.run_id

    live_id = check("twice")
    exported = twice(
        "export", "mlflow", run, "--tracking-uri", uri, "--experiment", "after", cwd=tmp_path
    )
    assert exported.returncode == 0, exported.stderr
    after_id = check("after")
    assert after_id != live_id and after_id in exported.stdout
    # Exported after the fact, the MLflow run keeps the recorded times, not the export's.
    manifest = json.loads((run / "manifest.json").read_text())["context"]
    info = client.get_run(after_id).info
    assert info.start_time == int(manifest["started"] * 1000)
    assert info.end_time == int(manifest["ended"] * 1000)
    stamps = [
        m.timestamp
        for m in sorted(client.get_metric_history(after_id, "loss"), key=lambda m: m.step)
    ]
    times = [r.time for r in read_trace(run / "trace.jsonl")]
    assert stamps == [int(manifest["started"] * 1000) + int(t * 1000) for t in times]
    assert len(set(stamps)) > 1
    again = twice(
        "export", "mlflow", run, "--tracking-uri", uri, "--experiment", "after", cwd=tmp_path
    )
    assert again.returncode == 0 and f"{after_id} (exported before)" in again.stdout

    bad = twice("export", "mlflow", run, "--tracking-uri", "nonsense://x", cwd=tmp_path)
    assert (
        bad.returncode == 2
        and bad.stderr.startswith("error: MLflow cannot use the tracking URI 'nonsense://x'")
        and "hint:" in bad.stderr
    )


def _closed_port():
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize(
    "uri, message",
    [
        ("nonsense://x", "MLflow cannot use the tracking URI 'nonsense://x'"),
        ("sqlite:///{tmp}/absent/m.db", "its folder {tmp}/absent does not exist"),
        ("sqlite:///{tmp}", "is a folder, not a database file"),  # MLflow retried for 106 s
        ("sqlite:///{tmp}/train.py", "is not an SQLite database"),
        ("http://127.0.0.1:{port}", "cannot open the MLflow tracking store http://127.0.0.1:"),
    ],
)
def test_a_tracking_store_that_cannot_be_opened_is_an_error_before_anything_runs(
    tmp_path, uri, message
):
    pytest.importorskip("mlflow")
    import time

    (tmp_path / "train.py").write_text("open('ran', 'w').write('yes')\n")
    port = _closed_port()
    uri, message = (x.format(tmp=tmp_path, port=port) for x in (uri, message))
    started = time.monotonic()
    result = twice("run", "--mlflow", uri, "--", sys.executable, "train.py", cwd=tmp_path)
    assert time.monotonic() - started < 60  # no minutes of retries
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.startswith("error: ") and message in result.stderr, result.stderr
    assert "hint: " in result.stderr
    assert not (tmp_path / "ran").exists() and not (tmp_path / "runs").exists()
    assert not (tmp_path / "absent").exists()  # MLflow would have made the folder


@pytest.mark.parametrize(
    "module,extra",
    [("mlflow", "mlflow"), ("pytorch_lightning", "lightning"), ("transformers", "huggingface")],
)
def test_a_missing_extra_is_an_error_with_the_pip_command(tmp_path, module, extra):
    import subprocess

    blocked = tmp_path / "blocked"
    blocked.mkdir()
    (blocked / f"{module}.py").write_text("raise ImportError('not installed (test)')\n")
    if module == "pytorch_lightning":
        (blocked / "lightning.py").write_text("raise ImportError('not installed (test)')\n")
    name = {"mlflow": "mlflow", "lightning": "lightning", "huggingface": "huggingface"}[extra]
    code = f"import twice.integrations.{name}"
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=clean_env(PYTHONPATH=str(blocked)),
    )
    assert result.returncode != 0 and f"pip install 'twice[{extra}]'" in result.stderr
    if extra == "mlflow":
        cli = twice(
            "export", "mlflow", "anything", cwd=tmp_path, env=clean_env(PYTHONPATH=str(blocked))
        )
        assert cli.returncode == 2
        assert (
            "error: twice's mlflow integration needs mlflow, which is not installed" in cli.stderr
        )
        assert "hint: pip install 'twice[mlflow]'" in cli.stderr
