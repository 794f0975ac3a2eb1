# A classifier trained with a large learning rate and per-layer gradient L2 normalisation written
# in the script: the logits grow until the softmax saturates, the gradients vanish, and the
# normalisation g / ||g|| computes 0 / 0. argv[1] == "anomaly" runs it under detect_anomaly instead.
import sys

import torch

torch.manual_seed(0)
x = torch.randn(64, 8)
y = (x[:, 0] > 0).long()  # linearly separable
model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
opt = torch.optim.SGD(model.parameters(), lr=5.0)
torch.autograd.set_detect_anomaly(len(sys.argv) > 1 and sys.argv[1] == "anomaly")
for step in range(300):
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    for p in model.parameters():
        p.grad /= p.grad.norm()
    opt.step()
    if not torch.isfinite(loss):
        print(f"loss became {loss.item()} at step {step}")
        break
