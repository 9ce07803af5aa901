"""torch FSDP2 (``fully_shard``) on a 1-D device mesh: a few steps of a small MLP; rank 0 saves
the final (gathered) parameters to argv[1]. Run as is under torchrun, or under ``zipccl-run``.
"""

import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard


def main(out: str) -> None:
    mesh = init_device_mesh("cpu", (int(os.environ["WORLD_SIZE"]),))  # makes the default group
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64)).to(torch.bfloat16)
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    torch.manual_seed(1 + rank)
    for _ in range(3):
        x = torch.randn(8, 64, dtype=torch.bfloat16)
        model(x).float().pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    state = {k: v.full_tensor() for k, v in model.state_dict().items()}
    if rank == 0:
        torch.save(state, out)
    dist.barrier()  # leave together: gloo can abort a rank whose peer tears down mid-save
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
