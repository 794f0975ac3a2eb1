"""app/sweepplan: `--vary` values times `--seeds` seeds as trials, each with its command and its
run name."""

import pytest

from twice.app.sweepplan import Trial, parse_vary, plan_trials
from twice.core.errors import UsageError


def test_the_grid_is_read_from_vary_and_bad_specs_are_refused():
    assert parse_vary(["lr=0.1, 0.01", "wd=0"]) == {"lr": ["0.1", "0.01"], "wd": ["0"]}
    for specs, message in [
        (["lr"], "is not NAME=VALUE"),
        (["lr=0.1,"], "is not NAME=VALUE"),
        (["lr=1", "lr=2"], "given twice or reserved"),
        (["seed=1"], "given twice or reserved"),
        (["lr=1,1"], "repeats a value"),
        ([], "nothing to vary"),
    ]:
        with pytest.raises(UsageError, match=message):
            parse_vary(specs)


def test_every_arm_and_seed_is_a_trial_seed_major_with_its_own_command_and_name():
    command = ["python", "train.py", "--lr", "{lr}", "--wd={wd}", "--seed", "{seed}"]
    trials = plan_trials({"lr": ["0.1", "1e-3"], "wd": ["0"]}, 2, command)
    assert [(t.arm_label, t.seed) for t in trials] == [
        ("lr=0.1,wd=0", 0),
        ("lr=1e-3,wd=0", 0),
        ("lr=0.1,wd=0", 1),
        ("lr=1e-3,wd=0", 1),
    ]
    assert trials[1].command(command) == [
        "python", "train.py", "--lr", "1e-3", "--wd=0", "--seed", "0",
    ]  # fmt: skip
    assert Trial((("path", "a/b c"),), 3).name == "path=a_b_c-seed3"  # a safe folder name


@pytest.mark.parametrize(
    "grid, seeds, command, message",
    [
        ({"lr": ["1"]}, 0, ["python", "t.py", "{lr}"], "--seeds must be at least 1"),
        ({"lr": ["1"]}, 1, [], "no command to run"),
        ({"lr": ["1"]}, 1, ["python", "t.py"], r"no placeholder for \{lr\}"),
        ({"lr": ["1"]}, 1, ["python", "t.py", "{lr}", "{wd}"], r"uses \{wd\}, which nothing"),
    ],
)
def test_a_plan_that_cannot_run_is_refused(grid, seeds, command, message):
    with pytest.raises(UsageError, match=message):
        plan_trials(grid, seeds, command)
