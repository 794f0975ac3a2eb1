"""Every bench script starts: all are imported in one fresh process from bench/ (where they
run), and the inputs, numerics and checkpoint benches run end to end at a tiny size (the
compare and sharded benches too, marked slow: they start real processes)."""

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import clean_env

BENCH = Path(__file__).resolve().parent.parent / "bench"
SCRIPTS = sorted(p.stem for p in BENCH.glob("bench_*.py"))

_IMPORT_EACH = """
import importlib, sys, traceback
failed = []
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except Exception:
        failed.append(name + ": " + traceback.format_exc(limit=3))
print("\\n".join(failed))
sys.exit(1 if failed else 0)
"""


def test_every_bench_script_imports():
    assert len(SCRIPTS) >= 14
    result = subprocess.run(
        [sys.executable, "-c", _IMPORT_EACH, *SCRIPTS],
        cwd=BENCH,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("name", "size"),
    [
        ("bench_inputs", {"BENCH_INPUT_MB": "2"}),
        ("bench_numerics", {"BENCH_STEPS": "4", "BENCH_ROUNDS": "1"}),
        (
            "bench_checkpoint",
            {
                "BENCH_SAMPLES": "256",
                "BENCH_LOADER_ROUNDS": "2",
                "BENCH_WIDTH": "64",
                "BENCH_REPEATS": "1",
            },
        ),
        pytest.param("bench_compare", {"BENCH_STEPS": "300"}, marks=pytest.mark.slow),
        pytest.param(
            "bench_sharded",
            {"BENCH_STEPS": "3", "BENCH_ROUNDS": "1", "BENCH_WIDTH": "16"},
            marks=pytest.mark.slow,
        ),
    ],
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
