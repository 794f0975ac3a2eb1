"""The command line's conventions: one spelling of each shared flag, help for every option,
progress on stderr (live on a terminal, a line per event elsewhere), JSON where asked."""

import io
import json
import sys
from pathlib import Path

import click
import pytest
from conftest import runs, script, twice

from twice.app.progress import Reporter
from twice.cli import main

# Commands that start processes of their own: they take -q (the result only) and -v (echo the
# processes' output).
STARTING = ["verify", "locate", "bisect", "sweep", "audit"]


def _commands(group=main, prefix=""):
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            yield from _commands(command, f"{prefix}{name} ")
        else:
            yield f"{prefix}{name}", command


def test_every_option_has_help_and_the_shared_flags_are_spelled_alike():
    seen = {}
    for name, command in _commands():
        for param in command.params:
            if not isinstance(param, click.Option) or param.name == "help":
                continue
            assert param.help, f"twice {name} {param.opts[0]} has no help text"
            if param.name in ("as_json", "quiet", "verbose", "runs_dir"):
                seen.setdefault(param.name, set()).add(tuple(sorted(param.opts)))
    assert seen["quiet"] == {("--quiet", "-q")} and seen["verbose"] == {("--verbose", "-v")}
    assert seen["as_json"] == {("--json",)} and seen["runs_dir"] == {("--runs-dir",)}
    commands = dict(_commands())
    for name in STARTING:
        names = {p.name for p in commands[name].params}
        assert {"quiet", "verbose", "as_json"} <= names, name
    for name in ("sweep", "export mlflow", "checkpoint verify", "checkpoint ls", "ls", "show"):
        assert "as_json" in {p.name for p in commands[name].params}, name


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_is_a_live_display_on_a_terminal_and_lines_elsewhere(tmp_path):
    run = tmp_path / "r"
    run.mkdir()
    (run / "trace.jsonl").write_text('{"step":0}\n{"step":1}\n')
    log = io.StringIO()
    with Reporter("verify", stream=log) as reporter:
        reporter.started(run, "verify of base", 2)
        reporter.count("n", "segments", 1, 4)
        reporter.count("n", "segments", 1, 4)  # unchanged: no second line
        reporter.ended(run, 0)
    assert log.getvalue().splitlines() == [
        "twice verify: verify of base started (2 steps)",
        "twice verify: segments: 1/4",
        "twice verify: verify of base ended: 2 steps in 0.0 s",
    ]
    terminal = _Terminal()
    with Reporter("verify", stream=terminal) as reporter:
        reporter.started(run, "verify of base", 2)
        reporter.ended(run, 0)
    assert "\x1b[" in terminal.getvalue()  # drawn, not printed line by line
    assert "twice verify: verify of base ended: 2 steps" in terminal.getvalue()
    quiet = io.StringIO()
    with Reporter("verify", quiet=True, stream=quiet) as reporter:
        reporter.started(run, "verify of base", 2)
        reporter.ended(run, 0)
    assert quiet.getvalue() == ""


@pytest.mark.slow  # costly; its capability keeps a faster test in `make test`
def test_verify_reports_its_re_run_on_stderr_and_q_silences_it(tmp_path):
    script("tiny_train.py", tmp_path)
    assert (
        twice(
            "run", "--name", "base", "--", sys.executable, "tiny_train.py", "w.pt", cwd=tmp_path
        ).returncode
        == 0
    )
    shown = twice("verify", "base", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stderr.splitlines()
    assert lines[0].startswith("twice verify: verify of ") and lines[0].endswith(
        "started (8 steps)"
    )
    assert lines[1].startswith("twice verify: verify of ") and " ended: 8 steps in " in lines[1]
    quiet = twice("verify", "-q", "latest", cwd=tmp_path)
    assert "twice verify:" not in quiet.stderr and quiet.stdout.startswith("reproducible")
    # JSON where asked: the checkpoint commands too.
    listed = json.loads(twice("checkpoint", "ls", "base", "--json", cwd=tmp_path).stdout)
    assert isinstance(listed, list)
    assert len(runs(tmp_path)) == 3


def test_the_readme_is_a_guide_of_at_most_300_lines():
    readme = Path(__file__).parents[2] / "README.md"
    assert len(readme.read_text().splitlines()) <= 300, "move reference to docs/, keep the guide"
