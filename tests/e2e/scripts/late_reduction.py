# From step 37 on, a large reduction whose rounding depends on the number of torch threads.
import torch

torch.manual_seed(0)
w = torch.nn.Parameter(torch.ones(1))
data = torch.randn(2_000_003)
opt = torch.optim.SGD([w], lr=1e-3)
for step in range(64):
    opt.zero_grad()
    scale = data[:1000] if step < 37 else data
    loss = (scale * w).sum() / scale.numel()
    loss.backward()
    opt.step()
