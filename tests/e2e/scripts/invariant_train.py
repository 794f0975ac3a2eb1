# Data-parallel training of a small net on the CPU (gloo): argv[1] "invariant" uses
# twice.parallel.InvariantDataParallel (8 micro-batches), "ddp" plain DistributedDataParallel;
# argv[2] is where rank 0 writes the final parameters (safetensors).
import sys

import torch
import torch.distributed as dist
from safetensors.torch import save_file
from torch.nn.parallel import DistributedDataParallel

from twice.parallel import InvariantDataParallel

mode, out = sys.argv[1], sys.argv[2]
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)  # the same initial model at every world size
net = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Dropout(0.1), torch.nn.Linear(64, 1))
data = torch.randn(6, 64, 16, generator=torch.Generator().manual_seed(1))
target = data.sum(-1, keepdim=True).sin()


def loss_fn(module, batch):
    x, y = batch
    return (module(x) - y).pow(2).mean()


if mode == "invariant":
    model = InvariantDataParallel(net, micro_batches=8)
    opt = torch.optim.Adam(net.parameters(), lr=0.01)
    for step in range(len(data)):
        opt.zero_grad()
        model.backward((data[step], target[step]), loss_fn)
        opt.step()
else:
    net[2].p = 0.0  # no dropout: plain DDP differs at other world sizes through reduction order alone
    model = DistributedDataParallel(net)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for step in range(len(data)):
        share = data.shape[1] // world
        opt.zero_grad()
        loss_fn(model, (data[step, rank * share:(rank + 1) * share], target[step, rank * share:(rank + 1) * share])).backward()
        opt.step()
if rank == 0:
    save_file({k: v.contiguous() for k, v in net.state_dict().items()}, out)
dist.barrier()  # no rank tears gloo down while another still talks to it
dist.destroy_process_group()
