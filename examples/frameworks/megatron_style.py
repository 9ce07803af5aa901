"""Megatron-style tensor + data parallelism, written the way Megatron-LM's ``parallel_state`` and
``tensor_parallel`` write it (Megatron-LM itself needs CUDA and apex): the default group made
with ``--distributed-backend`` (``nccl`` with a GPU, else ``gloo``), tensor- and data-parallel
groups made with ``new_group`` from rank lists, a column-parallel + row-parallel MLP whose
tensor-parallel all-reduces run in forward and backward, and the data-parallel gradient
all-reduce. A few steps; rank 0 saves the final (gathered) parameters and the losses to argv[1].

Run as is under torchrun, or under ``zipccl-run``::

    torchrun --nproc-per-node 4 megatron_style.py out.pt --tensor-model-parallel-size 2
"""

import argparse
import os
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

HIDDEN, FFN, BATCH, STEPS = 64, 256, 8, 3
_TP_GROUP: dist.ProcessGroup | None = None
_DP_GROUP: dist.ProcessGroup | None = None


def initialize_model_parallel(tensor_model_parallel_size: int) -> None:
    """parallel_state.initialize_model_parallel: consecutive ranks form a tensor-parallel group,
    ranks ``tp`` apart a data-parallel one; every rank creates every group, in the same order."""
    global _TP_GROUP, _DP_GROUP
    world, rank, tp = dist.get_world_size(), dist.get_rank(), tensor_model_parallel_size
    if world % tp:
        raise ValueError(f"world size {world} is not a multiple of tensor parallel size {tp}")
    for start in range(0, world, tp):
        ranks = list(range(start, start + tp))
        group = dist.new_group(ranks)
        if rank in ranks:
            _TP_GROUP = group
    for offset in range(tp):
        ranks = list(range(offset, world, tp))
        group = dist.new_group(ranks)
        if rank in ranks:
            _DP_GROUP = group


def tp_group() -> dist.ProcessGroup:
    assert _TP_GROUP is not None, "initialize_model_parallel first"
    return _TP_GROUP


def dp_group() -> dist.ProcessGroup:
    assert _DP_GROUP is not None, "initialize_model_parallel first"
    return _DP_GROUP


class _CopyToTensorParallelRegion(torch.autograd.Function):
    """mappings.copy_to_tensor_model_parallel_region: identity forward, all-reduce backward."""

    @staticmethod
    def forward(ctx: object, x: torch.Tensor) -> torch.Tensor:
        return x

    @staticmethod
    def backward(ctx: object, grad: torch.Tensor) -> torch.Tensor:
        grad = grad.contiguous()
        dist.all_reduce(grad, group=tp_group())
        return grad


class _ReduceFromTensorParallelRegion(torch.autograd.Function):
    """mappings.reduce_from_tensor_model_parallel_region: all-reduce forward, identity backward."""

    @staticmethod
    def forward(ctx: object, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        dist.all_reduce(x, group=tp_group())
        return x

    @staticmethod
    def backward(ctx: object, grad: torch.Tensor) -> torch.Tensor:
        return grad


def _shard(master: torch.Tensor, dim: int) -> nn.Parameter:
    """_initialize_affine_weight_cpu: every rank makes the same master weight, keeps its part."""
    tp, rank = dist.get_world_size(tp_group()), dist.get_rank(tp_group())
    return nn.Parameter(master.chunk(tp, dim)[rank].clone())


class ColumnParallelLinear(nn.Module):
    """Y = X A with A split by columns; the output stays split (``gather_output=False``)."""

    def __init__(self, master: nn.Linear) -> None:
        super().__init__()
        self.weight = _shard(master.weight.detach(), 0)
        self.bias = _shard(master.bias.detach(), 0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(_CopyToTensorParallelRegion.apply(x), self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """Y = X A with A split by rows, X already split (``input_is_parallel=True``); the partial
    products are all-reduced, then the (unsplit) bias added."""

    def __init__(self, master: nn.Linear) -> None:
        super().__init__()
        self.weight = _shard(master.weight.detach(), 1)
        self.bias = nn.Parameter(master.bias.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        partial = nn.functional.linear(x, self.weight)
        return _ReduceFromTensorParallelRegion.apply(partial) + self.bias


class ParallelMLP(nn.Module):
    def __init__(self, device: torch.device) -> None:
        super().__init__()
        torch.manual_seed(0)  # the same master weights on every rank
        self.fc1 = ColumnParallelLinear(nn.Linear(HIDDEN, FFN).to(device, torch.bfloat16))
        self.fc2 = RowParallelLinear(nn.Linear(FFN, HIDDEN).to(device, torch.bfloat16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(nn.functional.gelu(self.fc1(x)))


def allreduce_gradients(model: nn.Module) -> None:
    """Megatron's DDP: gradients scaled by 1/dp, then summed over the data-parallel group."""
    dp = dist.get_world_size(dp_group())
    for param in model.parameters():
        assert param.grad is not None
        param.grad.div_(dp)
        dist.all_reduce(param.grad, group=dp_group())


def gathered(model: nn.Module) -> dict[str, torch.Tensor]:
    """The full parameters: tensor-parallel shards gathered along the dimension they split."""
    split = {"fc1.weight": 0, "fc1.bias": 0, "fc2.weight": 1}
    state = {}
    for name, param in model.named_parameters():
        if name not in split:
            state[name] = param.detach().cpu()
            continue
        parts = [torch.empty_like(param) for _ in range(dist.get_world_size(tp_group()))]
        dist.all_gather(parts, param.detach().contiguous(), group=tp_group())
        state[name] = torch.cat(parts, split[name]).cpu()
    return state


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument(
        "--distributed-backend",
        choices=["nccl", "gloo"],
        default="nccl" if torch.cuda.is_available() else "gloo",
    )
    parser.add_argument("--tensor-model-parallel-size", type=int, default=2)
    args = parser.parse_args()
    if args.distributed_backend == "nccl":
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group(  # as megatron.training.initialize._initialize_distributed
        backend=args.distributed_backend,
        world_size=int(os.environ["WORLD_SIZE"]),
        rank=int(os.environ["RANK"]),
        timeout=timedelta(minutes=10),
    )
    tp = min(args.tensor_model_parallel_size, dist.get_world_size())
    initialize_model_parallel(tp)
    model = ParallelMLP(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    dp_rank = dist.get_rank(dp_group())
    generator = torch.Generator().manual_seed(1 + dp_rank)  # one batch per data-parallel rank
    losses = []
    for _ in range(STEPS):
        x = torch.randn(BATCH, HIDDEN, generator=generator).to(device, torch.bfloat16)
        loss = model(x).float().pow(2).mean()
        loss.backward()
        allreduce_gradients(model)
        optimizer.step()
        optimizer.zero_grad()
        reported = loss.detach().clone()  # the logged loss: averaged over data parallel
        dist.all_reduce(reported, group=dp_group())
        losses.append(reported / dist.get_world_size(dp_group()))
    state = gathered(model)
    if dist.get_rank() == 0:
        torch.save({**state, "losses": torch.stack(losses).cpu()}, args.out)
    dist.barrier()  # leave together: gloo can abort a rank whose peer tears down mid-save
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
