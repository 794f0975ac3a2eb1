"""A Linear model trained through torch.amp.GradScaler on the CPU; argv[1] is log2 of the initial loss scale.

The loss is 1 but its gradients are ~1e10, so at a scale of 2^100 they overflow float32 and the
first updates are skipped; at 2^60 none is."""
import sys

import torch

torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** int(sys.argv[1]), growth_interval=1000)
for step in range(10):
    out = model(torch.randn(8, 4) * 1e10).mean()
    optimizer.zero_grad()
    scaler.scale(out - out.detach() + 1.0).backward()
    scaler.step(optimizer)
    scaler.update()
