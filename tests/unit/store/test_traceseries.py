"""The series of long traces for plots, read as they stream: losses, learning rates, gradient
norms and the differing steps, each what a full parse gives, through twice._native and Python."""

import pytest

from twice.core.errors import CorruptRecord
from twice.core.records import StepRecord, record_line
from twice.store.traces import read_trace
from unit.store.test_tracescan import _record


def test_the_loss_series_and_difference_steps_are_what_a_full_parse_gives(tmp_path, walk):
    from twice.core.downsample import lttb
    from twice.store.traceseries import difference_steps, loss_series

    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    records_a = [_record(s, time=s / 3) for s in range(0, 300)]
    records_b = [_record(s, s in (7, 250), time=s / 5) for s in range(0, 300)]
    records_a[10] = StepRecord(step=10, loss=["inf", (1.0).hex()], time=1.0)  # a list, infinite
    records_a[11] = StepRecord(step=11, loss="nan:7ff8000000000000")
    records_a[12] = StepRecord(step=12, params="0" * 32)  # no loss: no point
    a.write_bytes(b"".join(map(record_line, records_a)))
    b.write_bytes(b"".join(map(record_line, records_b)))
    steps, values = loss_series(a)
    full = [r for r in read_trace(a) if r.loss is not None]
    assert steps.tolist() == [r.step for r in full]
    expected = [
        float("nan") if str(r.loss).startswith("nan") else float.fromhex(r.loss)
        for r in (
            x if not isinstance(x.loss, list) else StepRecord(x.step, x.loss[0]) for x in full
        )
    ]
    assert [repr(v) for v in values.tolist()] == [repr(v) for v in expected]  # bit for bit
    first, last, where, masks = difference_steps(a, b)
    by_step = {r.step: r for r in read_trace(b)}
    differing = [
        r.step
        for r in read_trace(a)
        if any(getattr(r, n) != getattr(by_step[r.step], n) for n in ("loss", "grads", "params"))
    ]
    assert (first, last) == (0, 299) and where.tolist() == differing
    assert 250 in steps[lttb(steps, values, 20, keep=[250])].tolist()


def test_every_plotted_series_is_what_a_full_parse_gives(tmp_path, walk):
    from twice.store.traceseries import trace_series

    path = tmp_path / "t.jsonl"
    records = [
        _record(s, time=s / 3) if s % 4 else StepRecord(step=s, lr=[(0.1 / (s + 1)).hex()])
        for s in range(0, 200)
    ]
    # Tensors named "loss" and "lr" in a digest map are not the run's loss or learning rate.
    records[5] = StepRecord(
        step=5, loss="-inf", grad_norm="nan:7ff8000000000001", grad_digests={"loss": "a" * 32}
    )
    records[6] = StepRecord(step=6, lr=[(3.0).hex(), (1.0).hex()], param_digests={"lr": "b" * 32})
    path.write_bytes(b"".join(map(record_line, records)))

    def value(text):
        return float("nan") if text.startswith("nan") else float.fromhex(text)

    series = trace_series(path)
    full = read_trace(path)
    for name, pick in (
        ("loss", lambda r: r.loss[0] if isinstance(r.loss, list) else r.loss),
        ("lr", lambda r: (r.lr or [None])[0]),
        ("grad_norm", lambda r: r.grad_norm),
    ):
        held = [r for r in full if pick(r) is not None]
        steps, values = series[name]
        assert steps.tolist() == [r.step for r in held], name
        assert [repr(v) for v in values.tolist()] == [repr(value(pick(r))) for r in held], name


def test_a_damaged_line_stops_the_series_with_the_readers_error(tmp_path, walk):
    from twice.store.traceseries import trace_series

    path = tmp_path / "t.jsonl"
    lines = [record_line(_record(s)) for s in range(5)]
    lines[3] = lines[3].replace(b'"step":3', b'"step":3,"step":3')
    path.write_bytes(b"".join(lines))
    with pytest.raises(CorruptRecord, match="line 4"):
        trace_series(path)
