# A tiny regression whose final loss depends on --lr and on the seed; logs a metric too.
import argparse

import torch

import twice

parser = argparse.ArgumentParser()
parser.add_argument("--lr", type=float, required=True)
parser.add_argument("--fail", action="store_true")
args = parser.parse_args()
with twice.stream("init"):
    model = torch.nn.Linear(4, 1)
with twice.stream("data"):
    x = torch.randn(64, 4)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.1 * torch.randn(64, 1)
opt = torch.optim.SGD(model.parameters(), lr=args.lr)
for step in range(20):
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
twice.log_metric("weight_error", float((model.weight - torch.tensor([[1.0, -2.0, 0.5, 3.0]])).abs().sum()))
if args.fail:
    raise SystemExit(3)
