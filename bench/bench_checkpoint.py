"""Checkpoint save/load against torch.save/torch.load, and the loader's per-sample seeding cost.

Targets (issue 4): saving a ~1 GB state (fsync and digests included) within 1.1x of torch.save plus
fsync; loading with verification within 1.2x of torch.load(weights_only=True); per-sample RNG
derivation costing at most 5% of loader throughput against a plain DataLoader on a cheap dataset.
Variants alternate in one run; best of N is reported (the page cache warms equally for both).
"""

import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from _common import size
from torch.utils.data import DataLoader, Dataset

import twice.data
from twice import checkpoint
from twice.data import samples

REPEATS = size("REPEATS", 5, 1)
# Smaller sizes for the smoke test (tests/house/test_benches.py): samples per dataset, rounds,
# and the width of the checkpointed model's five layers (4096: about 1 GB with Adam's state).
SAMPLES = size("SAMPLES", 20000, 256)
LOADER_ROUNDS = size("LOADER_ROUNDS", 25, 2)
WIDTH = size("WIDTH", 4096, 64)


def state_of_about_1gb():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        *[torch.nn.Linear(WIDTH, WIDTH) for _ in range(5)]
    )  # 5 x 16.8M params
    optimizer = torch.optim.Adam(model.parameters())
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()  # creates exp_avg and exp_avg_sq: model + 2 moments ~ 1.0 GB
    return model, optimizer


def torch_save(path, model, optimizer):
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)
    with open(path, "rb+") as handle:
        os.fsync(handle.fileno())


def timed(function):
    start = time.perf_counter()
    function()
    return time.perf_counter() - start


def bench_checkpoint(folder: Path):
    model, optimizer = state_of_about_1gb()
    size = sum(t.numel() * t.element_size() for t in model.state_dict().values()) * 3 / 1e9
    saves = {"torch.save+fsync": [], "twice save": []}
    loads = {"torch.load(weights_only)": [], "twice load+verify": []}
    for i in range(REPEATS):
        # Each save writes a new file (old outputs removed untimed), and the order alternates, so
        # that neither pays for deleting the other's gigabyte or for its dirty pages.
        for path in (folder / "t.pt", folder / "step-1"):
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(
                missing_ok=True
            )
        os.sync()
        pair = [
            ("torch.save+fsync", lambda: torch_save(folder / "t.pt", model, optimizer)),
            (
                "twice save",
                lambda: checkpoint.save(folder / "step-1", model=model, optimizer=optimizer),
            ),
        ]
        for label, function in pair if i % 2 == 0 else pair[::-1]:
            saves[label].append(timed(function))
            os.sync()
        loads["torch.load(weights_only)"].append(
            timed(lambda: torch.load(folder / "t.pt", weights_only=True))
        )
        loads["twice load+verify"].append(
            timed(lambda: checkpoint.load(folder / "step-1", strict=False))
        )
    save_ratio = statistics.median(saves["twice save"]) / statistics.median(
        saves["torch.save+fsync"]
    )
    load_ratio = min(loads["twice load+verify"]) / min(loads["torch.load(weights_only)"])
    print(
        f"checkpoint of {size:.2f} GB (model + Adam state), {REPEATS} rounds (save: median; "
        f"load: best, warm cache):"
    )
    print(
        f"  save: torch.save+fsync {statistics.median(saves['torch.save+fsync']):.2f} s, twice "
        f"{statistics.median(saves['twice save']):.2f} s, "
        f"ratio {save_ratio:.2f}x (target <= 1.1x)"
    )
    print(
        f"  load: torch.load(weights_only=True) {min(loads['torch.load(weights_only)']):.2f} s, "
        f"twice with verification "
        f"{min(loads['twice load+verify']):.2f} s, ratio {load_ratio:.2f}x (target <= 1.2x)"
    )


class Trivial(Dataset):
    """Almost no work per sample: the worst case for any per-sample cost."""

    def __len__(self):
        return SAMPLES

    def __getitem__(self, i):
        return torch.full((8,), float(i))


class CheapAugment(Dataset):
    """A cheap but real sample: random crop and flip of a 3x40x40 image held in memory."""

    def __init__(self):
        self.images = torch.rand(64, 3, 40, 40)

    def __len__(self):
        return SAMPLES

    def __getitem__(self, i):
        top, left = torch.randint(0, 9, (2,)).tolist()
        crop = self.images[i % 64, :, top : top + 32, left : left + 32]
        return crop.flip(-1) if torch.rand(()) < 0.5 else crop.clone()


def bench_loader(dataset, label):
    """twice.data.loader against a plain DataLoader over the same dataset, with its per-sample loop
    in C (twice._native, built at install) and in Python (where it was not built), alternating."""
    compiled = samples.native

    def plain():
        for _ in DataLoader(dataset, batch_size=64, shuffle=True):
            pass

    def ours(loop):
        samples.native = loop
        try:
            for _ in twice.data.loader(dataset, batch_size=64, shuffle=True, seed=0):
                pass
        finally:
            samples.native = compiled

    kinds = {"plain": plain, "C loop": lambda: ours(compiled), "Python loop": lambda: ours(None)}
    if compiled is None:
        del kinds["C loop"]
    for run in kinds.values():
        run()
    times = {kind: [] for kind in kinds}
    for round_ in range(LOADER_ROUNDS):  # alternating order: this VM's speed drifts
        order = list(kinds) if round_ % 2 == 0 else list(reversed(kinds))
        for kind in order:
            times[kind].append(timed(kinds[kind]))
    costs = ", ".join(
        f"{kind} {SAMPLES / statistics.median(times[kind]):,.0f} samples/s, cost "
        f"{100 * (statistics.median(b / a for a, b in zip(times['plain'], times[kind])) - 1):.1f}%"
        for kind in kinds
        if kind != "plain"
    )
    print(
        f"loader, {label} ({SAMPLES} samples, batch 64, main process): plain DataLoader "
        f"{SAMPLES / statistics.median(times['plain']):,.0f} samples/s; twice.data.loader: {costs} "
        f"(target <= 5%)"
        + ("" if compiled is not None else " [twice._native not built: Python loop only]")
    )


class EveryRng(CheapAugment):
    """The crop+flip sample with its choices drawn from Python's, NumPy's and torch's RNGs: all
    three seeded per sample."""

    def __getitem__(self, i):
        top, left = random.randrange(9), int(np.random.randint(0, 9))
        crop = self.images[i % 64, :, top : top + 32, left : left + 32]
        return crop.flip(-1) if torch.rand(()) < 0.5 else crop.clone()


class CifarStyle(Dataset):
    """The usual CIFAR training transform, written in torch: uint8 HWC image, pad 4 (reflect),
    random
    32x32 crop, random flip, to float CHW, normalise. A realistic cheap sample, for scale."""

    MEAN, STD = (
        torch.tensor([0.49, 0.48, 0.45]).view(3, 1, 1),
        torch.tensor([0.25, 0.24, 0.26]).view(3, 1, 1),
    )

    def __init__(self):
        self.images = torch.randint(0, 256, (64, 32, 32, 3), dtype=torch.uint8)

    def __len__(self):
        return SAMPLES

    def __getitem__(self, i):
        image = self.images[i % 64].permute(2, 0, 1).float().div_(255)
        image = torch.nn.functional.pad(image[None], (4, 4, 4, 4), mode="reflect")[0]
        top, left = torch.randint(0, 9, (2,)).tolist()
        image = image[:, top : top + 32, left : left + 32]
        if torch.rand(()) < 0.5:
            image = image.flip(-1)
        return (image - self.MEAN) / self.STD


def main():
    torch.set_num_threads(2)
    bench_loader(Trivial(), "trivial dataset (no RNG)")
    bench_loader(CheapAugment(), "cheap crop+flip dataset (torch's RNG)")
    bench_loader(EveryRng(), "cheap crop+flip drawing from all three RNGs")
    bench_loader(CifarStyle(), "CIFAR-style transform (pad, crop, flip, normalise; torch's RNG)")
    if sys.argv[1:] == ["loader"]:
        return
    folder = Path(tempfile.mkdtemp(dir=os.environ.get("BENCH_DIR")))
    try:
        bench_checkpoint(folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
