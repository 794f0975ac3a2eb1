# Save an FSDP2 model and its AdamW through twice.checkpoint (DCP underneath) at one world size,
# load it at another: `sharded_reshard.py save DIR` trains two steps and saves; `load DIR` builds
# the model afresh and loads with world_size_change=True. Both print the digest of the whole
# parameters and of the optimizer's whole exp_avg (each DTensor gathered), on rank 0.
import sys
import warnings

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import twice.checkpoint
from twice import digest

mode, folder = sys.argv[1], sys.argv[2]
dist.init_process_group("gloo")
mesh = init_device_mesh("cpu", (dist.get_world_size(),))
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
for layer in (model[0], model[2], model):
    fully_shard(layer, mesh=mesh)
opt = torch.optim.AdamW(model.parameters(), lr=0.01)
if mode == "save":
    for _ in range(2):
        opt.zero_grad()
        model(torch.randn(4, 8, generator=torch.Generator().manual_seed(1))).pow(2).mean().backward()
        opt.step()
    twice.checkpoint.save(folder, collective=True, model=model, optimizer=opt)
else:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        twice.checkpoint.load(folder, world_size_change=True, model=model, optimizer=opt)
    if dist.get_rank() == 0:
        print("WARNED", any("cannot match the original bit for bit" in str(w.message) for w in caught))
params = [p.full_tensor() for p in model.parameters()]
moments = [opt.state[p]["exp_avg"].full_tensor() for p in model.parameters()]
if dist.get_rank() == 0:
    print("WHOLE", digest(params), digest(moments))
dist.destroy_process_group()
