"""app/locate: where two runs first compute differently; here the answers that need no re-run
(runs that do not diverge, a batch that differs), and the records locate keeps."""

import dataclasses

from twice.app.locate import Bisection, describe_op, locate_runs
from twice.core.digests import digest
from twice.store.findings import read_location
from twice.store.layout import RunFolder
from unit.app.folders import steps, write_run


def test_runs_that_do_not_diverge_have_nothing_to_locate_and_the_answer_is_kept(tmp_path):
    a = write_run(tmp_path / "a", steps([2.0, 1.5]))
    b = write_run(tmp_path / "b", steps([2.0, 1.5]))
    found = locate_runs(a, b, yes=True)  # no re-run: nothing is started
    assert found.sentence == "runs do not diverge: nothing to locate"
    assert found.exit_code == 0 and found.step is None
    assert read_location(RunFolder(a).location(b.name))["sentence"] == found.sentence


def test_a_batch_that_differs_is_the_data_not_an_operation(tmp_path):
    records = steps([2.0, 1.5, 1.25])
    other = [dataclasses.replace(r) for r in records]
    other[1].batch = digest("another batch")
    a, b = write_run(tmp_path / "a", records), write_run(tmp_path / "b", other)
    found = locate_runs(a, b, yes=True)
    assert found.step == 1 and found.exit_code == 1
    assert found.sentence.startswith("step 1: the first difference is the input batch (data)")
    assert found.to_json()["finding"]["kind"] == "input"


def test_an_op_is_described_by_the_fields_that_name_it():
    op = {"i": 4, "op": "aten::mm", "phase": "forward", "module": "Net.fc", "line": "t.py:3"}
    assert describe_op({**op, "in": ["ab"], "out": ["cd"]}) == {
        **op,
        "node": None,
        "shapes": None,
        "dtypes": None,
    }
    assert describe_op(None) == {}
    assert Bisection(7, 3, (6, 8)).to_json() == {"step": 7, "replays": 3, "interval": [6, 8]}
