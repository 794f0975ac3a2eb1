"""A small, unmodified training script: shuffled DataLoader with workers, random augmentation, dropout, Adam.

It seeds nothing itself. Run it twice with `twice run` and the saved weights are byte-identical;
run it twice with plain `python` and they are not.
"""

import argparse
import random

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class NoisySquares(Dataset):
    """y = sum(x^2) with a random jitter drawn from Python's `random` (an augmentation)."""

    def __init__(self, size: int = 512):
        generator = torch.Generator().manual_seed(1234)  # fixed data; the randomness is elsewhere
        self.x = torch.randn(size, 16, generator=generator)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, index):
        x = self.x[index] * (1 + 0.05 * random.random())
        return x, x.pow(2).sum(0, keepdim=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--out", default="weights.pt")
    args = parser.parse_args()

    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    loader = DataLoader(NoisySquares(), batch_size=32, shuffle=True, num_workers=args.workers)
    for epoch in range(args.epochs):
        for x, y in loader:
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
        print(f"epoch {epoch}: loss {loss.item():.6f}")
    torch.save(model.state_dict(), args.out)


if __name__ == "__main__":
    main()
