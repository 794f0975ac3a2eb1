"""Helpers shared by the bench scripts."""

import os
import socket
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# BENCH_TINY=1: every bench runs at a tiny size (the smoke test, tests/house/test_benches.py), so
# that a move in the package cannot break one unseen. Its figures then mean nothing.
TINY = os.environ.get("BENCH_TINY") == "1"


def size(name: str, full, tiny):
    """A bench's size `name`: BENCH_<NAME> where set, else `tiny` under BENCH_TINY=1, else
    `full` (the size its figures in docs/performance.md come from)."""
    raw = os.environ.get(f"BENCH_{name}")
    if raw is not None:
        return type(full)(raw)
    return tiny if TINY else full


def free_port() -> int:
    """A TCP port free on this machine now, for a launcher's rendezvous: two benches run side by
    side (the smoke test runs them in parallel) would otherwise both take torchrun's 29500."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run_folder() -> tempfile.TemporaryDirectory:
    """A scratch folder for the runs a bench records, where twice puts runs (`runs/` of the
    project):
    on some machines /tmp is several times slower to create files in (here 0.2-0.7 ms per file
    against 0.05 ms), which would charge twice for the machine's /tmp. BENCH_DIR overrides."""
    base = Path(os.environ.get("BENCH_DIR") or ROOT / "runs")
    base.mkdir(parents=True, exist_ok=True)
    return tempfile.TemporaryDirectory(dir=base, prefix=".bench-")


def small_mlp(steps: int):
    """The small CPU model of the op-log and numerics benches: an MLP, Adam, `steps` batches of
    64."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    return model, optimizer, torch.randn(steps, 64, 128), torch.randint(0, 10, (steps, 64))


def train_steps(model, optimizer, data, target, steps: int) -> float:
    """CPU seconds for `steps` training steps of a cross-entropy classifier."""
    from torch import nn

    start = time.process_time()
    for step in range(steps):
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(data[step]), target[step]).backward()
        optimizer.step()
    return time.process_time() - start
