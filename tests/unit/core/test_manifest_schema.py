"""The manifest's schema: each field's check, the error that names the field, the stream names."""

import math

import pytest

from twice.core.errors import CorruptRecord
from twice.core.manifest_schema import FIELDS, SHAPES, STREAM, check

BY_KEY = {(part, key): test for part, key, _, test, *_ in (*FIELDS, *SHAPES)}


@pytest.mark.parametrize("name", ["main", "rank3", "proc1-2", "rank0.sub1", "a_b"])
def test_a_stream_is_a_tag_of_dot_separated_words(name):
    assert STREAM.fullmatch(name)


@pytest.mark.parametrize("name", ["", ".", "rank0.", "../x", "a/b", "a b", "rank0..sub"])
def test_a_stream_that_could_name_another_file_is_refused(name):
    assert not STREAM.fullmatch(name)


def test_every_field_is_listed_once_per_check_list():
    assert len({(part, key) for part, key, *_ in FIELDS}) == len(FIELDS)
    assert all(part in ("identity", "context") for part, *_ in (*FIELDS, *SHAPES))
    assert {key for part, key, *_, required in FIELDS if required} == {"argv", "status"}


@pytest.mark.parametrize(
    "part, key, good, bad",
    [
        ("identity", "argv", ["python", "t.py"], ["python", 3]),
        ("identity", "seed", 2**64, 2**64 + 1),
        ("identity", "seed", 0, True),  # a bool is not an integer here
        ("context", "trace_every", 1, 0),
        ("context", "streams", ["main", "rank1"], ["main", "main"]),
        ("context", "loss_fault", {"step": 3, "value": "nan"}, {"step": 3, "value": "1e9"}),
        ("context", "started", 1.7e9, math.inf),
        ("context", "started", None, -1),
        ("context", "child_pid", 4242, 0),
        ("identity", "threads", {"intra_op": 4}, {"intra_op": -1}),
        ("context", "inputs", [{"path": "a", "size": 3, "xxh3": None}], [{"path": 1}]),
        ("context", "recording", {"trace_every": 2, "mlflow": False}, {"mlflow": "yes"}),
    ],
)
def test_a_value_of_the_right_shape_passes_and_one_of_another_is_refused(part, key, good, bad):
    test = BY_KEY[(part, key)]
    assert test(good) and not test(bad)


def test_a_refusal_names_the_file_the_key_what_was_expected_and_a_cut_value():
    check(True, "m.json", "context.steps", "a count", -1)  # passes: nothing raised
    with pytest.raises(CorruptRecord) as raised:
        check(False, "runs/a/manifest.json", "context.steps", "a count or null", "x" * 100)
    message = raised.value.message
    assert message.startswith("runs/a/manifest.json: context.steps must be a count or null, not 'x")
    assert message.endswith("...") and len(message) < 130
    assert "re-record the run" in raised.value.hint
