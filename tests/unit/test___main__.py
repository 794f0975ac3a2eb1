"""`python -m twice`: the same command line as the `twice` script, run as the module's main."""

import runpy
import sys

import twice.__main__
from twice.cli import main


def test_the_module_runs_the_one_command_line(monkeypatch, capsys):
    assert twice.__main__.main is main  # imported without running it
    monkeypatch.setattr(sys, "argv", ["twice", "--version"])
    runpy.run_path(twice.__main__.__file__, run_name="__main__")  # `--version` returns: exit 0
    assert capsys.readouterr().out.startswith("twice, version ")
