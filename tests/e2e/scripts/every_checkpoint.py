# The README's pattern: checkpoint when run.step_index % 2 == 0, after the step. Two epochs of 5
# shuffled batches, dropout, Adam. Saves <run folder>/final.pt and the step_index seen after each
# optimizer.step() to <run folder>/indexes.json. Where a file "forget-optimizer" lies in its folder it
# resumes without restoring the optimizer (strict=False), as a script that forgot to track it would.
import json
from pathlib import Path

import torch
from torch.utils.data import TensorDataset

import twice
import twice.data

with twice.Run(keep_last=None) as run:
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.2), torch.nn.Linear(8, 1))
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    data = TensorDataset(torch.linspace(-1, 1, 40).reshape(10, 4), torch.arange(10.0).reshape(10, 1))
    loader = twice.data.loader(data, batch_size=2, shuffle=True)
    forget = Path("forget-optimizer").exists()
    run.track(model=model, loader=loader, **({} if forget else {"optimizer": opt}))
    run.resume(strict=not forget)
    indexes = [run.step_index]
    while loader.epoch < 2:
        for x, y in loader:
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            indexes.append(run.step_index)
            if run.step_index % 2 == 0:
                run.checkpoint()
    torch.save(model.state_dict(), run.dir / "final.pt")
    (run.dir / "indexes.json").write_text(json.dumps(indexes))
