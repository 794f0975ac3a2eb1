"""A script that checkpoints and resumes by itself, as many do (nanoGPT's `iter_num`):
`self_resume.py [--stop-after K] [--resume ckpt.pt] [--with-rng]`. It trains 10 steps with
dropout on batches drawn by a seeded permutation; after each step it saves
{model, optimizer, iter_num[, rng]} to ckpt.pt; --stop-after K ends the process after K steps."""

import argparse

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--stop-after", type=int, default=None)
parser.add_argument("--resume", default=None)
parser.add_argument("--with-rng", action="store_true")
args = parser.parse_args()

torch.manual_seed(0)
data = torch.randn(80, 6)
order = torch.randperm(80, generator=torch.Generator().manual_seed(1))
model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Dropout(0.3), torch.nn.Linear(16, 1))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
start = 0
if args.resume:
    saved = torch.load(args.resume)
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    start = saved["iter_num"]
    if "rng" in saved:
        torch.set_rng_state(saved["rng"])
for iter_num in range(start, 10):
    batch = data[order[iter_num * 8 : iter_num * 8 + 8]]
    optimizer.zero_grad()
    model(batch).pow(2).mean().backward()
    optimizer.step()
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "iter_num": iter_num + 1}
    if args.with_rng:
        state["rng"] = torch.get_rng_state()
    torch.save(state, "ckpt.pt")
    if args.stop_after is not None and iter_num + 1 >= args.stop_after:
        break
