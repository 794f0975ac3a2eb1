"""Start-up cost of `twice run` over plain `python` for a script that imports torch, and manifest
capture time.

Targets (issue 2): at most 1 s of added start-up; the manifest captured in at most 0.5 s.
Runs each variant alternately, several times, and reports medians measured in this one run.
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import size

REPEATS = size("REPEATS", 5, 1)


def timed(command, cwd, env):
    start = time.perf_counter()
    subprocess.run(
        command, cwd=cwd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    return time.perf_counter() - start


def main():
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "script.py").write_text("import torch\nx = torch.ones(3).sum()\n")
        env = {k: v for k, v in os.environ.items() if not k.startswith("TWICE_")}
        plain, launched = [], []
        for _ in range(REPEATS):
            plain.append(timed([sys.executable, "script.py"], tmp, env))
            launched.append(timed([sys.executable, "-m", "twice", "run", "script.py"], tmp, env))
        capture = [
            json.loads((run / "manifest.json").read_text())["context"]["capture_seconds"]
            for run in sorted((tmp / "runs").iterdir())
        ]
    p, t = statistics.median(plain), statistics.median(launched)
    print(
        f"plain python (imports torch): {p:.3f} s   twice run: {t:.3f} s   added: {t - p:.3f} s "
        f"(ratio {t / p:.2f}x; target <= 1 s added)"
    )
    print(
        f"manifest capture: median {statistics.median(capture):.3f} s, max {max(capture):.3f} s "
        f"(target <= 0.5 s)"
    )


if __name__ == "__main__":
    main()
