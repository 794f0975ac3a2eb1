"""core/resumed: a resumed run's difference is named as state the resume did not restore, never
as the runs' code or seeds."""

import pytest

from twice.core.divergence import Divergence
from twice.core.records import CAUSAL_ORDER
from twice.core.resumed import explain_resumed


def test_agreeing_runs_say_from_where():
    assert (
        explain_resumed("B", "ckpt-4", 4, None)
        == "run B resumed from ckpt-4; the runs agree from step 4 on"
    )


@pytest.mark.parametrize("field", CAUSAL_ORDER)
def test_a_difference_at_the_first_resumed_step_is_what_the_resume_did_not_restore(field):
    said = explain_resumed("B", "ckpt-4", 4, Divergence("main", 4, [field]))
    assert said.startswith("run B resumed from ckpt-4; first divergence at the first resumed step")
    assert "the resume did not restore" in said and "nondeterminism" not in said


def test_a_later_difference_counts_the_steps_since_the_resume():
    said = explain_resumed("B", "ckpt-4", 4, Divergence("main", 6, ["loss"]), lead="B went on")
    assert said.startswith("B went on at step 4; first divergence 2 steps later, at step 6")
    assert "state the checkpoint does not hold" in said
