# Data-parallel training with DDP on the CPU (gloo); argv[1] == "desync" makes rank 1 perturb a
# parameter at step 5 behind DDP's back.
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
data = torch.randn(12, 4 * world, 8, generator=torch.Generator().manual_seed(0))
for step in range(12):
    x = data[step, rank::world]
    opt.zero_grad()
    model(x).pow(2).mean().backward()
    if len(sys.argv) > 1 and sys.argv[1] == "desync" and rank == 1 and step == 5:
        with torch.no_grad():
            model.module[0].bias.add_(1e-3)  # during step 5, outside DDP's all-reduce
    opt.step()
dist.destroy_process_group()
