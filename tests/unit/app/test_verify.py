"""app/verify: a resumed run's steps judged against the uninterrupted run's, and the state whose
loss each first difference names."""

import dataclasses

from twice.app.verify import ResumeCheck, compare_resumed
from twice.core.digests import digest
from unit.app.folders import steps

RUNS = {"straight": "runs/a", "resumed": "runs/c"}


def test_a_resume_that_continues_the_straight_run_is_bit_exact():
    full = steps([2.0, 1.5, 1.25, 1.0, 0.9])
    check = compare_resumed(full, [dataclasses.replace(r) for r in full[2:]], 2, RUNS)
    assert check.identical and check.exit_code == 0
    assert check.verdict == (
        "resume is bit-exact: steps 2-4 and the final parameters match the uninterrupted run"
    )


def test_a_first_difference_is_named_by_the_state_that_was_not_restored():
    full = steps([2.0, 1.5, 1.25, 1.0])
    params = [dataclasses.replace(r) for r in full[2:]]
    params[0].params = digest("moments lost")
    check = compare_resumed(full, params, 2, RUNS)
    assert not check.identical and check.exit_code == 1
    assert check.cause == "the optimizer's state was not restored (moments, step counts)"
    assert check.verdict.startswith("resume differs: first divergence at step 2")
    later = [dataclasses.replace(r) for r in full[2:]]
    later[1].lr = ["0x1.0p-1"]
    check = compare_resumed(full, later, 2, RUNS)
    assert check.cause == (
        "state that matters only later was not restored; at step 3: the learning-rate "
        "scheduler's state was not restored"
    )
    assert check.to_json()["divergence"]["step"] == 3


def test_parameters_not_restored_and_a_resume_that_stops_early_are_named():
    full = steps([2.0, 1.5, 1.25, 1.0])
    fresh = [dataclasses.replace(r) for r in full[2:]]
    fresh[0].params_before = digest("freshly initialised")
    check = compare_resumed(full, fresh, 2, RUNS)
    assert check.cause.startswith("the model's parameters were not restored")
    assert check.divergence == {"step": 2, "fields": ["params_before"]}
    short = compare_resumed(full, [dataclasses.replace(full[2])], 2, RUNS)
    assert short.verdict == (
        "resume differs: the resumed run recorded 1 steps where the straight run has 2 after step 2"
    )
    assert isinstance(short, ResumeCheck) and short.runs == RUNS
