"""Sweep overhead per trial, and the speed-up of --jobs 2, measured in one run.

Targets (issue 7): at most 1.5 s per trial beyond the trial's own run time; --jobs 2 finishes a
2x4 sweep of a CPU-bound (single-threaded) script in at most 0.6x the time of --jobs 1.
"""

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import size

REPEATS = size("REPEATS", 3, 1)
SEEDS = size("SEEDS", 4, 1)  # trials: two learning rates times this
WORK = size("WORK", 20_000_000, 1000)  # the CPU-bound trial's loop

SCRIPT = """
import sys, torch
torch.set_num_threads(1)
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=float(sys.argv[1]))
x = torch.randn(64, 8)
for step in range(5):
    opt.zero_grad(); model(x).pow(2).mean().backward(); opt.step()
total = 0
for i in range(int(sys.argv[2])):  # CPU-bound, single-threaded work
    total += i * i
"""


def timed(command, cwd):
    start = time.perf_counter()
    subprocess.run(
        command,
        cwd=cwd,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    return time.perf_counter() - start


def main():
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "t.py").write_text(SCRIPT)
        plain = min(timed([sys.executable, "t.py", "0.1", "100"], tmp) for _ in range(REPEATS))
        sweep = ["-m", "twice", "sweep", "--vary", "lr=0.1,0.01", "--seeds", str(SEEDS)]
        light = timed(
            [
                sys.executable,
                *sweep,
                "--name",
                "light",
                "--",
                sys.executable,
                "t.py",
                "{lr}",
                "100",
            ],
            tmp,
        )
        overhead = light / (2 * SEEDS) - plain
        print(
            f"per-trial overhead: plain run {plain:.2f} s, "
            f"sweep of {2 * SEEDS} trials {light:.2f} s (jobs 1): "
            f"{overhead:.2f} s per trial beyond the trial's own run (target <= 1.5 s)"
        )
        work = str(WORK)
        one = timed(
            [
                sys.executable,
                *sweep,
                "--name",
                "j1",
                "--jobs",
                "1",
                "--",
                sys.executable,
                "t.py",
                "{lr}",
                work,
            ],
            tmp,
        )
        two = timed(
            [
                sys.executable,
                *sweep,
                "--name",
                "j2",
                "--jobs",
                "2",
                "--",
                sys.executable,
                "t.py",
                "{lr}",
                work,
            ],
            tmp,
        )
        print(
            f"2x{SEEDS} sweep of a CPU-bound script: --jobs 1 {one:.1f} s, "
            f"--jobs 2 {two:.1f} s, ratio {two / one:.2f} "
            f"(target <= 0.6; this machine has {os.cpu_count()} cores)"
        )


if __name__ == "__main__":
    main()
