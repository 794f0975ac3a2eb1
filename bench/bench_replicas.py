"""Cost of the replica-consistency check under torchrun (2 processes, gloo, CPU), side by side.

Target (issue 9): at most 2% of step time at the default interval (every 20 steps). Each worker
times its own training loop; the launcher runs the same command with the check at its default
interval, every step, and effectively off, in rotating order, and reports the median of the paired
ratios of rank 0's time.
"""

import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import free_port, size

TIMED = size("STEPS", 580, 2)  # timed steps per run, after 20 of warm-up
ROUNDS = size("ROUNDS", 7, 1)

SCRIPT = r"""
import time, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
dist.init_process_group("gloo")
torch.manual_seed(0)
model = DistributedDataParallel(
    torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
for step in range(20 + __TIMED__):
    if step == 20:
        start = time.perf_counter()
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
if dist.get_rank() == 0:
    print(f"LOOP {(time.perf_counter() - start) / __TIMED__ * 1e3:.4f}")
dist.destroy_process_group()
"""


def loop_ms(folder: Path, every: str) -> float:
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    command = [sys.executable, "-m", "twice", "run", "--", torchrun, "--nproc_per_node", "2"]
    command += ["--master_port", str(free_port()), "t.py"]
    out = subprocess.run(
        command,
        cwd=folder,
        capture_output=True,
        text=True,
        env={**os.environ, "TWICE_REPLICA_EVERY": every},
        check=True,
    ).stdout
    return float(re.search(r"LOOP ([0-9.]+)", out).group(1))


def main():
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "t.py").write_text(SCRIPT.replace("__TIMED__", str(TIMED)))
        times = {"off": [], "20": [], "1": []}
        for round_ in range(ROUNDS):
            # Rotate the order each round: this VM's speed drifts, and a fixed order would bias one
            # mode.
            kinds = list(times)[round_ % 3 :] + list(times)[: round_ % 3]
            for every in kinds:
                times[every].append(loop_ms(folder, "1000000000" if every == "off" else every))
    off, default, each = (statistics.median(times[k]) for k in ("off", "20", "1"))
    ratio = {
        k: statistics.median(t / o for o, t in zip(times["off"], times[k])) for k in ("20", "1")
    }
    print(
        f"2 ranks (gloo, CPU), rank 0 wall ms/step, median of {ROUNDS} rounds: "
        f"checks off {off:.3f}, "
        f"every 20 steps (default) "
        f"{default:.3f} ({100 * (ratio['20'] - 1):+.1f}%; target <= 2%), every step {each:.3f} "
        f"({100 * (ratio['1'] - 1):+.1f}%)"
    )


if __name__ == "__main__":
    main()
