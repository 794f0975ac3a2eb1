"""app/segments: the spans between a run's checkpoints that `verify --segments` re-runs (the
first and the last always), and the verdict of what they showed."""

import pytest

from twice import checkpoint
from twice.app.segments import Segment, SegmentsCheck, plan_segments
from twice.checkpoint.saveload import step_dir
from twice.core.errors import UsageError
from twice.store.layout import RunFolder


def _run_with_checkpoints(tmp_path, steps):
    run = tmp_path / "run"
    for step in steps:
        checkpoint.save(step_dir(RunFolder(run).checkpoints, step), step=step)
    return run


def test_the_spans_run_between_checkpoints_and_a_sample_keeps_the_ends(tmp_path):
    run = _run_with_checkpoints(tmp_path, [4, 8, 12, 16, 20])
    every, total, steps = plan_segments(run, None, seed=0, steps=22)
    assert [(s.start, s.end) for s in every] == [
        (0, 4),
        (4, 8),
        (8, 12),
        (12, 16),
        (16, 20),
        (20, 22),
    ]
    assert total == 6 and steps == 22
    assert every[0].checkpoint is None and every[1].checkpoint.name == "step-00000004"
    assert every[-1].end_checkpoint is None  # no checkpoint at the run's last step
    sample, _, _ = plan_segments(run, 3, seed=5, steps=22)
    assert len(sample) == 3 and sample[0].start == 0 and sample[-1].end == 22
    assert plan_segments(run, 3, seed=5, steps=22)[0] == sample  # the seed decides the sample


def test_a_run_without_checkpoints_or_steps_or_a_sample_of_one_is_refused(tmp_path):
    with pytest.raises(UsageError, match="has no checkpoints"):
        plan_segments(tmp_path, None, 0, 10)
    run = _run_with_checkpoints(tmp_path, [4, 8])
    with pytest.raises(UsageError, match="recorded no steps"):
        plan_segments(run, None, 0, 0)
    with pytest.raises(UsageError, match="at least 2"):
        plan_segments(run, 1, 0, 12)


def test_the_verdict_says_what_was_shown_what_it_is_worth_and_what_it_cost():
    spans = [Segment(0, 4, None, None, True, "same"), Segment(8, 12, None, None, True, "same")]
    check = SegmentsCheck("runs/a", seed=1, total=3, run_steps=12, checked=spans)
    assert check.identical and check.exit_code == 0
    assert check.verdict() == (
        "2 of 3 segments re-run bit-identical (steps 0-4, 8-12); a run in which a fraction p of "
        "segments do not reproduce is caught with probability 1-(1-p)^2 (19% for p = 10%); "
        "cost 67% of the run's steps (seed 1)"
    )
    spans[1].identical = False
    assert check.exit_code == 1 and check.verdict().startswith(
        "NOT reproducible: 1 of 2 segments re-run differ (steps 8-12)"
    )
    assert check.to_json()["checked"][1] == {
        "steps": [8, 12],
        "identical": False,
        "verdict": "same",
        "rerun": None,
    }
