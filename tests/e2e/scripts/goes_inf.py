# Six SGD steps of a linear model whose loss is multiplied by inf at step 4 and by NaN at step 5:
# inf at step 4, NaN at step 5. No --numerics needed to see it.
import torch

torch.manual_seed(0)
model = torch.nn.Linear(3, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(6):
    opt.zero_grad()
    loss = model(torch.ones(2, 3)).pow(2).mean() * {4: float("inf"), 5: float("nan")}.get(step, 1.0)
    loss.backward()
    opt.step()
