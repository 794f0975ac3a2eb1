"""A twice run in an MLflow tracking store: a command line's options as its params (the export
into a real store: the slow tests/e2e/test_integrations.py, MLflow's database taking seconds to
create)."""

from twice.integrations.mlflow import argv_params


def test_a_command_lines_options_are_its_params():
    argv = ["--lr", "0.1", "--batch-size=32", "data/", "--amp", "--", "--not-an-option", "x"]
    assert argv_params(argv) == {
        "lr": "0.1",
        "batch_size": "32",
        "amp": "true",
        "not_an_option": "x",
    }
