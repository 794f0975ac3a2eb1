"""A cause only from its evidence: each sentence that names a cause holds the evidence it needs,
and where a piece is missing the sentence says what is unknown instead of guessing. Generated
trace pairs lack each piece of evidence in turn (core/divergence.py, EVIDENCE)."""

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from twice.core.causes import EVIDENCE, UNKNOWN, explain, missing_evidence
from twice.core.divergence import first_divergence
from twice.core.manifest import compare_identity
from twice.core.records import COMPARED_FIELDS, StepRecord

EXHAUSTIVE = os.environ.get("TWICE_EXHAUSTIVE") == "1"
NONDETERMINISM = "nondeterminism inside the run"


def _record(step, salt=""):
    return StepRecord(
        step=step,
        batch=f"{step:031x}1",
        rng={"torch": f"{step:031x}2"},
        loss=float(step + 1).hex(),
        grads=f"{step:031x}3",
        grad_norm=float(step + 2).hex(),
        lr=[(0.1).hex()],
        params=f"{step:031x}4",
        params_before=f"{0:032x}" if step == 0 else None,
    )


@settings(max_examples=1000 if EXHAUSTIVE else 150, derandomize=not EXHAUSTIVE, deadline=None)
@given(
    steps=st.integers(1, 6),
    data=st.data(),
    drop=st.sets(st.sampled_from(["batch", "rng", "before", "start", "inputs"])),
)
def test_nondeterminism_is_named_only_with_all_its_evidence(steps, data, drop):
    at = data.draw(st.integers(0, steps - 1))
    field = data.draw(st.sampled_from(COMPARED_FIELDS))
    a, b = [_record(s) for s in range(steps)], [_record(s) for s in range(steps)]
    setattr(
        b[at],
        field,
        {"torch": "f" * 32}
        if field == "rng"
        else ["0x1.8p+0"]
        if field == "lr"
        else (1234.5).hex()
        if field in ("loss", "grad_norm")
        else "e" * 32,
    )
    for record in a + b:
        if "batch" in drop and field != "batch":
            record.batch = None
        if "rng" in drop and field != "rng":
            record.rng = {}
        if "start" in drop:
            record.params_before = None
    if "before" in drop and at > 0:  # the step before the divergence was not recorded
        del a[at - 1], b[at - 1]
    divergence = first_divergence(a, b)
    assert divergence is not None and divergence.step == at and divergence.first == field
    inputs = "inputs" not in drop
    sentence = explain([], divergence, inputs_recorded=inputs)
    upstream = COMPARED_FIELDS[: COMPARED_FIELDS.index(field)]
    lacking = set()
    if not inputs:
        lacking.add("inputs")
    if ("before" in drop and at > 0) or (at == 0 and "start" in drop):
        lacking.add("start")
    for name in ("batch", "rng"):
        if name in drop and name in upstream:
            lacking.add(name)
    assert set(missing_evidence(divergence, inputs)) == lacking
    if field == "lr":  # set by the script, not computed by a kernel: never nondeterminism
        assert NONDETERMINISM not in sentence and "configured differently" in sentence
        return
    if lacking:
        assert NONDETERMINISM not in sentence, sentence
        for name in lacking:
            assert UNKNOWN[name] in sentence
    elif field == "batch":  # an RNG of the script's own may pick batches: never claimed away
        assert NONDETERMINISM not in sentence and "an RNG twice does not watch" in sentence
    else:
        assert NONDETERMINISM in sentence, sentence


@pytest.mark.parametrize("env", [None, [], ["LR"], ["A", "B", "C", "LR"]])
def test_a_learning_rate_that_differs_first_is_a_configuration_never_nondeterminism(env):
    """A learning rate is set by the script: with everything before it equal, the runs were
    configured apart (an environment variable the launches differed in is named)."""
    a, b = [_record(s) for s in range(3)], [_record(s) for s in range(3)]
    b[1].lr = ["0x1.8p+0"]
    sentence = explain([], first_divergence(a, b), env_changed=env)
    assert NONDETERMINISM not in sentence and "configured differently" in sentence
    if env:
        assert f"their environments differ in {', '.join(env[:3])}" in sentence
        assert ("and 1 more" in sentence) == (len(env) == 4)
    else:
        assert "in a way the manifest does not hold" in sentence
        assert ("their environments were the same" in sentence) == (env == [])


@pytest.mark.parametrize("missing", EVIDENCE)
def test_each_piece_of_evidence_is_needed(missing):
    """The table itself: taking away any one piece takes the cause away."""
    a, b = [_record(s) for s in range(3)], [_record(s) for s in range(3)]
    b[2].loss = (9.0).hex()
    inputs = missing != "inputs"
    for record in a + b:
        if missing in ("batch", "rng"):
            setattr(record, missing, None if missing == "batch" else {})
    if missing == "start":
        del a[1], b[1]
    sentence = explain([], first_divergence(a, b), inputs_recorded=inputs)
    assert NONDETERMINISM not in sentence and UNKNOWN[missing] in sentence


def test_a_changed_input_file_is_named_first_among_the_causes():
    diffs = compare_identity(
        {"inputs": {"data/train.bin": "a" * 32}, "threads": {"intra_op_threads": 1}},
        {"inputs": {"data/train.bin": "b" * 32}, "threads": {"intra_op_threads": 2}},
    )
    a, b = [_record(s) for s in range(2)], [_record(s) for s in range(2)]
    b[0].batch = "c" * 32
    sentence = explain(diffs, first_divergence(a, b))
    assert sentence.endswith("the runs read different data: data/train.bin differs")
    assert NONDETERMINISM not in sentence


def test_a_process_that_started_from_other_parameters_is_a_race_only_with_the_inputs_known():
    a, b = [_record(s) for s in range(2)], [_record(s) for s in range(2)]
    b[0].params_before = "d" * 32
    divergence = first_divergence(a, b, stream="fork0")
    assert divergence.first == "params_before"
    sentence = explain([], divergence)
    assert NONDETERMINISM in sentence and "changed shared parameters" in sentence
    sentence = explain([], divergence, inputs_recorded=False)
    assert NONDETERMINISM not in sentence and UNKNOWN["inputs"] in sentence


def test_the_launched_processs_own_initial_weights_are_never_called_a_race():
    a, b = [_record(s) for s in range(2)], [_record(s) for s in range(2)]
    b[0].params_before = "d" * 32
    sentence = explain([], first_divergence(a, b))
    assert NONDETERMINISM not in sentence and "initial parameters differ" in sentence
    observed = explain([], first_divergence(a, b), observed=True)
    assert "--observe" in observed and NONDETERMINISM not in observed


# What each field's difference is said to mean when the step's start is known equal.
_COMPUTED = {
    "loss": "the forward computation differs",
    "grads": "the backward computation differs",
    "grad_norm": "the norm computation differs",
    "params": "the update differs",
}


_ONE = ("loss", "grad_norm")  # "differs"; the others "differ"


@pytest.mark.parametrize("field", sorted(_COMPUTED))
@pytest.mark.parametrize("changed_file", [False, True])
@pytest.mark.parametrize("gap", [1, 2])
def test_a_step_after_an_unrecorded_one_never_blames_its_own_computation(field, changed_file, gap):
    """--trace-every (or a partial trace): the step before the divergence was not compared, so
    what it computes from its starting parameters may differ because of the steps in between.
    With or without a cause from the manifests, the sentence says so and names no stage."""
    a, b = [_record(s) for s in range(5)], [_record(s) for s in range(5)]
    at = 4
    setattr(b[at], field, (1234.5).hex() if field in ("loss", "grad_norm") else "e" * 32)
    for _ in range(gap):  # the steps just before it were not recorded
        del a[at - 1 - _], b[at - 1 - _]
    diffs = []
    if changed_file:
        diffs = compare_identity(
            {"inputs": {"data/train.bin": "a" * 32}}, {"inputs": {"data/train.bin": "b" * 32}}
        )
    divergence = first_divergence(a, b)
    assert divergence.step == at and not divergence.start_known
    sentence = explain(diffs, divergence)
    assert _COMPUTED[field] not in sentence and NONDETERMINISM not in sentence, sentence
    assert f"step {at - 1} was not recorded in both runs" in sentence, sentence
    assert ("data/train.bin differs" in sentence) == changed_file
    # with the step before it recorded, the stage is named as ever
    full_a, full_b = [_record(s) for s in range(5)], [_record(s) for s in range(5)]
    setattr(full_b[at], field, getattr(b[-1], field))
    full = explain(diffs, first_divergence(full_a, full_b))
    assert "not recorded in both runs" not in full and f"differ{'s' * (field in _ONE)}:" in full


def test_a_resumed_steps_recorded_start_stands_for_the_step_before_it():
    """A resumed run's first step records the parameters it starts from: where both runs hold
    them, equal, the start is known though the step before it was not compared."""
    a, b = [_record(s) for s in range(5)], [_record(s) for s in range(5)]
    b[4].loss = (1234.5).hex()
    del a[3], b[3]
    a[-1].params_before = b[-1].params_before = "ab" * 16
    divergence = first_divergence(a, b)
    assert divergence.start_known
    assert "not recorded in both runs" not in explain([], divergence)


@pytest.mark.parametrize("env", [None, [], ["LR"]])
def test_parameters_updated_by_hand_never_blame_nondeterminism(env):
    """A loop that updates by hand records no learning rate: parameters that differ first, with
    everything before them equal, may differ by the script's own number (an environment
    variable, a file): the cause is unknown, never a race or a kernel."""
    a, b = [_record(s) for s in range(3)], [_record(s) for s in range(3)]
    for record in a + b:
        record.lr = None
    b[1].params = "e" * 32
    divergence = first_divergence(a, b)
    assert divergence.first == "params" and "lr" not in divergence.recorded
    sentence = explain([], divergence, env_changed=env)
    assert NONDETERMINISM not in sentence and "race" not in sentence, sentence
    assert "the update's settings were not recorded" in sentence
    assert ("environments differ in LR" in sentence) == bool(env)
