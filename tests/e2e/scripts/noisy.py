# One module adds tiny noise from a generator seeded by the clock: run-dependent, everything else seeded.
import time
import torch
torch.manual_seed(0)

class Noisy(torch.nn.Module):
    def forward(self, x):
        noise = torch.randn(x.shape, generator=torch.Generator().manual_seed(time.time_ns())) * 1e-6
        return x + noise

model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), Noisy(), torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(4):
    x = torch.randn(16, 4)
    opt.zero_grad()
    model(x).pow(2).mean().backward()
    opt.step()
