# For the report: `report_train.py LR`. An MLP trained 24 SGD steps under a step schedule, logging
# a validation value every 8 steps; with LR > 1 its loss blows up (inf, then NaN) after step 12.
import sys

import torch

import twice

torch.manual_seed(0)
lr = float(sys.argv[1])
model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=lr)
schedule = torch.optim.lr_scheduler.StepLR(opt, 8, 0.5)
x, y = torch.randn(64, 4), torch.randn(64, 1)
with twice.Run(config={"lr": lr, "width": 16}):
    for step in range(24):
        opt.zero_grad()
        blow = 10.0 ** max(0, step - 12) if lr > 1 else 1.0
        loss = ((model(x) - y) ** 2).mean() * blow
        loss.backward()
        opt.step()
        schedule.step()
        if step % 8 == 7:
            twice.log_metric("val_loss", float(loss) * 1.1, step=step)
