"""A loop with one operation portable mode does not cover (an FFT), for the policy tests."""

import torch

torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(2):
    x = torch.randn(8, 4)
    loss = torch.fft.rfft(model(x), dim=0).abs().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
print("done")
