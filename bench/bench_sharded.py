"""Cost of the step trace under FSDP2 (torchrun, 2 processes, gloo, CPU), side by side.

Each worker times its own training loop (an MLP with `fully_shard` on each layer and the root,
AdamW); the launcher runs the same script plainly under torchrun and under `twice run` (the
trace of every step: each rank's shards of parameters and gradients digested, and the replica
check at its default interval), in rotating order, and reports the median of the paired ratios
of rank 0's time with the quartiles.

BENCH_STEPS (timed steps per run, default 300), BENCH_ROUNDS (default 5) and BENCH_WIDTH (the
hidden width, default 512) shrink it for the smoke test.
"""

import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

STEPS = int(os.environ.get("BENCH_STEPS", "300"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "5"))
WIDTH = int(os.environ.get("BENCH_WIDTH", "512"))

SCRIPT = r"""
import sys, time, torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
steps, width = int(sys.argv[1]), int(sys.argv[2])
dist.init_process_group("gloo")
mesh = init_device_mesh("cpu", (dist.get_world_size(),))
torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Linear(256, width), torch.nn.ReLU(), torch.nn.Linear(width, width), torch.nn.ReLU(),
    torch.nn.Linear(width, 10),
)
for layer in model:
    if isinstance(layer, torch.nn.Linear):
        fully_shard(layer, mesh=mesh)
fully_shard(model, mesh=mesh)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
for step in range(steps + 10):
    if step == 10:
        start = time.perf_counter()
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
if dist.get_rank() == 0:
    print(f"LOOP {(time.perf_counter() - start) / steps * 1e3:.4f}")
dist.destroy_process_group()
"""


def loop_ms(folder: Path, traced: bool) -> float:
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    command = [torchrun, "--nproc_per_node", "2", "t.py", str(STEPS), str(WIDTH)]
    if traced:
        command = [sys.executable, "-m", "twice", "run", "--", *command]
    out = subprocess.run(
        command, cwd=folder, capture_output=True, text=True, env=dict(os.environ), check=True
    ).stdout
    return float(re.search(r"LOOP ([0-9.]+)", out).group(1))


def main():
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as tmp:
        folder = Path(tmp)
        (folder / "t.py").write_text(SCRIPT)
        plain, traced = [], []
        for round_ in range(ROUNDS):
            # rotate the order each round: this VM's speed drifts, and a fixed order biases one
            for kind in (False, True) if round_ % 2 == 0 else (True, False):
                (traced if kind else plain).append(loop_ms(folder, kind))
    ratios = sorted(t / p for p, t in zip(plain, traced))
    quartiles = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
    print(
        f"FSDP2, 2 ranks (gloo, CPU), MLP 256-{WIDTH}-{WIDTH}-10, batch 64, rank 0 wall ms/step, "
        f"median of {ROUNDS} rounds: plain {statistics.median(plain):.3f}, under twice run "
        f"{statistics.median(traced):.3f}: trace {100 * (statistics.median(ratios) - 1):+.1f}% "
        f"(quartiles {100 * (quartiles[0] - 1):+.1f}% to {100 * (quartiles[2] - 1):+.1f}%)"
    )


if __name__ == "__main__":
    main()
