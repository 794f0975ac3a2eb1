# One rank of a two-process FSDP2 run on gloo that saves a twice checkpoint through DCP:
#   python sharded_save.py FOLDER RANK STORE
# STORE is the file the process group meets at (no port to collide with other tests). After one
# AdamW step the model and optimizer are saved with twice.checkpoint.save(collective=True), so
# their state goes through DCP into FOLDER/dcp; rank 0 also writes FOLDER.whole.safetensors, the
# whole parameters and optimizer moments as saved, for a load to be compared with bit for bit.
import sys

import torch
import torch.distributed as dist
from safetensors.torch import save_file
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import twice.checkpoint

folder, rank, store = sys.argv[1], int(sys.argv[2]), sys.argv[3]
dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
mesh = init_device_mesh("cpu", (2,))
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
fully_shard(model, mesh=mesh)
opt = torch.optim.AdamW(model.parameters(), lr=0.01)
torch.nn.functional.mse_loss(model(torch.randn(4, 8)), torch.randn(4, 4)).backward()
opt.step()
twice.checkpoint.save(folder, collective=True, model=model, optimizer=opt)
whole = {}
for name, param in model.named_parameters():
    whole[name] = param.full_tensor()
    for moment in ("exp_avg", "exp_avg_sq"):
        whole[f"{name}.{moment}"] = opt.state[param][moment].full_tensor()
if rank == 0:
    save_file({k: v.contiguous() for k, v in whole.items()}, f"{folder}.whole.safetensors")
dist.barrier()  # neither rank tears gloo down while the other still writes (an abort at exit)
dist.destroy_process_group()
