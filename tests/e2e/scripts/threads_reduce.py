# A model with a large reduction, whose rounding depends on the number of torch threads.
import torch

torch.manual_seed(0)
w = torch.nn.Parameter(torch.randn(1))
data = torch.randn(2_000_003)
opt = torch.optim.SGD([w], lr=1e-3)
for step in range(3):
    opt.zero_grad()
    loss = (data * w).sum() / data.numel()
    loss.backward()
    opt.step()
