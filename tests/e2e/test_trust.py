"""Untrusted run folders, kills of the launcher, write failures and file permissions: real
processes and real files."""

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import clean_env, runs, script, twice

TINY = "import sys\nprint('trained', flush=True)\n"


def _recorded(tmp_path, text=TINY, name="ok.py"):
    (tmp_path / name).write_text(text)
    result = twice("run", "--", sys.executable, name, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    return runs(tmp_path)[-1]


def _edit_manifest(run, edit):
    path = run / "manifest.json"
    manifest = json.loads(path.read_text())
    edit(manifest)
    path.write_text(json.dumps(manifest))


def test_a_folder_from_another_machine_is_not_re_run_without_yes(tmp_path):
    """verify, locate and bisect show the command and refuse; nothing runs."""
    run = _recorded(tmp_path)
    marker = tmp_path / "ran"
    _edit_manifest(
        run,
        lambda m: (
            m["context"]["launcher"].__setitem__("host", "cluster-node-7"),
            m["identity"].__setitem__("argv", ["touch", str(marker)]),
        ),
    )
    before = len(runs(tmp_path))
    for command in (("verify", run), ("locate", run, run), ("bisect", run, run)):
        result = twice(*command, cwd=tmp_path)
        assert result.returncode == 2, (command, result.stdout, result.stderr)
        assert "its signature is not this user's" in result.stderr
        assert f"it would run: touch {marker}" in result.stderr
        assert "hint: check the command, then pass --yes" in result.stderr
    assert not marker.exists() and len(runs(tmp_path)) == before


def test_with_yes_only_numerics_variables_are_applied_again(tmp_path):
    """A crafted manifest's BASH_ENV, LD_PRELOAD and PYTHONSTARTUP are never applied; its thread
    count is."""
    evil = tmp_path / "evil.sh"
    evil.write_text(f"touch {tmp_path / 'pwned'}\n")
    run = _recorded(tmp_path)
    _edit_manifest(
        run,
        lambda m: (
            m["context"]["launcher"].__setitem__("host", "elsewhere"),
            m["identity"].__setitem__(
                "argv",
                ["bash", "-c", "echo threads=$OMP_NUM_THREADS preload=$LD_PRELOAD"],
            ),
            m["identity"]["env"].update(
                BASH_ENV=str(evil),
                LD_PRELOAD="/nonexistent.so",
                PYTHONSTARTUP=str(evil),
                CUDA_INJECTION64_PATH="/nonexistent.so",
                NCCL_NET_PLUGIN="/nonexistent",
                OMP_TOOL_LIBRARIES="/nonexistent.so",
                TORCH_EXTENSIONS_DIR=str(tmp_path / "ext"),
                TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "cache"),
                MKL_NUM_THREADS="$(touch pwned)",
                OMP_NUM_THREADS="3",
            ),
        ),
    )
    result = twice("verify", run, "--yes", cwd=tmp_path)
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "pwned").exists()
    rerun = runs(tmp_path)[-1]
    assert (rerun / "stdout.log").read_text() == "threads=3 preload=\n"
    replayed = json.loads((rerun / "manifest.json").read_text())["identity"]["env"]
    for name in (
        "CUDA_INJECTION64_PATH",
        "NCCL_NET_PLUGIN",
        "OMP_TOOL_LIBRARIES",
        "MKL_NUM_THREADS",
    ):
        assert name not in replayed, name
    assert not (tmp_path / "ext").exists() and not (tmp_path / "cache").exists()


def test_trust_comes_from_the_signature_not_the_host_or_the_owner(tmp_path):
    """A copied folder is yours by owner and host; with one field edited, or signed by another
    user's key, its command is still refused. An unedited folder of yours re-runs unasked."""
    import shutil

    run = _recorded(tmp_path)
    manifest = json.loads((run / "manifest.json").read_text())
    assert len(manifest["context"]["signature"]) == 64
    key = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "twice" / "key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    result = twice("verify", "-q", run, cwd=tmp_path)
    assert "re-run recorded in" in result.stderr, result.stderr  # its own: no question asked
    assert "signature" not in result.stderr
    marker = tmp_path / "ran"
    copy = tmp_path / "copied"
    shutil.copytree(run, copy)
    _edit_manifest(copy, lambda m: m["identity"].__setitem__("argv", ["touch", str(marker)]))
    result = twice("verify", copy, cwd=tmp_path)
    assert result.returncode == 2 and "its signature is not this user's" in result.stderr
    other = tmp_path / "colleague"
    result = twice("verify", run, cwd=tmp_path, env=clean_env(XDG_CONFIG_HOME=str(other)))
    assert result.returncode == 2 and "this user has no signing key" in result.stderr
    assert not marker.exists()


@pytest.mark.slow
def test_the_training_dies_with_its_launcher(tmp_path):
    """SIGKILL to `twice run` once left the training running for good; now it dies with it."""
    (tmp_path / "forever.py").write_text("import time\nwhile True:\n    time.sleep(0.05)\n")
    launcher = subprocess.Popen(
        [sys.executable, "-m", "twice", "run", "--", sys.executable, "forever.py"],
        cwd=tmp_path,
        env=clean_env(),
    )
    child = None
    for _ in range(200):
        folders = list((tmp_path / "runs").glob("*/manifest.json"))
        if folders:
            child = json.loads(folders[0].read_text())["context"].get("child_pid")
            if child:
                break
        time.sleep(0.05)
    assert child, "the launcher never started its command"
    launcher.send_signal(signal.SIGKILL)
    launcher.wait()
    for _ in range(100):
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        if open(f"/proc/{child}/stat").read().split()[2] == "Z":  # dead, not yet reaped
            break
        time.sleep(0.05)
    else:
        os.kill(child, signal.SIGKILL)
        pytest.fail("the training outlived its launcher")
    (run,) = runs(tmp_path)
    assert "crashed" in twice("show", run, cwd=tmp_path).stdout


def test_write_failures_are_errors_and_leave_no_run_folder(tmp_path):
    (tmp_path / "ok.py").write_text(TINY)
    (tmp_path / "a-file").write_text("")
    result = twice("run", "--runs-dir", "a-file", "--", sys.executable, "ok.py", cwd=tmp_path)
    assert result.returncode == 2 and result.stderr.startswith("error: ")
    assert "hint: " in result.stderr and "Traceback" not in result.stderr
    readonly = tmp_path / "readonly"
    readonly.mkdir()
    readonly.chmod(0o500)
    try:
        if os.access(readonly, os.W_OK):
            pytest.skip("running as a user who may write anywhere")
        result = twice(
            "run", "--runs-dir", readonly / "runs", "--", sys.executable, "ok.py", cwd=tmp_path
        )
        assert result.returncode == 2 and "Traceback" not in result.stderr
        assert not (readonly / "runs").exists() or not any((readonly / "runs").iterdir())
    finally:
        readonly.chmod(0o700)


@pytest.mark.parametrize("target", ["a-file/report.html", "missing/report.html", "."])
def test_diff_html_to_an_unwritable_path_is_exit_2_before_the_verdict(tmp_path, target):
    run = _recorded(tmp_path)
    (tmp_path / "a-file").write_text("")
    result = twice("diff", run, run, "--html", target, cwd=tmp_path)
    assert result.returncode == 2 and result.stderr.startswith("error: cannot write the report")
    assert "identical" not in result.stdout


def test_resume_from_a_bad_path_is_refused_before_the_script_starts(tmp_path):
    (tmp_path / "ok.py").write_text("open('started', 'w').close()\n")
    (tmp_path / "not-a-checkpoint").mkdir()
    for path in ("missing", "not-a-checkpoint"):
        result = twice("run", "--resume", path, "--", sys.executable, "ok.py", cwd=tmp_path)
        assert result.returncode == 2 and result.stderr.startswith("error: ")
        assert not (tmp_path / "started").exists()
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").iterdir())


def test_files_twice_writes_follow_the_umask(tmp_path):
    """manifest.json, config.json, checkpoints and report.html were 0600 (mkstemp's mode)."""
    script("every_checkpoint.py", tmp_path)
    env = clean_env()
    result = subprocess.run(
        [
            "bash",
            "-c",
            f"umask 022 && {sys.executable} -m twice run -- {sys.executable} every_checkpoint.py",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    (run,) = runs(tmp_path)
    twice("report", run, "-o", tmp_path / "report.html", cwd=tmp_path)
    checked = [run / "manifest.json", tmp_path / "report.html", *run.glob("checkpoints/step-*")]
    checked += list(run.glob("checkpoints/step-*/*"))
    for path in checked:
        mode = stat.S_IMODE(path.stat().st_mode)
        expected = 0o755 if path.is_dir() else 0o644
        assert mode == expected, (path, oct(mode))


DAMAGES_ITS_RECORDS = """
import json, os, pathlib
procs = pathlib.Path(os.environ["TWICE_RUN_DIR"]) / "procs"
procs.mkdir(exist_ok=True)
(procs / "1.json").write_text(json.dumps({"sources": 5, "distributed": "x"}))
(procs / "2.json").write_text('{"started": 1, "sour')
(pathlib.Path(os.environ["TWICE_RUN_DIR"]) / "config.json").write_text("{not json")
print("trained")
"""


def test_damaged_process_records_are_skipped_and_named_not_a_crash(tmp_path):
    (tmp_path / "damage.py").write_text(DAMAGES_ITS_RECORDS)
    result = twice("run", "--", sys.executable, "damage.py", cwd=tmp_path)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    context = json.loads((runs(tmp_path)[-1] / "manifest.json").read_text())["context"]
    assert context["status"] == "completed"
    assert context["damaged_process_records"] == ["1.json", "2.json"]
    assert context["damaged_config"] is True
    shown = twice("show", runs(tmp_path)[-1].name, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
