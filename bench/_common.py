"""Helpers shared by the bench scripts."""

import os
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_folder() -> tempfile.TemporaryDirectory:
    """A scratch folder for the runs a bench records, where twice puts runs (`runs/` of the project):
    on some machines /tmp is several times slower to create files in (here 0.2-0.7 ms per file
    against 0.05 ms), which would charge twice for the machine's /tmp. BENCH_DIR overrides."""
    base = Path(os.environ.get("BENCH_DIR") or ROOT / "runs")
    base.mkdir(parents=True, exist_ok=True)
    return tempfile.TemporaryDirectory(dir=base, prefix=".bench-")
