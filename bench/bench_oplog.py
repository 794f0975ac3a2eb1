"""Cost of a step recorded at op level (twice run --record-ops), against a plain step, in one process.

Target (issue 5): a recorded step costs at most 5x a plain step on a small CPU model; steps that
are not recorded cost what they cost without twice. Median CPU time over alternating rounds.
"""

import statistics
import tempfile
import time

import torch
from torch import nn

from twice import instrument

STEPS = 40


def loop(recorder=None):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    data = torch.randn(STEPS, 64, 128)
    target = torch.randint(0, 10, (STEPS, 64))
    if recorder is not None:
        instrument.install(recorder)
    try:
        start = time.process_time()
        for step in range(STEPS):
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(data[step]), target[step]).backward()
            optimizer.step()
        return time.process_time() - start
    finally:
        if recorder is not None:
            instrument.uninstall()


def main():
    torch.set_num_threads(1)
    loop()
    plain, recorded = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(5):
            plain.append(loop())
            recorded.append(loop(instrument.Recorder(f"{tmp}/{round_}", record_ops=set(range(STEPS + 1)))))
    p, r = statistics.median(plain) / STEPS, statistics.median(recorded) / STEPS
    print(f"small CPU MLP (0.1M params, batch 64, Adam, 1 thread): plain step {p * 1e3:.2f} ms, "
          f"op-recorded step {r * 1e3:.2f} ms, ratio {r / p:.1f}x (target <= 5x; includes the step trace)")


if __name__ == "__main__":
    main()
