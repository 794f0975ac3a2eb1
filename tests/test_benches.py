"""Every bench script starts: each is imported in a fresh process from bench/ (where it runs),
and the inputs and compare benches run end to end at a tiny size."""

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import clean_env

BENCH = Path(__file__).resolve().parent.parent / "bench"
SCRIPTS = sorted(p.stem for p in BENCH.glob("bench_*.py"))


@pytest.mark.parametrize("name", SCRIPTS)
def test_a_bench_script_imports(name):
    result = subprocess.run(
        [sys.executable, "-c", f"import {name}"],
        cwd=BENCH,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    ("name", "size"),
    [("bench_inputs", {"BENCH_INPUT_MB": "2"}), ("bench_compare", {"BENCH_STEPS": "300"})],
)
def test_a_bench_runs_at_a_tiny_size(name, size, tmp_path):
    result = subprocess.run(
        [sys.executable, f"{name}.py"],
        cwd=BENCH,
        env=clean_env(BENCH_DIR=str(tmp_path), **size),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
