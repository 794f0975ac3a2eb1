import pytest

from twice.errors import CorruptRecord
from twice.trace import StepRecord, TraceWriter, read_trace, trace_files


def write(path, n):
    writer = TraceWriter(path)
    for step in range(n):
        writer.write(StepRecord(step=step, loss=float.hex(step / 3), batch=f"b{step}", time=float(step)))
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


def test_trace_files_names_streams(tmp_path):
    for name in ("trace.jsonl", "trace.rank1.jsonl", "trace.fork2.jsonl"):
        (tmp_path / name).write_text("")
    assert set(trace_files(tmp_path)) == {"main", "rank1", "fork2"}
