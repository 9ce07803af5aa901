"""Plain torch DDP: a few steps of a small MLP; rank 0 saves the final parameters to argv[1].

Run as is under torchrun, or under ``zipccl-run`` to train through zipccl.
"""

import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def main(out: str) -> None:
    dist.init_process_group()  # torch's default backend for the devices present
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(
        nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64)).to(torch.bfloat16)
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    torch.manual_seed(1 + rank)
    for _ in range(3):
        x = torch.randn(8, 64, dtype=torch.bfloat16)
        model(x).float().pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    if rank == 0:
        torch.save(model.module.state_dict(), out)
    dist.barrier()  # leave together: gloo can abort a rank whose peer tears down mid-save
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
