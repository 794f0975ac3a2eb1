"""The numerics files of a run folder, read validated: the report, the events, the first fault."""

import json

import pytest

from twice.core.errors import CorruptRecord
from twice.store.faults import first_fault, read_numerics
from twice.store.layout import RunFolder


def test_the_numerics_files_read_validated_and_give_the_first_fault(tmp_path):
    folder = RunFolder(tmp_path)
    assert read_numerics(tmp_path) == (None, []) and first_fault(tmp_path) is None
    event = {"kind": "non_finite", "step": 44, "summary": "loss is inf at step 44"}
    folder.numerics_events.write_text(json.dumps(event) + "\n")
    assert first_fault(tmp_path) == {"step": 44, "summary": "loss is inf at step 44"}
    folder.numerics_events.write_text(json.dumps({**event, "step": "44"}) + "\n")
    with pytest.raises(CorruptRecord, match="line 1"):
        read_numerics(tmp_path)
    folder.numerics_events.write_text("")
    folder.numerics_report.write_text(json.dumps({"fault": {"step": None}}))
    with pytest.raises(CorruptRecord, match="fault"):
        read_numerics(tmp_path)
