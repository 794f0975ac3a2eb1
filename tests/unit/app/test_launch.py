"""app/launch: the command twice run starts (and what it refuses before starting it), and the
environment the command is given."""

import sys
from pathlib import Path

import pytest

from twice.app.launch import BOOT_DIR, child_environment, portable_policy, resolve_command
from twice.app.options import RunOptions
from twice.core.errors import UsageError
from twice.core.protocol import ChildSettings


def test_a_script_runs_with_this_python_and_is_found(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("pass\n")
    assert resolve_command(["train.py", "--lr", "1"]) == (
        [sys.executable, "train.py", "--lr", "1"],
        Path("train.py"),
    )
    argv, script = resolve_command([sys.executable, "-u", "-m", "json.tool"])
    assert argv[-2:] == ["-m", "json.tool"] and script is None  # installed: no script to hash


def test_a_module_in_the_folder_is_the_runs_script(tmp_path, monkeypatch):
    """`python -m pkg.train` runs pkg/train.py from the current folder (first on a -m run's
    path), a package its __main__.py: that file is the run's script, as a path run is."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pkg" / "tools").mkdir(parents=True)
    (tmp_path / "pkg" / "train.py").write_text("pass\n")
    (tmp_path / "pkg" / "tools" / "__main__.py").write_text("pass\n")
    for module, found in (
        ("pkg.train", Path("pkg/train.py")),
        ("pkg.tools", Path("pkg/tools/__main__.py")),
        ("pkg.absent", None),
        ("../etc", None),
    ):
        assert resolve_command([sys.executable, "-m", module, "--lr", "1"])[1] == found, module


@pytest.mark.parametrize(
    "command, message",
    [
        ([], "no command to run"),
        (["no-such-command-here"], "command not found: no-such-command-here"),
        ([sys.executable, "absent.py"], "script not found: absent.py"),
    ],
)
def test_a_command_that_cannot_run_is_refused_before_it_starts(
    tmp_path, monkeypatch, command, message
):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError, match=message):
        resolve_command(command)


def test_the_child_is_told_its_settings_and_the_launchers_own_variables_do_not_leak(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("TWICE_SEED", "99")  # an outer `twice run`'s: the launcher owns it
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    options = RunOptions(seed=5, trace_every=3, env={"EXTRA": "1"})
    env = child_environment(options, tmp_path / "run")
    settings = ChildSettings.from_env(env)
    assert settings.seed == 5 and settings.trace_every == 3 and settings.determinism == "strict"
    assert settings.run_dir == str((tmp_path / "run").resolve())
    assert env["PYTHONPATH"].split(":") == [str(BOOT_DIR), "/elsewhere"]
    assert env["EXTRA"] == "1" and env["PYTHONHASHSEED"] == "0" and env["NCCL_ALGO"] == "Ring"
    observed = child_environment(RunOptions(observe=True), tmp_path / "run")
    assert ChildSettings.from_env(observed).seed is None and "PYTHONHASHSEED" not in observed


def test_uncovered_ops_are_errors_only_under_strict():
    assert portable_policy("strict") == "strict"
    assert portable_policy("warn") == portable_policy("off") == "warn"
