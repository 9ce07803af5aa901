"""Framework integration: a DDP communication hook and FSDP2 custom collectives.

``model.register_comm_hook(state, zipccl.ddp_hook)`` averages each gradient bucket with
:func:`zipccl.all_reduce` (``state``: a process group or None for the default one). The result is
the rank-order fp32 mean rounded once -- with two ranks the same bits as DDP's default hook.
DDP checks at construction that every rank has the same parameters, so buckets match and the hook
asks for no verification (a compressed bucket still exchanges its sample summary, which sizes the
transfer, and is checked in the same exchange).

FSDP2 (``torch.distributed.fsdp.fully_shard``): ``module.set_custom_all_gather(ZipAllGather())``
and ``module.set_custom_reduce_scatter(ZipReduceScatter())`` where the installed torch has them
(``FSDP2_HOOKS`` says whether it does).
"""

import torch
import torch.distributed as dist

from zipccl.collectives import (
    all_gather_into_tensor,
    all_reduce,
    all_reduce_strategy,
    reduce_scatter_tensor,
)


def ddp_hook(state: dist.ProcessGroup | None,
             bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: compressed all-reduce (AVG) of the bucket's flat gradient buffer.

    (Real annotations, no ``from __future__``: DDP checks them against dist.GradBucket.)
    """
    buffer = bucket.buffer()
    if all_reduce_strategy(buffer, dist.ReduceOp.AVG, state) == "native":
        # exactly DDP's default hook (divide, then an async SUM): with two ranks -- the only case
        # where the switch picks native for a reduction -- the same bits as the fp32 mean
        world = dist.get_world_size(state)
        work = dist.all_reduce(buffer.div_(world), group=state, async_op=True)
        return work.get_future().then(lambda fut: fut.value()[0])
    if not buffer.is_cuda:
        all_reduce(buffer, op=dist.ReduceOp.AVG, group=state, verify=False)
        fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        fut.set_result(buffer)
        return fut
    # On a side stream, so the backward pass keeps computing while the bucket travels; the
    # CUDA-aware future makes DDP's stream wait for this one when it reads the result.
    main = torch.cuda.current_stream(buffer.device)
    side = _hook_stream(buffer.device)
    side.wait_stream(main)
    with torch.cuda.stream(side):
        all_reduce(buffer, op=dist.ReduceOp.AVG, group=state, verify=False)
        buffer.record_stream(side)
        fut = torch.futures.Future(devices=[buffer.device])
        fut.set_result(buffer)
    return fut


_HOOK_STREAMS: dict[torch.device, torch.cuda.Stream] = {}


def _hook_stream(device: torch.device) -> torch.cuda.Stream:
    if device not in _HOOK_STREAMS:
        _HOOK_STREAMS[device] = torch.cuda.Stream(device)
    return _HOOK_STREAMS[device]


try:
    from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter

    FSDP2_HOOKS = True
except ImportError:  # torch without FSDP2's custom-comm interface
    AllGather = ReduceScatter = object  # type: ignore[assignment,misc]
    FSDP2_HOOKS = False


class _Alloc:
    """FSDP2 asks its comm objects for staging buffers; plain allocations suffice."""

    def allocate(self, size: "tuple[int, ...]", *, dtype: torch.dtype,
                 device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)


class ZipAllGather(_Alloc, AllGather):  # type: ignore[misc,valid-type]
    """FSDP2 all-gather of parameter shards through :func:`zipccl.all_gather_into_tensor`."""

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor,
                 group: dist.ProcessGroup, async_op: bool = False) -> object:
        return all_gather_into_tensor(output_tensor, input_tensor, group, async_op)


class ZipReduceScatter(_Alloc, ReduceScatter):  # type: ignore[misc,valid-type]
    """FSDP2 gradient reduce-scatter through :func:`zipccl.reduce_scatter_tensor`."""

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor,
                 group: dist.ProcessGroup, op: object, async_op: bool = False) -> object:
        return reduce_scatter_tensor(output_tensor, input_tensor, op, group, async_op)


__all__ = ["FSDP2_HOOKS", "ZipAllGather", "ZipReduceScatter", "ddp_hook"]
