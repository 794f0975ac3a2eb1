"""app/audit: what `twice audit` reports and the exit code it gates CI with: an op that gave
other bits here, or (with --for cuda) one that would on a GPU."""

import pytest

from twice.app.audit import CUDA_NONDETERMINISTIC, AuditReport, audit_command
from twice.app.options import RunOptions
from twice.core.errors import UsageError
from twice.core.opdiff import OpFinding

OP = {"i": 3, "op": "aten::mm", "phase": "forward", "module": "Net", "line": "t.py:4", "step": 1}
HAZARD = {"aten::index_add": {"fix": CUDA_NONDETERMINISTIC["aten::index_add"], "sites": []}}


def test_the_exit_code_fails_on_what_differed_here_or_on_cuda_hazards_when_asked():
    clean = AuditReport([], {}, 2, ("runs/a", "runs/b"))
    assert clean.exit_code == 0
    assert AuditReport([], HAZARD, 2, ("a", "b"), target="here").exit_code == 0
    assert AuditReport([], HAZARD, 2, ("a", "b"), target="cuda").exit_code == 1
    found = AuditReport([OpFinding("operation", 3, OP, OP)], {}, 2, ("a", "b"))
    assert found.exit_code == 1
    assert found.to_json()["nondeterministic_here"] == [
        {**{k: OP.get(k) for k in ("i", "op", "phase", "module", "line")}, "node": None,
         "shapes": None, "dtypes": None, "step": 1}
    ]  # fmt: skip
    assert found.to_json()["for"] == "here" and found.to_json()["runs"] == ["a", "b"]


def test_an_unknown_target_is_refused_before_anything_runs(tmp_path):
    with pytest.raises(UsageError, match="unknown audit target 'tpu'"):
        audit_command(["python", "train.py"], RunOptions(runs_dir=tmp_path), target="tpu")
    assert list(tmp_path.iterdir()) == []
