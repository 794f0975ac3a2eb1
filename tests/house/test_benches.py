"""Every bench script starts: all are imported in one fresh process from bench/ (where they
run), and every one runs end to end at its tiny size (BENCH_TINY=1) and must exit 0."""

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import clean_env

BENCH = Path(__file__).resolve().parents[2] / "bench"
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


# The benches that start processes of their own (torchrun ranks, sweeps, verify runs): each costs
# 20-45 s even at its tiny size on a 2-core machine.
LAUNCHING = {"bench_invariant", "bench_replicas", "bench_segments", "bench_sharded", "bench_sweep"}


@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=pytest.mark.slow) if n in LAUNCHING else n for n in SCRIPTS],
)
def test_every_bench_runs_at_its_tiny_size(name, tmp_path):
    """BENCH_TINY=1 (bench/_common.py's `size`): every bench end to end, at a size that takes
    seconds, so that a move in the package cannot break one unseen."""
    result = subprocess.run(
        [sys.executable, f"{name}.py"],
        cwd=BENCH,
        env=clean_env(BENCH_DIR=str(tmp_path), BENCH_TINY="1"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout.strip(), f"{name} printed no figure"


def test_every_bench_has_a_tiny_size():
    """Every bench reads its sizes through _common.size, so that BENCH_TINY shrinks it."""
    for name in SCRIPTS:
        text = (BENCH / f"{name}.py").read_text()
        assert "size(" in text, f"{name}.py: take its sizes from _common.size"
