"""The step trace read a step late (record/latewrite.py) and its multi-tensor Triton fold
(twice/_fold_kernel.fold_many), on the CPU under Triton's interpreter: the fold's bits against
device_fold's for generated lists of tensors, and the late trace against the synchronous one for
every kind of loop, one step behind it, and written out on SIGTERM."""

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

FOLD_MANY = """
import random, struct, sys, torch
from twice._fold_kernel import fold_many
from twice.core.device_fold import device_fold
rng = random.Random(int(sys.argv[1]))
dtypes = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
          torch.bool, torch.int64, torch.int32]
def tensor():
    dtype, size = rng.choice(dtypes), rng.choice([0, 1, 3, 7, 8, 255, 2048, 2049, 4099, 9000])
    seeded = torch.Generator().manual_seed(rng.getrandbits(31))
    base = torch.randint(-100, 100, (size + 3,), generator=seeded)
    scale = 1.37 if dtype.is_floating_point else 1
    base = (base != 0) if dtype is torch.bool else base.to(dtype) * scale
    form = rng.choice(["plain", "offset", "strided"])
    if form == "offset":  # a view that starts inside a word
        return base[rng.randint(1, 3):][:size]
    if form == "strided" and size > 1:
        return base[: size // 2 * 2].reshape(-1, 2).t()
    return base[:size]
for case in range(int(sys.argv[2])):
    tensors = [tensor() for _ in range(rng.randint(1, 9))]
    raws = [t.contiguous().reshape(-1).view(torch.uint8) for t in tensors]
    sums = fold_many(raws, [])
    for t, raw, row in zip(tensors, raws, sums):
        got = struct.pack("<q", raw.numel()) + row.numpy().astype("<i8").tobytes()
        assert got == device_fold(t), (case, t.dtype, tuple(t.shape), t.stride())
print("same bits")
"""


def _interpreted(args, **kwargs):
    return subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        env={**os.environ, "TRITON_INTERPRET": "1"},
        timeout=600,
        **kwargs,
    )


def test_one_launch_over_many_tensors_gives_each_tensors_device_fold():
    cases = "200" if os.environ.get("TWICE_EXHAUSTIVE") == "1" else "25"
    result = _interpreted(["-c", FOLD_MANY, "0", cases])
    assert result.returncode == 0 and "same bits" in result.stdout, result.stderr[-3000:]


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
