# A module with a large reduction whose bits depend on the number of torch threads.
import torch
torch.manual_seed(0)
class Reduce(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(1))
        self.data = torch.randn(2_000_003)
    def forward(self):
        return (self.data * self.w).sum() / self.data.numel()
model = Reduce()
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
for step in range(3):
    opt.zero_grad()
    model().backward()
    opt.step()
