"""The trace's record: every field checked as it is read, one canonical line per record, and the
causal fields two records of one step differ in."""

import json

import pytest

from twice.core import records
from twice.core.records import (
    FIELD_OF,
    NOT_COMPARED,
    StepRecord,
    differing_fields,
    is_hex_float,
    iter_values,
    record_line,
)
from unit.store.test_traces import _full_record

D = "0123456789abcdef" * 2  # a digest


def test_every_field_is_compared_or_declared_not_compared():
    fields = set(StepRecord.__dataclass_fields__) - {"step"}
    assert fields == set(FIELD_OF) | NOT_COMPARED
    assert NOT_COMPARED == {"time"}


def test_a_record_reads_back_equal_from_its_line():
    record = StepRecord(
        step=3,
        loss=[(0.5).hex(), "nan:7ff8000000000001"],
        batch=D,
        lr=[(0.1).hex()],
        rng={"torch": D},
        param_digests={"layer.weight": D, "naïve bias": D},
        skipped=True,
        time=0.25,
    )
    line = record_line(record)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert StepRecord.from_json(json.loads(line)) == record
    assert list(json.loads(line)) == sorted(json.loads(line))  # keys sorted: one line per record


def test_a_trace_line_is_the_same_bytes_through_orjson_or_json(monkeypatch):
    """Lines go through orjson where it is installed (13x faster than json, which was a tenth of
    tracing a small CNN's steps) and through json where it is not: the same bytes for ASCII names,
    and the same record read back for names beyond ASCII (UTF-8 against \\u escapes)."""
    import json

    from twice.core import records as trace

    assert trace.orjson is not None  # a dependency: else the fast path goes untested here
    fast = {
        name: trace.record_line(_full_record(name)) for name in ("layer3.weight", "couche_é.poids")
    }
    monkeypatch.setattr(trace, "orjson", None)
    slow = {name: trace.record_line(_full_record(name)) for name in fast}
    assert fast["layer3.weight"] == slow["layer3.weight"]
    assert fast["couche_é.poids"] != slow["couche_é.poids"]
    for name in fast:
        assert fast[name].endswith(b"\n") and fast[name].count(b"\n") == 1
        assert json.loads(fast[name]) == json.loads(slow[name]) == _full_record(name).to_json()
        assert StepRecord.from_json(json.loads(fast[name])) == _full_record(name)


@pytest.mark.parametrize(
    "data, message",
    [
        ([], "expected a JSON object, found a list"),
        ({"loss": (1.0).hex()}, "field 'step' is missing"),
        ({"step": 1}, "holds no evidence"),
        ({"step": True, "params": D}, "field 'step': expected a whole number"),
        ({"step": 2**63, "params": D}, "field 'step'"),
        ({"step": 0, "params": D.upper()}, "field 'params': expected a digest"),
        ({"step": 0, "loss": 0.5}, "field 'loss': expected a float's exact text"),
        ({"step": 0, "params": D, "time": -1}, "field 'time': expected a finite number"),
        ({"step": 0, "rng": {"torch": 7}}, "field 'rng'"),
    ],
)
def test_a_field_of_another_type_is_refused_naming_it(data, message):
    with pytest.raises(ValueError, match=message):
        StepRecord.from_json(data)


def test_a_field_this_version_does_not_know_is_ignored():
    assert StepRecord.from_json({"step": 1, "params": D, "future": [1]}) == StepRecord(1, params=D)


def test_hex_floats_are_exact_texts_only():
    assert (
        is_hex_float((0.1).hex()) and is_hex_float("-inf") and is_hex_float("nan:7ff8000000000000")
    )
    assert not is_hex_float("0.1") and not is_hex_float("nan") and not is_hex_float(0.1)


def test_differing_fields_come_in_causal_order_under_their_causal_field():
    a = StepRecord(step=1, loss="0x1p+0", params=D, grad_digests={"w": D}, batch=D)
    b = StepRecord(step=1, loss="0x1p+1", params="f" * 32, grad_digests={"w": "e" * 32}, batch=D)
    assert differing_fields(a, b) == ["loss", "grads", "params"]
    assert (
        differing_fields(
            a,
            StepRecord(step=1, loss="0x1p+0", params=D, grad_digests={"w": D}, batch=D, time=99.0),
        )
        == []
    )


def test_a_field_one_record_lacks_differs_unless_the_settings_explain_it():
    full = StepRecord(step=4, params=D, param_digests={"w": D}, params_before=D)
    lean = StepRecord(step=4, params=D)
    assert differing_fields(full, lean) == ["params_before", "params"]
    assert differing_fields(full, lean, resumed=True, partial=frozenset({"param_digests"})) == []
    other = StepRecord(step=4, params=D, param_digests={"w": "f" * 32})
    assert differing_fields(full, other, resumed=True, partial=frozenset({"param_digests"})) == [
        "params"
    ]


def test_iter_values_walks_the_compared_fields_in_causal_order():
    record = StepRecord(step=0, batch="b", loss="l", params="p")
    assert [name for name, _ in iter_values(record)] == list(records.COMPARED_FIELDS)
    assert dict(iter_values(record))["loss"] == "l"
