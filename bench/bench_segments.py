"""Verifying a long run by sampled segments (issue 28): a 200-step run checkpointed every 10
steps (20 segments), then a full `twice verify` against `twice verify --segments 4` with
--jobs 1 and --jobs 2, wall time measured side by side (target: --segments 4 --jobs 1 at most
25% of the full verify, --jobs 2 less). BENCH_STEP_SECONDS sets the cost of one step (default
0.5 s, one thread): each segment also pays its process's start-up, so the shorter the step, the
more that start-up weighs against the 20% of the steps the segments re-run.
"""

import subprocess
import sys
import time
from pathlib import Path

from _common import run_folder, size

STEP = size("STEP_SECONDS", 0.5, 0.01)
STEPS = size("STEPS", 200, 20)  # a checkpoint every STEPS // 20

SCRIPT = (
    """
import time, torch, twice
torch.set_num_threads(1)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Tanh(), torch.nn.Linear(256, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(64, 256)
with twice.Run(keep_last=None) as run:
    run.track(model=model, optimizer=opt)
    run.resume()
    while run.step_index < STEPS:
        until = time.perf_counter() + STEP  # the rest of a real step's work
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
        a = torch.randn(192, 192)
        while time.perf_counter() < until:
            a = torch.tanh(a @ a / 192)
        if run.step_index % EVERY == 0:
            run.checkpoint()
""".replace("STEPS", str(STEPS))
    .replace("STEP", repr(STEP))
    .replace("EVERY", str(STEPS // 20))
)


def twice(*args, cwd) -> float:
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "twice", *map(str, args)], cwd=cwd, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise SystemExit(f"twice {' '.join(map(str, args))} failed:\n{done.stdout}{done.stderr}")
    return time.perf_counter() - start


def main() -> None:
    with run_folder() as tmp:
        folder = Path(tmp)
        (folder / "long.py").write_text(SCRIPT)
        recorded = twice("run", "--name", "long", "--", sys.executable, "long.py", cwd=folder)
        run = next((folder / "runs").glob("*-long"))
        full = twice("verify", run, "-q", cwd=folder)
        one = twice("verify", run, "--segments", "4", "--seed", "1", cwd=folder)
        two = twice("verify", run, "--segments", "4", "--seed", "1", "--jobs", "2", cwd=folder)
        print(f"{STEPS} steps of {STEP:g} s, 20 checkpoints; recording took {recorded:.1f} s")
        print(f"full verify                 {full:6.1f} s")
        print(f"--segments 4 --jobs 1       {one:6.1f} s  {one / full:.0%} of the full verify")
        print(f"--segments 4 --jobs 2       {two:6.1f} s  {two / full:.0%} of the full verify")


if __name__ == "__main__":
    main()
