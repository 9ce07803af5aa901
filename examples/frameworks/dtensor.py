"""DTensor tensor parallelism (``parallelize_module``: column- then row-wise) of a small MLP on
a 1-D mesh: a few steps; rank 0 saves the final (gathered) parameters to argv[1]. Run as is
under torchrun, or under ``zipccl-run``.
"""

import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    parallelize_module,
)


def main(out: str) -> None:
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (int(os.environ["WORLD_SIZE"]),))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64)).to(torch.bfloat16)
    parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    torch.manual_seed(1)  # tensor parallel: every rank feeds the same batch
    for _ in range(3):
        x = torch.randn(8, 64, dtype=torch.bfloat16)
        model(x).float().pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    state = {k: v.full_tensor() for k, v in model.state_dict().items()}
    if dist.get_rank() == 0:
        torch.save(state, out)
    dist.barrier()  # leave together: gloo can abort a rank whose peer tears down mid-save
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
