# A training script with the pieces that usually break a resume together: bf16 autocast with a
# GradScaler, gradient clipping, AdamW and OneCycleLR, dropout, a Dataset drawing from all three
# global RNGs, a MixUp collate_fn drawing from torch's, and persistent workers (argv[1]: how many).
# Saves the final weights to <run folder>/final.pt. EXAMPLE_DEVICE (default cpu): where the model
# trains (bench/gpu_check.py runs it on CUDA).
import os
import random
import sys

import numpy as np
import torch
from torch.utils.data import Dataset

import twice
import twice.data


class Data(Dataset):
    def __init__(self):
        self.x = torch.linspace(-1, 1, 64 * 8).reshape(64, 8)

    def __len__(self):
        return 64

    def __getitem__(self, i):
        x = self.x[i] + torch.randn(8) * 0.05 * random.random() + float(np.random.rand()) * 0.01
        return x, x.sum(0, keepdim=True).sin()


def mixup(samples):
    xs, ys = torch.stack([s[0] for s in samples]), torch.stack([s[1] for s in samples])
    lam, perm = float(torch.distributions.Beta(0.4, 0.4).sample()), torch.randperm(len(xs))
    return lam * xs + (1 - lam) * xs[perm], lam * ys + (1 - lam) * ys[perm]


workers = int(sys.argv[1]) if len(sys.argv) > 1 else 2
with twice.Run(determinism="warn") as run:
    device = torch.device(os.environ.get("EXAMPLE_DEVICE", "cpu"))
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.GELU(), torch.nn.Dropout(0.2), torch.nn.Linear(32, 1)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-2, total_steps=40)
    scaler = torch.amp.GradScaler(device.type)
    loader = twice.data.loader(Data(), batch_size=8, shuffle=True, num_workers=workers, persistent_workers=workers > 0,
                               collate_fn=mixup)
    run.track(model=model, optimizer=opt, scheduler=sched, scaler=scaler, loader=loader)
    run.resume()
    while loader.epoch < 5:
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            with torch.autocast(device.type, dtype=torch.bfloat16):
                loss = torch.nn.functional.mse_loss(model(x).float(), y)
            opt.zero_grad()
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(opt)
            scaler.update()
            sched.step()
    torch.save(model.state_dict(), run.dir / "final.pt")
