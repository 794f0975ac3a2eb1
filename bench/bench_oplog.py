"""Cost of a step recorded at op level (twice run --record-ops), against a plain step, in one process.

Target (issue 5): a recorded step costs at most 5x a plain step on a small CPU model; steps that
are not recorded cost what they cost without twice. Median CPU time over alternating rounds, on one
model trained on throughout: naming the modules and parameters (a scan of live objects, once per
process and model) is measured apart.
"""

import statistics
import tempfile
import time

import torch
from torch import nn

from twice import instrument

STEPS = 40


def build():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    data = torch.randn(STEPS, 64, 128)
    target = torch.randint(0, 10, (STEPS, 64))
    return model, optimizer, data, target


def loop(setup, recorder=None, steps=STEPS):
    model, optimizer, data, target = setup
    if recorder is not None:
        instrument.install(recorder)
    try:
        start = time.process_time()
        for step in range(steps):
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(data[step]), target[step]).backward()
            optimizer.step()
        return time.process_time() - start
    finally:
        if recorder is not None:
            instrument.uninstall()


def main():
    torch.set_num_threads(1)
    setup = build()
    loop(setup)
    plain, recorded = [], []
    with tempfile.TemporaryDirectory() as tmp:
        naming = loop(setup, instrument.Recorder(f"{tmp}/names", record_ops={0, 1}), steps=1)
        for round_ in range(7):
            plain.append(loop(setup))
            recorded.append(loop(setup, instrument.Recorder(f"{tmp}/{round_}", record_ops=set(range(STEPS + 1)))))
    p, r = statistics.median(plain) / STEPS, statistics.median(recorded) / STEPS
    print(f"small CPU MLP (0.1M params, batch 64, Adam, 1 thread): plain step {p * 1e3:.2f} ms, "
          f"op-recorded step {r * 1e3:.2f} ms, ratio {r / p:.1f}x (target <= 5x; includes the step trace); "
          f"first recorded step, naming modules and parameters once: {naming * 1e3:.0f} ms")


if __name__ == "__main__":
    main()
