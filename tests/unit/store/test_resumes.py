"""resumed.json: where a run resumed, written when a checkpoint is restored and read validated."""

import json

import pytest

from twice.core.errors import CorruptRecord
from twice.store.layout import RunFolder
from twice.store.resumes import Resume, read_resume, write_resume


def test_a_resume_reads_back_as_written_and_a_run_that_did_not_resume_has_none(tmp_path):
    assert read_resume(tmp_path) is None
    write_resume(tmp_path, tmp_path / "checkpoints" / "step-00000004", 5)
    resume = read_resume(tmp_path)
    assert resume == Resume(str(tmp_path / "checkpoints" / "step-00000004"), 5)
    assert resume.name == "step-00000004"


@pytest.mark.parametrize(
    "value",
    [
        {"checkpoint": "c", "step": -1},
        {"checkpoint": "c", "step": 2**63},
        {"checkpoint": "c", "step": True},
        {"checkpoint": 4, "step": 4},
        {"checkpoint": "c", "step": 4, "hidden": [0, 1, 2]},
        ["c", 4],
    ],
)
def test_a_crafted_resume_record_is_refused(tmp_path, value):
    RunFolder(tmp_path).resumed.write_text(json.dumps(value))
    with pytest.raises(CorruptRecord, match="is not a resume record"):
        read_resume(tmp_path)
