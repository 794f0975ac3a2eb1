"""The GPU proof script's code paths, run on the CPU with tiny sizes (the figures need the GPU
machine)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import clean_env

SCRIPT = Path(__file__).parents[2] / "bench" / "gpu_check.py"


@pytest.mark.slow
def test_gpu_check_runs_every_check_on_the_cpu(tmp_path):
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cpu", "--smoke", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=600,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert all("error" not in report[name] for name in ("determinism", "digests", "price")), report
    assert report["determinism"]["strict_runs_identical"] is True
    assert report["digests"]["correct_for_every_dtype"] is True
    assert set(report["price"]) == {"resnet_style", "transformer_style"}
    assert report["late_cublas"] == {"skipped": "needs CUDA"}
    assert report["late_trace"] == {"skipped": "needs CUDA"}
    # the examples-style scripts, twice each on the CPU here
    assert report["examples"] == {
        name: {"identical": True, "verdict": report["examples"][name]["verdict"]}
        for name in ("tiny_train", "everything")
    }, report["examples"]
    # portable mode's CPU-against-device check, here the CPU against itself: every case equal
    assert report["portable"]["bits_equal"] is True, report["portable"]
    assert sorted(report["portable"]["identical"]) == [
        "bf16/adam",
        "cnn/adam",
        "cnn/adamw",
        "cnn/sgd",
        "mlp/adam",
        "mlp/adamw",
        "mlp/sgd",
    ]
    for figures in report["portable_price"].values():
        assert figures["ratio"] > 0 and "traced_overhead_batch_8" in figures
    assert (tmp_path / "gpu_check.md").read_text().count("portable") >= 3
