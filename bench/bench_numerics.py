"""Cost of numerics checking on a small CPU model, measured side by side in one process.

Targets (issue 6): full watch mode (every op checked) within 3x of a plain step; the cheap
always-on mode (loss, gradients, parameters once per step) within 5% of the same loop traced
without it. Median CPU time of alternating rounds.
"""

import statistics

import torch
from _common import run_folder, size, small_mlp, train_steps

from twice.record import hooks, numerics

STEPS = size("STEPS", 200, 4)
ROUNDS = size("ROUNDS", 8, 1)


def loop(mode=None, health=True, tmp=None):
    model, optimizer, data, target = small_mlp(STEPS)
    recorder = None
    if mode is not None:
        # health=False: no numerics check after each step, and no parameter norms for it
        recorder = hooks.install(hooks.Recorder(tmp, health=health))
    watch = numerics.watch(mode="warn") if mode in ("full", "watch-only") else None
    if mode == "watch-only":
        hooks.uninstall()  # the watch without the step trace
        recorder = None
    try:
        if watch:
            watch.start()
        return train_steps(model, optimizer, data, target, STEPS)
    finally:
        if watch:
            watch.stop()
        if recorder is not None:
            hooks.uninstall()


def main():
    torch.set_num_threads(1)
    loop()
    times = {"plain": [], "full": [], "watch-only": [], "trace": [], "trace+cheap": []}
    with run_folder() as tmp:
        for round_ in range(ROUNDS):
            times["plain"].append(loop())
            times["full"].append(loop("full", tmp=f"{tmp}/f{round_}"))
            times["watch-only"].append(loop("watch-only", tmp=f"{tmp}/w{round_}"))
            # ABBA order: drift within a round (allocator, caches, the other core) cancels out.
            pair = [("trace", False), ("trace+cheap", True)]
            for label, health in pair if round_ % 2 == 0 else pair[::-1]:
                times[label].append(loop("trace", health=health, tmp=f"{tmp}/{label}{round_}"))
    m = {k: statistics.median(v) / STEPS * 1e3 for k, v in times.items()}
    print(
        f"small CPU MLP (0.1M params, batch 64, Adam, 1 thread), ms/step: plain {m['plain']:.2f}, "
        f"full watch alone {m['watch-only']:.2f} ({m['watch-only'] / m['plain']:.1f}x; target <= "
        f"3x), "
        f"with the step trace (twice run --numerics) {m['full']:.2f} "
        f"({m['full'] / m['plain']:.1f}x)"
    )
    print(
        f"  cheap mode: trace {m['trace']:.3f}, trace + cheap checks {m['trace+cheap']:.3f} "
        f"({100 * (m['trace+cheap'] / m['trace'] - 1):+.1f}%; target <= 5%)"
    )


if __name__ == "__main__":
    main()
