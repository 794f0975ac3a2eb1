"""Portable mode's proof script: an MLP, a CNN with batch norm and a small transformer with
dropout, each trained a few steps with SGD (momentum, weight decay), Adam and AdamW, from torch's
own initialisation, seeded data and dropout. Prints one line per (model, optimizer): the losses'
bits and the final parameters' digest, so that runs under different thread counts, instruction
sets and BLAS settings can be compared byte for byte. Writes the digests to portable.json."""

import hashlib
import json
import sys

import torch
from torch import nn

STEPS = 3


def mlp():
    model = nn.Sequential(
        nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 10)
    )
    return model, lambda: (torch.randn(16, 32), torch.randint(0, 10, (16,)))


def cnn():
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(8, 8, 3, stride=2),
        nn.BatchNorm2d(8),
        nn.SiLU(),
        nn.Flatten(),
        nn.Linear(8 * 3 * 3, 10),
    )
    return model, lambda: (torch.randn(8, 3, 16, 16), torch.randint(0, 10, (8,)))


class Transformer(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(50, 32)
        layer = nn.TransformerEncoderLayer(
            32, 4, 64, dropout=0.1, batch_first=True, activation="gelu"
        )
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(32, 10)

    def forward(self, x):
        return self.head(self.enc(self.emb(x)).mean(1))


def transformer():
    return Transformer(), lambda: (torch.randint(0, 50, (8, 12)), torch.randint(0, 10, (8,)))


OPTIMIZERS = {
    "sgd": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, weight_decay=1e-4),
    "adam": lambda p: torch.optim.Adam(p, lr=1e-3),
    "adamw": lambda p: torch.optim.AdamW(p, lr=1e-3),
}


def main():
    models = sys.argv[1].split(",") if len(sys.argv) > 1 else ["mlp", "cnn", "transformer"]
    results = {}
    for name in models:
        for opt_name, make in OPTIMIZERS.items():
            torch.manual_seed(0)
            model, data = globals()[name]()
            opt = make(model.parameters())
            losses = []
            for _ in range(STEPS):
                x, y = data()
                loss = nn.functional.cross_entropy(model(x), y)
                opt.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                losses.append(loss.item().hex())
            h = hashlib.sha256()
            for value in model.state_dict().values():
                h.update(value.detach().contiguous().numpy().tobytes())
            results[f"{name}/{opt_name}"] = {"losses": losses, "params": h.hexdigest()}
            print(name, opt_name, h.hexdigest()[:16], losses[-1])
    with open("portable.json", "w") as out:
        json.dump(results, out, sort_keys=True)


if __name__ == "__main__":
    main()
