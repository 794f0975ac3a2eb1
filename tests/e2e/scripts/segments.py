# Trains 12 steps with dropout and Adam, checkpointing every 3 steps (after the step). A file
# "plant" makes step 7 draw one extra random number; a file "kill" kills the process at step 10.
import os, signal
from pathlib import Path
import torch
from torch.utils.data import TensorDataset
import twice, twice.data

with twice.Run(keep_last=None) as run:
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.2), torch.nn.Linear(8, 1))
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    data = TensorDataset(torch.linspace(-1, 1, 48).reshape(12, 4), torch.arange(12.0).reshape(12, 1))
    loader = twice.data.loader(data, batch_size=2, shuffle=True)
    run.track(model=model, optimizer=opt, loader=loader)
    run.resume()
    while loader.epoch < 2:
        for x, y in loader:
            if run.step_index == 7 and Path("plant").exists():
                torch.rand(1)
            if run.step_index == 10 and Path("kill").exists():
                os.kill(os.getpid(), signal.SIGKILL)
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            if run.step_index % 3 == 0:
                run.checkpoint()
