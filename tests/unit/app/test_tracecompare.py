"""app/tracecompare: two runs' traces scanned stream by stream, each stream's first divergence
found, and the earliest of them first."""

from twice.app.recordings import recorded
from twice.app.tracecompare import align_streams, compare_streams
from twice.core.records import record_line
from twice.store.runs import read_manifest
from unit.app.folders import steps, write_run


def test_every_stream_is_scanned_and_the_earliest_divergence_comes_first(tmp_path):
    a = write_run(tmp_path / "a", steps([2.0, 1.5, 1.25]))
    b = write_run(tmp_path / "b", steps([2.0, 1.5, 1.3]))
    for folder, second in ((a, 2.0), (b, 3.0)):  # a worker process's own stream
        lines = [record_line(r) for r in steps([1.0, second], batch="worker")]
        (folder / "worker.jsonl").write_bytes(b"".join(lines))
    traces_a = {"main": a / "trace.jsonl", "main.proc1": a / "worker.jsonl"}
    traces_b = {"main": b / "trace.jsonl", "main.proc1": b / "worker.jsonl"}
    recording = recorded(read_manifest(a), read_manifest(b), [], None)
    found = compare_streams(a, (traces_a, traces_b), None, recording, 0, (0, 0))
    assert sorted((d.stream, d.step) for d in found.divergences) == [("main", 2), ("main.proc1", 1)]
    assert (found.first.stream, found.first.step) == ("main.proc1", 1)
    assert found.first.fields == ["loss", "params"] and found.first.identical_before == 1
    assert found.lengths == {"main": (3, 3), "main.proc1": (2, 2)} and found.one_sided == {}
    same = compare_streams(a, (traces_a, traces_a), None, recording, 0, (0, 0))
    assert same.first is None and same.compared == 5


def test_an_offset_given_lines_the_runs_up_and_a_resumed_run_is_lined_up_by_number(tmp_path):
    a = write_run(tmp_path / "a", steps([2.0, 1.5]))
    traces = {"main": a / "trace.jsonl"}
    assert align_streams(traces, traces, 3, resumed=False).offset == 3
    assert align_streams(traces, traces, None, resumed=True) is None
    assert align_streams(traces, {"rank1": a / "trace.jsonl"}, None, resumed=False) is None
