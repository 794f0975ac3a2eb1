# Checkpoints the way many scripts do: torch.save of model and optimizer only (no RNG state),
# into twice.checkpoint_dir(), and resumes from it when it is there.
import os

import torch

import twice

path = twice.checkpoint_dir() / "ckpt.pt"
model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Dropout(0.5), torch.nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
data = torch.linspace(-1, 1, 12 * 4).reshape(12, 4)
start = 0
if path.exists():
    saved = torch.load(path)
    model.load_state_dict(saved["model"])
    opt.load_state_dict(saved["optimizer"])
    start = saved["step"]
for step in range(start, 12):
    opt.zero_grad()
    model(data[step:step + 1]).pow(2).sum().backward()
    opt.step()
    os.makedirs(path.parent, exist_ok=True)
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step + 1}, path)
