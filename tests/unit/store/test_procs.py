"""procs/<pid>.json: each process's record read validated; a damaged one is refused by name and
never takes the others down with it."""

import pytest

from twice.core.errors import CorruptRecord
from twice.store.files import write_json_atomic
from twice.store.layout import RunFolder
from twice.store.procs import ProcessRecord, read_process, read_processes

RECORD = {
    "started": 10.5,
    "ended": 12.0,
    "sources": ["train.py", "model.py"],
    "steps": 40,
    "distributed": {"rank": 1, "world_size": 2, "backend": "gloo"},
    "events": {"batches": 40, "optimizer_steps": 40},
    "seeding": {
        "calls": [{"api": "torch.manual_seed", "site": "t.py:3", "calls": 1, "entropy": 0}],
        "watched": ["torch.manual_seed"],
    },
    "reads": {"/data/x.bin": [10, 123, 7]},
}


def test_the_records_of_a_run_read_back_in_start_order_and_the_damaged_are_named(tmp_path):
    folder = RunFolder(tmp_path)
    folder.procs.mkdir()
    write_json_atomic(folder.proc_record(200), RECORD)
    write_json_atomic(folder.proc_record(100), {**RECORD, "started": 3.0, "sources": []})
    write_json_atomic(folder.proc_record(300), {**RECORD, "steps": -1})
    folder.proc_record(400).write_text('{"started": 1')  # killed mid-write
    records, refused = read_processes(tmp_path)
    assert [r.started for r in records] == [3.0, 10.5]
    assert records[1].sources == ["train.py", "model.py"] and records[1].torch_runtime == {}
    assert records[1].distributed["rank"] == 1 and records[1].reads == RECORD["reads"]
    assert refused == ["300.json", "400.json"]
    assert read_processes(tmp_path / "elsewhere") == ([], [])


@pytest.mark.parametrize(
    "key, value",
    [
        ("started", float("nan")),
        ("sources", "train.py"),
        ("distributed", {"rank": 0, "world_size": 0}),
        ("events", {"steps": True}),
        ("determinism", {"settings": {"cudnn": {"reason": "x"}}}),  # no in_effect
        ("seeding", {"calls": [{"api": "a", "site": "s", "calls": 1, "entropy": 2}],
                     "watched": []}),
        ("reads", {"/x": [1, 2]}),
    ],
)  # fmt: skip
def test_a_field_of_the_wrong_shape_is_refused_naming_it(key, value):
    with pytest.raises(CorruptRecord, match=f"'{key}' has the wrong shape"):
        ProcessRecord.from_json({**RECORD, key: value}, "procs/1.json")


def test_a_record_that_is_not_an_object_or_not_there_is_a_corrupt_record(tmp_path):
    with pytest.raises(CorruptRecord, match="not a JSON object"):
        ProcessRecord.from_json([RECORD], "procs/1.json")
    with pytest.raises(CorruptRecord):
        read_process(tmp_path / "procs" / "1.json")
