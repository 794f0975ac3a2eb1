"""The step trace read a step late (record/latewrite.py), on the CPU under Triton's interpreter:
the late trace against the synchronous one for every kind of loop, one step behind it, and
written out on SIGTERM (the multi-tensor fold's bits: tests/unit/test__fold_kernel.py)."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).parent / "scripts"
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None,
    reason="needs Triton (the test extra installs it on Linux x86-64)",
)


def _interpreted(args, **kwargs):
    return subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        env={**os.environ, "TRITON_INTERPRET": "1"},
        timeout=600,
        **kwargs,
    )


def _records(path: Path) -> list[dict]:
    records = [json.loads(line) for line in path.read_text().splitlines()]
    for record in records:
        record.pop("time")  # the only field twice does not compare
    return records


@pytest.mark.parametrize("kind", ["sgd", "gan", "hand", "explicit"])
def test_the_late_trace_is_the_synchronous_one_a_step_behind(kind, tmp_path):
    result = _interpreted([str(SCRIPTS / "late_trace.py"), str(tmp_path), kind])
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(result.stdout.splitlines()[-1])
    now, late = (
        _records(tmp_path / "now" / "trace.jsonl"),
        _records(tmp_path / "late" / "trace.jsonl"),
    )
    assert len(now) == 5 and late == now  # every field, every step, the same bits
    assert seen["late"][-1] == seen["now"][-1] == 5  # all written once the process ends
    lags = [a - b for a, b in zip(seen["now"], seen["late"])]
    assert set(lags) <= {0, 1} and 1 in lags  # one step behind at most, and really behind


def test_sigterm_writes_the_step_still_held(tmp_path):
    result = _interpreted([str(SCRIPTS / "late_trace.py"), str(tmp_path), "sgd", "kill"])
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.splitlines()[-1])["killed"]
    late = _records(tmp_path / "late" / "trace.jsonl")
    now = _records(tmp_path / "now" / "trace.jsonl")
    assert late == now[:4]  # the four steps done when the signal came, the held one included
