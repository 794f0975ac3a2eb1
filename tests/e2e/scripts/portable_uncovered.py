"""A loop with one operation portable mode does not cover (eigenvalues), for the policy tests."""

import torch

torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(2):
    x = torch.randn(8, 4)
    values = torch.linalg.eigvals(model(x).detach().reshape(2, 2, 2))
    loss = model(x).pow(2).mean() + values.real.sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
print("done")
