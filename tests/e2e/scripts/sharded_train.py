# Sharded training on the CPU (gloo) as torchtitan lays it out: argv[1] picks the layout:
#   fsdp   FSDP2 (fully_shard on each layer and the root) on a 1-D mesh of every rank
#   tp     tensor parallel (column-wise, then row-wise) on a 1-D mesh of every rank
#   2d     FSDP2 over "dp" and tensor parallel over "tp" on a 2x2 mesh
# The model and AdamW are tracked by twice.Run, so its checkpoints go through DCP; the data are
# sliced from a tensor by a ResumableLoader over the data-parallel ranks, and each data-parallel
# group's noise is drawn from a tracked generator (tensor-parallel ranks see the same batch).
# Options: "lr=X" the learning rate from step 2 on; "every3" a checkpoint every 3 steps;
# "selfdcp" the script saves and loads DCP itself (no twice.Run checkpoint), resuming from
# SHARDED_RESUME when that folder exists; "perturb" makes rank 1 change its shard of layer 2's
# bias during step 3, behind the training's back (under "tp" that bias is replicated); "same"
# gives every rank the same batches (FSDP2 then computes the same whole tensors at any world size).
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.utils.data import TensorDataset

import twice
from twice.data import ResumableLoader

layout = sys.argv[1]
options = sys.argv[2:]
lr_later = next((float(o[3:]) for o in options if o.startswith("lr=")), None)
dist.init_process_group("gloo")
world = dist.get_world_size()
torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Linear(8, 16),
    torch.nn.Tanh(),
    torch.nn.Linear(16, 16),
    torch.nn.Tanh(),
    torch.nn.Linear(16, 4),
)
plan = {"0": ColwiseParallel(), "2": RowwiseParallel()}
if layout == "fsdp":
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
    dp_mesh = mesh
elif layout == "tp":
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
    parallelize_module(model, mesh, plan)
    dp_mesh = None
else:
    mesh = init_device_mesh("cpu", (world // 2, 2), mesh_dim_names=("dp", "tp"))
    parallelize_module(model, mesh["tp"], plan)
    dp_mesh = mesh["dp"]
if dp_mesh is not None:
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=dp_mesh)
    fully_shard(model, mesh=dp_mesh)
dp_rank, dp_size = (0, 1) if dp_mesh is None else (dp_mesh.get_local_rank(), dp_mesh.size())
if "same" in options:  # every rank trains on the same batches: world-size-independent arithmetic
    dp_rank, dp_size = 0, 1
opt = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.01)
data = TensorDataset(
    torch.randn(48, 8, generator=torch.Generator().manual_seed(0)),
    torch.randn(48, 4, generator=torch.Generator().manual_seed(1)),
)
loader = ResumableLoader(data, batch_size=4, shuffle=True, seed=0, rank=dp_rank, world_size=dp_size)
noise = torch.Generator().manual_seed(100 + dp_rank)


def train(run=None, step=0):
    step = step if run is None else run.step_index
    while step < 6:
        for x, y in loader:
            if lr_later is not None and step >= 2:
                for group in opt.param_groups:
                    group["lr"] = lr_later
            x = x + 0.01 * torch.randn(x.shape, generator=noise)
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            if "perturb" in options and step == 3 and dist.get_rank() == 1:
                with torch.no_grad():
                    model[2].bias.to_local().add_(1e-3)
            opt.step()
            step += 1
            if run is not None and "every3" in options and run.step_index % 3 == 0:
                run.checkpoint()
            if "selfdcp" in options and step == 3:
                dcp.save(state(step), checkpoint_id=os.path.abspath("dcp-step3"))
            if step == 6:
                return


def state(step):
    """What the script saves itself: the sharded model and optimizer, its step, the loader's
    position and the noise generator."""
    model_state, optim_state = get_state_dict(model, opt)
    rank = dist.get_rank()  # DCP keeps one copy of a plain tensor: each rank's under its own key
    return {
        "model": model_state,
        "optim": optim_state,
        "step": torch.tensor(step),
        f"noise{rank}": noise.get_state(),
        f"loader{rank}": torch.tensor(list(loader.state_dict().values())),
    }


if "selfdcp" in options:
    resume = os.environ.get("SHARDED_RESUME")
    start = 0
    if resume and os.path.isdir(resume):
        saved = state(0)
        dcp.load(saved, checkpoint_id=resume)
        set_state_dict(model, opt, model_state_dict=saved["model"], optim_state_dict=saved["optim"])
        start = int(saved["step"])
        rank = dist.get_rank()
        noise.set_state(saved[f"noise{rank}"])
        loader.load_state_dict(dict(zip(loader.state_dict(), saved[f"loader{rank}"].tolist())))
    train(step=start)
else:
    with twice.Run() as run:
        run.track(model=model, optimizer=opt, loader=loader, noise=noise)
        run.resume()
        train(run)
dist.destroy_process_group()
