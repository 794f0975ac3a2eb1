"""Cost of the step trace under FSDP2 (torchrun, 2 processes, gloo, CPU), side by side.

Each worker times its own training loop (an MLP with `fully_shard` on each layer and the root,
AdamW); the launcher runs the same script three ways, in rotating order: plainly under torchrun,
under `twice run` with the step hooks taken off at the script's start (seeding and deterministic
mode only), and under `twice run` traced (each rank's shards of parameters and gradients
digested every step, the replica check at its default interval). It reports the medians of the
paired ratios of rank 0's time, with quartiles: the trace's own cost (traced against untraced,
both under twice run) and the whole of twice against plain torchrun.

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

from _common import free_port, size

STEPS = size("STEPS", 300, 3)
ROUNDS = size("ROUNDS", 5, 1)
WIDTH = size("WIDTH", 512, 16)

SCRIPT = r"""
import sys, time, torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
steps, width = int(sys.argv[1]), int(sys.argv[2])
if sys.argv[3:] == ["untraced"]:  # under twice run: seeded and deterministic, no step hooks
    from twice.record import hooks

    hooks.uninstall()
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


def loop_ms(folder: Path, kind: str) -> float:
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    command = [torchrun, "--nproc_per_node", "2", "--master_port", str(free_port()), "t.py"]
    command += [str(STEPS), str(WIDTH)]
    if kind != "plain":
        command = [sys.executable, "-m", "twice", "run", "--", *command]
    if kind == "untraced":
        command.append("untraced")
    out = subprocess.run(
        command, cwd=folder, capture_output=True, text=True, env=dict(os.environ), check=True
    ).stdout
    return float(re.search(r"LOOP ([0-9.]+)", out).group(1))


def _ratios(num: list[float], den: list[float]) -> str:
    ratios = sorted(n / d for n, d in zip(num, den))
    q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
    return (
        f"{100 * (statistics.median(ratios) - 1):+.1f}% "
        f"(quartiles {100 * (q[0] - 1):+.1f}% to {100 * (q[2] - 1):+.1f}%)"
    )


def main():
    kinds = ("plain", "untraced", "traced")
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as tmp:
        folder = Path(tmp)
        (folder / "t.py").write_text(SCRIPT)
        times: dict[str, list[float]] = {kind: [] for kind in kinds}
        for round_ in range(ROUNDS):
            # rotate the order each round: this VM's speed drifts, and a fixed order biases one
            for kind in kinds[round_ % 3 :] + kinds[: round_ % 3]:
                times[kind].append(loop_ms(folder, kind))
    medians = {kind: statistics.median(t) for kind, t in times.items()}
    print(
        f"FSDP2, 2 ranks (gloo, CPU), MLP 256-{WIDTH}-{WIDTH}-10, batch 64, rank 0 wall ms/step, "
        f"median of {ROUNDS} rounds: plain {medians['plain']:.3f}, twice run untraced "
        f"{medians['untraced']:.3f}, traced {medians['traced']:.3f}"
    )
    print(f"  the trace (traced against untraced): {_ratios(times['traced'], times['untraced'])}")
    print(f"  twice in all (traced against plain): {_ratios(times['traced'], times['plain'])}")


if __name__ == "__main__":
    main()
