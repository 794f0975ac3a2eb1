# Resumable training with twice.Run: shuffle, 2 workers, random augmentation in the Dataset,
# dropout, Adam and a scheduler. Saves final weights to <run folder>/final.pt; argv[1]: workers.
import random
import sys

import torch
from torch.utils.data import Dataset

import twice
import twice.data


class Augmented(Dataset):
    def __init__(self):
        self.x = torch.linspace(-1, 1, 40 * 6).reshape(40, 6)

    def __len__(self):
        return 40

    def __getitem__(self, i):
        x = self.x[i] * (1 + random.random() * 0.1) + torch.randn(6) * 0.01
        return x, x.sum(0, keepdim=True)


with twice.Run(determinism="warn") as run:
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Dropout(0.3), torch.nn.Linear(16, 1))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.7)
    loader = twice.data.loader(Augmented(), batch_size=4, shuffle=True, num_workers=int(sys.argv[1]) if len(sys.argv) > 1 else 2)
    run.track(model=model, optimizer=opt, scheduler=sched, loader=loader)
    run.resume()
    while loader.epoch < 2:
        for x, y in loader:
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            sched.step()
    torch.save(model.state_dict(), run.dir / "final.pt")
