"""app/manifests: a run's manifest written as it starts (status running, signed) and finished as
it ends, with the status its exit gives and what its folder holds."""

import json
import signal
import sys

import pytest

from twice.app.manifests import SCHEMA, finish_manifest, start_manifest
from twice.app.options import RunOptions
from twice.app.trust import foreign_reason
from twice.core.records import record_line
from twice.store.layout import RunFolder
from twice.store.runs import read_manifest
from unit.app.folders import steps


@pytest.fixture
def started(tmp_path, monkeypatch):
    """A run folder whose manifest was written as its run started."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    (tmp_path / "train.py").write_text("print('training')\n")
    run = tmp_path / "runs" / "r1"
    run.mkdir(parents=True)
    options = RunOptions(seed=4, trace_every=2, runs_dir=tmp_path / "runs")
    argv = [sys.executable, "train.py"]
    env = {"OMP_NUM_THREADS": "2", "SECRET_TOKEN": "x"}
    manifest = start_manifest(
        run, argv, tmp_path / "train.py", tmp_path, options, env, options.runs_dir
    )
    return run, manifest


def test_a_starting_run_is_recorded_running_signed_with_its_identity(started, tmp_path):
    run, manifest = started
    written = read_manifest(run)
    assert written.context["status"] == "running" and foreign_reason(run, written) is None
    identity = manifest["identity"]
    assert identity["schema"] == SCHEMA and identity["seed"] == 4
    assert identity["determinism"] == {"mode": "strict"}
    assert identity["code"]["script"]["digest"] is not None  # the script, by digest
    assert identity["env"].get("OMP_NUM_THREADS") == "2" and "SECRET_TOKEN" not in identity["env"]
    assert manifest["context"]["recording"]["trace_every"] == 2
    assert manifest["context"]["cwd"] == str(tmp_path)


@pytest.mark.parametrize(
    "code, interrupted, status",
    [(0, False, "completed"), (3, False, "failed"), (-signal.SIGKILL, False, "crashed"),
     (0, True, "interrupted"), (130, False, "interrupted")],
)  # fmt: skip
def test_the_finished_status_follows_the_commands_exit(started, code, interrupted, status):
    run, manifest = started
    RunFolder(run).trace().write_bytes(b"".join(record_line(r) for r in steps([1.0, 0.5])))
    (run / "config.json").write_text(json.dumps({"lr": 0.1}))
    finish_manifest(run, manifest, code, interrupted)
    context = read_manifest(run).context
    assert context["status"] == status and context["exit_code"] == code
    assert context["streams"] == ["main"] and read_manifest(run).identity["config"] == {"lr": 0.1}
    assert context.get("signal") == ("SIGKILL" if code == -signal.SIGKILL else None)
