"""Overhead of zero-code step tracing on small CPU training loops, measured side by side.

For each model the same loop runs with and without the recorder installed, in short alternating
blocks in one process (100 pairs of 20-step blocks), so that both sides of a pair see the same
machine state: this VM's speed drifts by 10-30% over seconds. Each block's first step is left
untimed (in a traced block it also opens a new recorder's trace: once per run, not per step). The
median of the per-pair ratios of CPU time is reported, with the pairs' quartiles (wall time, which
the issue names, is printed beside it: the loop is single-threaded, so the two differ only by the
time the VM's host takes the core away). Beside it, the share of the traced loop's wall time spent
inside twice's handlers (what a run records as trace_cost): a steadier figure, which leaves out
what the handlers cost the user's own code (they evict its data from the CPU caches). Target
(issue 3): at most 3% at default settings. The cost is a fixed part per step (0.4-0.5 ms here,
most of it cache misses: the step has evicted twice's code and data) and reading every gradient
and parameter byte once per step (memory bandwidth), so its share shrinks as the step grows, and
with --trace-every N. The last case runs the CNN at torch's default thread count, as a user's loop
would: its steps are shorter, so the same cost is a larger share. `bench_trace.py cnn` runs the
cases whose names hold every word given.
"""

import statistics
import sys
import time

import torch
from _common import run_folder, size
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from twice.record import hooks
from twice.record.recorder import Recorder

# per block: short blocks, many of them, so that both sides of a pair see the same machine
STEPS = size("STEPS", 20, 3)
TIMED = STEPS - 1
ROUNDS = size("ROUNDS", 100, 2)


def mlp():
    return nn.Sequential(
        nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)
    ), (256,)


def cnn():
    net = nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(32, 32, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(4),
        nn.Flatten(),
        nn.Linear(512, 10),
    )
    return net, (3, 32, 32)


THREADS = torch.get_num_threads()  # torch's default here, before main() sets 1
CASES = [
    ("MLP 0.40M params, batch 64", mlp, 64, 1, 1),
    ("MLP 0.40M params, batch 256", mlp, 256, 1, 1),
    ("CNN 0.02M params, 32x32 images, batch 32", cnn, 32, 1, 1),
    ("MLP 0.40M params, batch 64, --trace-every 10", mlp, 64, 10, 1),
    (f"CNN as above, torch's default {THREADS} threads", cnn, 32, 1, THREADS),
    # No torch.optim: `p.add_(p.grad, alpha=-lr)` under no_grad, then zero_grad (issue 26).
    ("MLP 0.40M params, batch 64, updated by hand", mlp, 64, 1, 1),
    ("CNN 0.02M params, 32x32 images, batch 32, updated by hand", cnn, 32, 1, 1),
    # No DataLoader: batches sliced from a tensor, so the batch is the outermost module call's
    # data (record/inputs.py), digested on every module call's way in (issue 39).
    ("MLP 0.40M params, batch 64, sliced batches, no DataLoader", mlp, 64, 1, 1),
    ("CNN 0.02M params, 32x32 images, batch 32, sliced batches, no DataLoader", cnn, 32, 1, 1),
]


def hand_step(model):
    """The update of a loop without torch.optim, as tutorials write it."""
    with torch.no_grad():
        for param in model.parameters():
            param.add_(param.grad, alpha=-1e-3)
    model.zero_grad()


def setup(build, batch):
    torch.manual_seed(0)
    model, shape = build()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    data = TensorDataset(torch.randn(STEPS * batch, *shape), torch.randint(0, 10, (STEPS * batch,)))
    return model, optimizer, data


def _batches(data, batch, sliced):
    if not sliced:
        return DataLoader(data, batch_size=batch, shuffle=True)
    inputs, targets = data.tensors
    return ((inputs[i : i + batch], targets[i : i + batch]) for i in range(0, len(inputs), batch))


def loop(model, optimizer, data, batch, hand=False, sliced=False):
    """(CPU seconds, wall seconds, seconds in twice's handlers) of one pass over the data, its first
    step left out (TIMED steps):
    in a traced block that step also opens the trace and names the parameters for the new
    recorder, once-per-run costs that 20-step blocks would otherwise charge five times over."""
    start = wall = cost = 0.0
    recorder = hooks.active_recorder()
    for i, (x, y) in enumerate(_batches(data, batch, sliced)):
        if i == 1:
            start, wall, cost = (
                time.process_time(),
                time.perf_counter(),
                recorder.cost if recorder else 0.0,
            )
        if hand:
            nn.functional.cross_entropy(model(x), y).backward()
            hand_step(model)
            continue
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    return (
        time.process_time() - start,
        time.perf_counter() - wall,
        (recorder.cost - cost) if recorder else 0.0,
    )


def main():
    torch.set_num_threads(1)
    print(
        f"zero-code tracing overhead, CPU time, median over {ROUNDS} alternating pairs of "
        f"{STEPS}-step blocks, 1 thread "
        f"(the last case: torch's default {THREADS}, where wall time is the figure: CPU time "
        f"adds up the threads)"
    )
    print(
        "(steady state: one model trained on in every block; naming the parameters, once per "
        "optimizer, is reported apart)"
    )
    only = [
        word.lower() for word in sys.argv[1:]
    ]  # e.g. `bench_trace.py cnn`: the cases naming each word
    for label, build, batch, every, threads in CASES:
        if not all(word in label.lower() for word in only):
            continue
        torch.set_num_threads(threads)
        model, optimizer, data = setup(build, batch)
        hand, sliced = "by hand" in label, "sliced" in label
        loop(model, optimizer, data, batch, hand, sliced)  # warm-up
        plain, traced, shares = [], [], []
        with run_folder() as tmp:
            start = time.process_time()
            Recorder(f"{tmp}/names", trace_every=every).names.of(optimizer)
            naming = time.process_time() - start
            for round_ in range(ROUNDS):
                order = ("plain", "traced") if round_ % 2 == 0 else ("traced", "plain")
                for kind in order:
                    if kind == "plain":
                        plain.append(loop(model, optimizer, data, batch, hand, sliced))
                        continue
                    hooks.install(Recorder(f"{tmp}/{round_}", trace_every=every))
                    try:
                        traced.append(loop(model, optimizer, data, batch, hand, sliced))
                    finally:
                        hooks.uninstall()
                    shares.append(
                        traced[-1][2] / traced[-1][1]
                    )  # wall time inside twice's handlers
        ratio = statistics.median(t[0] / p[0] for p, t in zip(plain, traced))
        wall = statistics.median(t[1] / p[1] for p, t in zip(plain, traced))
        column = (
            0 if threads == 1 else 1
        )  # per step: CPU time on one thread, else wall time (CPU time adds up the threads)
        quartiles = statistics.quantiles(
            [t[column] / p[column] for p, t in zip(plain, traced)], n=4
        )
        p, t = (
            statistics.median(r[column] for r in plain),
            statistics.median(r[column] for r in traced),
        )
        print(
            f"  {label:<48} plain {p * 1e3 / TIMED:6.3f} ms/step  traced {t * 1e3 / TIMED:6.3f} "
            f"ms/step  "
            f"overhead {100 * (ratio - 1):5.1f}% (wall time {100 * (wall - 1):+.1f}%; pairs' "
            f"quartiles "
            f"{100 * (quartiles[0] - 1):+.1f}%, {100 * (quartiles[2] - 1):+.1f}%)  (target <= 3%)  "
            f"in twice's handlers {100 * statistics.median(shares):.1f}% of the traced wall time  "
            f"naming once {naming * 1e3:.0f} ms"
        )


if __name__ == "__main__":
    main()
