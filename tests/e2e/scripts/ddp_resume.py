# DDP training (gloo, CPU) that checkpoints and resumes through twice.Run, each rank reading its
# shard through twice's resumable loader; dropout and input noise draw from each rank's own RNG,
# so a bitwise resume needs every rank's RNG state and data position back. With argument "zero" the
# optimizer is a ZeroRedundancyOptimizer (each rank holds its shard of Adam's state) under a scheduler;
# with "every3" it checkpoints every 3 steps.
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import TensorDataset

import twice
from twice.data import ResumableLoader

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Dropout(0.2),
                                                    torch.nn.Linear(16, 1)))
if "zero" in sys.argv[1:]:
    from torch.distributed.optim import ZeroRedundancyOptimizer

    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=0.01)
else:
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
schedule = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
data = TensorDataset(torch.randn(64, 8, generator=torch.Generator().manual_seed(0)))
loader = ResumableLoader(data, batch_size=4, shuffle=True, seed=0, rank=rank, world_size=world)
with twice.Run() as run:
    run.track(model=model, optimizer=opt, schedule=schedule, loader=loader)
    run.resume()
    while run.step_index < 10:
        for (x,) in loader:
            x = x + 0.01 * torch.randn_like(x)
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            opt.step()
            schedule.step()
            if "every3" in sys.argv and run.step_index % 3 == 0:
                run.checkpoint()
            if run.step_index == 10:
                break
dist.destroy_process_group()
