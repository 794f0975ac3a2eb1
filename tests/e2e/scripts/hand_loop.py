"""A training loop without torch.optim, in the forms tutorials use: `hand_loop.py LR MODE
[CHANGED]`.

MODE: nograd (p -= lr * p.grad under no_grad, clipping, model.zero_grad()), data
(p.data.add_, p.grad.data.zero_()), accum (two backward calls per update), tensors (plain leaf
tensors, no nn.Module), nostep (inference only). Writes out.pt. With CHANGED, each step reads
its own batch of 8 rows and step CHANGED's batch is shifted by 1 (-1: none).
"""

import sys

import torch

torch.manual_seed(0)
lr = float(sys.argv[1])
mode = sys.argv[2]
x, y = torch.randn(64, 4), torch.randn(64, 1)
changed = int(sys.argv[3]) if len(sys.argv) > 3 else None


def batch(step):
    """The whole data, or (with CHANGED) the step's own rows."""
    if changed is None:
        return x, y
    rows = slice(8 * step, 8 * step + 8)
    return x[rows] + (1.0 if step == changed else 0.0), y[rows]


if mode == "tensors":
    w = torch.randn(4, 1, requires_grad=True)
    b = torch.zeros(1, requires_grad=True)
    for _ in range(6):
        loss = ((x @ w + b - y) ** 2).mean()
        loss.backward()
        with torch.no_grad():
            w -= lr * w.grad
            b -= lr * b.grad
            w.grad.zero_()
            b.grad.zero_()
    torch.save({"w": w, "b": b}, "out.pt")
    sys.exit(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
if mode == "nostep":
    with torch.no_grad():
        torch.save(model(x), "out.pt")
    sys.exit(0)
for step in range(6):
    xs, ys = batch(step)
    if mode == "accum":
        for k in range(2):
            (((model(xs[k::2]) - ys[k::2]) ** 2).mean() / 2).backward()
    else:
        (((model(xs) - ys) ** 2).mean()).backward()
    if mode == "data":
        for p in model.parameters():
            p.data.add_(p.grad.data, alpha=-lr)
            p.grad.data.zero_()
    else:
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        with torch.no_grad():
            for p in model.parameters():
                p -= lr * p.grad
        model.zero_grad()
torch.save(model.state_dict(), "out.pt")
