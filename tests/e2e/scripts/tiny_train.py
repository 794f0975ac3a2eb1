# A tiny training script that seeds nothing and saves its weights (argv: OUT [--lr LR]).
# EXAMPLE_DEVICE (default cpu): where the model trains (bench/gpu_check.py runs it on CUDA).
import argparse
import os
import random

import torch
from torch.utils.data import DataLoader, Dataset


class Jittered(Dataset):
    def __init__(self):
        self.x = torch.arange(64 * 4, dtype=torch.float32).reshape(64, 4) / 100

    def __len__(self):
        return 64

    def __getitem__(self, i):
        return self.x[i] * (1 + random.random() * 0.1), self.x[i].sum(0, keepdim=True)


parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("--lr", type=float, default=0.05)
parser.add_argument("--workers", type=int, default=0)
args = parser.parse_args()
device = torch.device(os.environ.get("EXAMPLE_DEVICE", "cpu"))
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Dropout(0.2), torch.nn.Linear(8, 1)).to(device)
opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
for x, y in DataLoader(Jittered(), batch_size=8, shuffle=True, num_workers=args.workers):
    x, y = x.to(device), y.to(device)
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
torch.save(model.state_dict(), args.out)
