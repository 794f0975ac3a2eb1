"""The locate record kept for `twice report`: read back validated, refused when damaged."""

import json

import pytest

from twice.core.errors import CorruptRecord
from twice.store.files import write_json_atomic
from twice.store.findings import read_location


def test_a_locate_record_reads_back_as_written(tmp_path):
    record = {"sentence": "first differs at aten::mm", "step": 3, "finding": {"kind": "operation"}}
    write_json_atomic(tmp_path / "locate-b.json", record)
    assert read_location(tmp_path / "locate-b.json") == record
    write_json_atomic(tmp_path / "none.json", {"sentence": "same", "step": None, "finding": None})
    assert read_location(tmp_path / "none.json")["step"] is None


@pytest.mark.parametrize(
    "value",
    [
        [],
        {"step": 3, "finding": None},
        {"sentence": "s", "step": -1, "finding": None},
        {"sentence": "s", "step": True, "finding": None},
        {"sentence": "s", "step": 1, "finding": "mm"},
    ],
)
def test_a_record_of_another_shape_is_refused_with_a_fix(tmp_path, value):
    path = tmp_path / "locate-b.json"
    path.write_text(json.dumps(value))
    with pytest.raises(CorruptRecord, match="is not a locate record") as raised:
        read_location(path)
    assert "twice locate" in raised.value.hint
