"""Reads files of the kinds named in argv[2] (all of them by default) from a data folder outside
the working folder (argv[1]), each one shaping the training, so that a change to any of them
changes the run: `main` a raw file read in the main process, `fork` and `spawn` files read in
DataLoader workers started that way, `memmap` a np.memmap, `json` a JSON config, `weights` a
state dict loaded with torch.load, and `exec` a config .py read with exec (nanoGPT's form)."""

import json
import sys

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

KINDS = ("main", "fork", "spawn", "memmap", "json", "weights", "exec")


class FileRows(Dataset):
    """Rows of four float32s, read from the file by whichever process asks for one."""

    def __init__(self, path):
        self.path = path

    def __len__(self):
        return 4

    def __getitem__(self, index):
        with open(self.path, "rb") as handle:
            values = np.frombuffer(handle.read(), dtype=np.float32)
        return torch.from_numpy(values[index * 4 : index * 4 + 4].copy())


def main():
    data = sys.argv[1]
    kinds = sys.argv[2].split(",") if len(sys.argv) > 2 else KINDS
    config = {"lr": 0.1}
    if "exec" in kinds:
        exec(open("config/train.py").read(), config)  # noqa: S102 - nanoGPT's configurator
    scale = 1.0
    if "json" in kinds:
        with open(f"{data}/config.json") as handle:
            scale = json.load(handle)["scale"]
    model = torch.nn.Linear(4, 1)
    if "weights" in kinds:
        model.load_state_dict(torch.load(f"{data}/init.pt"))
    rows = torch.ones(4, 4)
    if "main" in kinds:
        with open(f"{data}/main.bin", "rb") as handle:
            rows += torch.from_numpy(np.frombuffer(handle.read(), dtype=np.float32).copy()).view(
                4, 4
            )
    if "memmap" in kinds:
        mapped = np.memmap(f"{data}/mapped.bin", dtype=np.float32, mode="r")
        rows += torch.from_numpy(np.array(mapped)).view(4, 4)
    loaders = [
        DataLoader(FileRows(f"{data}/{kind}.bin"), batch_size=2, num_workers=1,
                   multiprocessing_context=kind)
        for kind in ("fork", "spawn") if kind in kinds
    ]  # fmt: skip
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"])
    for step, *batches in zip(range(2), *loaders):
        batch = (rows[2 * step : 2 * step + 2] + sum(batches, torch.zeros(2, 4))) * scale
        loss = model(batch).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main()
