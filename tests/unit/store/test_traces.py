import pytest

from twice.core.errors import CorruptRecord
from twice.core.records import StepRecord
from twice.store.traces import TraceWriter, read_trace


def write(path, n):
    writer = TraceWriter(path)
    for step in range(n):
        writer.write(
            StepRecord(step=step, loss=float.hex(step / 3), batch=f"{step:032x}", time=float(step))
        )
    writer.close()


def test_records_round_trip_exactly(tmp_path):
    write(tmp_path / "trace.jsonl", 5)
    records = read_trace(tmp_path / "trace.jsonl")
    assert [r.step for r in records] == list(range(5))
    assert float.fromhex(records[4].loss) == 4 / 3


def test_a_line_cut_short_by_a_kill_is_dropped(tmp_path):
    path = tmp_path / "trace.jsonl"
    write(path, 3)
    with open(path, "a") as handle:
        handle.write('{"step": 3, "loss": "0x1.')
    assert [r.step for r in read_trace(path)] == [0, 1, 2]


def test_damage_in_the_middle_is_an_error_naming_the_line(tmp_path):
    path = tmp_path / "trace.jsonl"
    write(path, 3)
    lines = path.read_text().splitlines()
    lines[1] = lines[1][:10]
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(CorruptRecord, match="line 2"):
        read_trace(path)


def _full_record(name="layer3.weight", step=12):
    return StepRecord(
        step=step,
        loss=["0x1.8p+0", "nan:000000000000f87f"],
        batch="ab" * 16,
        grads="cd" * 16,
        grad_norm="0x1.4p-3",
        lr=["0x1.0624dd2f1a9fcp-10", "0x0.0p+0"],
        params="ef" * 16,
        rng={"torch": "01" * 16, "python": "02" * 16, "numpy": "03" * 16},
        param_digests={name: "04" * 16, "bias": "05" * 16},
        grad_digests={name: "06" * 16},
        params_before="07" * 16,
        skipped=True,
        time=0.065771,
    )


def test_a_record_orjson_refuses_is_written_through_json_and_refused_on_reading(tmp_path):
    """A step index past 64 bits (no real run): the encoder falls back rather than lose the line,
    and the reader names it as out of range rather than compare it."""
    writer = TraceWriter(tmp_path / "trace.jsonl")
    writer.write(_full_record(step=2**70))
    writer.close()
    assert b'"step":1180591620717411303424' in (tmp_path / "trace.jsonl").read_bytes()
    with pytest.raises(CorruptRecord, match="line 1 .*('step'|too large)"):
        read_trace(tmp_path / "trace.jsonl")
