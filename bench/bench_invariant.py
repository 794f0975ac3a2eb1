"""Cost of world-size-invariant training against plain DDP, 2 processes (gloo, CPU), side by side.

Issue 9 asks for the figure, not a target. Both modes train the same MLP on the same global
batch of 256 samples; each worker times its own loop after a warm-up, and the launcher alternates
the modes and reports medians of rank 0's ms/step. Invariant mode runs with 2 micro-batches (one
per rank: the least it can do at 2 processes) and with 8 (what 1/2/4/8-process invariance needs).
"""

import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import size

TIMED = size("STEPS", 120, 2)  # timed steps per run, after 20 of warm-up
ROUNDS = size("ROUNDS", 5, 1)

SCRIPT = r"""
import sys, time, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from twice.data.parallel import InvariantDataParallel
mode = sys.argv[1]
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
                          torch.nn.ReLU(), torch.nn.Linear(512, 10))
x, y = torch.randn(256, 256), torch.randint(0, 10, (256,))
loss_fn = lambda m, b: torch.nn.functional.cross_entropy(m(b[0]), b[1])
if mode == "ddp":
    model = DistributedDataParallel(net)
    share = 256 // world
    xs, ys = x[rank * share:(rank + 1) * share], y[rank * share:(rank + 1) * share]
else:
    model = InvariantDataParallel(net, micro_batches=int(mode))
opt = torch.optim.SGD(net.parameters(), lr=0.01)
for step in range(20 + __TIMED__):
    if step == 20:
        start = time.perf_counter()
    opt.zero_grad()
    if mode == "ddp":
        loss_fn(model, (xs, ys)).backward()
    else:
        model.backward((x, y), loss_fn)
    opt.step()
if rank == 0:
    print(f"LOOP {(time.perf_counter() - start) / __TIMED__ * 1e3:.4f}")
dist.barrier()  # no rank tears gloo down while another still talks to it
dist.destroy_process_group()
"""


def loop_ms(folder: Path, mode: str) -> float:
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    env = {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "WORLD_SIZE": "2",
        "OMP_NUM_THREADS": "1",
    }
    ranks = [
        subprocess.Popen(
            [sys.executable, "t.py", mode],
            cwd=folder,
            stdout=subprocess.PIPE,
            text=True,
            env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
        )
        for r in range(2)
    ]
    outputs = [rank.communicate()[0] for rank in ranks]
    return float(re.search(r"LOOP ([0-9.]+)", outputs[0]).group(1))


def main():
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "t.py").write_text(SCRIPT.replace("__TIMED__", str(TIMED)))
        times = {"ddp": [], "2": [], "8": []}
        for _ in range(ROUNDS):
            for mode in times:
                times[mode].append(loop_ms(folder, mode))
    ddp, two, eight = (statistics.median(times[k]) for k in ("ddp", "2", "8"))
    print(
        f"2 ranks (gloo, CPU), MLP 256-512-512-10, global batch 256, rank 0 wall ms/step: DDP "
        f"{ddp:.2f}; "
        f"invariant, 2 micro-batches {two:.2f} ({two / ddp:.2f}x); invariant, 8 micro-batches "
        f"{eight:.2f} ({eight / ddp:.2f}x)"
    )


if __name__ == "__main__":
    main()
