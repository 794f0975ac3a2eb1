"""`twice run` and `twice verify` refuse what they cannot do before anything starts or is written
(in process, click's CliRunner; the runs themselves are tests/e2e/)."""

import sys

import pytest
from click.testing import CliRunner

from twice.cli.group import main
from twice.cli.recording import run, verify


@pytest.mark.parametrize(
    "args, message, hint",
    [
        ([], "error: no command to run", "hint: put the command after --"),
        (
            ["--record-ops", "x", "--", sys.executable, "t.py"],
            "is not a list of steps",
            "3 or 0,10",
        ),
        (["--max-steps", "0", "--", sys.executable, "t.py"], "'--max-steps'", "hint: "),
    ],
)
def test_a_run_that_cannot_start_is_exit_2_and_writes_nothing(tmp_path, args, message, hint):
    assert main.commands["run"] is run
    result = CliRunner().invoke(main, ["run", "--runs-dir", str(tmp_path / "runs"), *args])
    assert result.exit_code == 2 and message in result.output and hint in result.output
    assert not (tmp_path / "runs").exists()


def test_verifying_a_run_that_is_not_there_is_exit_2_with_where_to_look(tmp_path):
    assert main.commands["verify"] is verify
    result = CliRunner().invoke(main, ["verify", str(tmp_path / "nothing")])
    assert result.exit_code == 2 and "error: no run" in result.output
    assert "hint: list runs with `twice ls`" in result.output
