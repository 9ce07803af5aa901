"""Framework integration: a DDP communication hook (FSDP2's custom collectives are
:mod:`zipccl._fsdp2`'s).

``model.register_comm_hook(state, zipccl.ddp_hook)`` averages each gradient bucket with
:func:`zipccl.all_reduce` (``state``: a process group or None for the default one). The result is
the rank-order fp32 mean rounded once -- with two ranks the same bits as DDP's default hook.
DDP checks at construction that every rank has the same parameters, so buckets match and the hook
asks for no verification (a compressed bucket still exchanges its sample summary, which sizes the
transfer, and is checked in the same exchange).
"""

import torch
import torch.distributed as dist

from zipccl.collectives import all_reduce, all_reduce_strategy


def ddp_hook(
    state: dist.ProcessGroup | None, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: the mean of each gradient bucket through :func:`zipccl.all_reduce`.

    Register with ``model.register_comm_hook(state, zipccl.ddp_hook)``. Where
    :func:`zipccl.all_reduce_strategy` says the bucket stays native (``ZIPCCL_MODE=never``, a dtype
    zipccl does not code, or where ``auto`` leaves it to the backend: with two ranks, whose sum
    gives the fp32 mean's bits, or under ``ZIPCCL_NATIVE_REDUCE=1``), it is exactly DDP's default
    hook: divide by the world size, then an asynchronous SUM all-reduce. Otherwise the bucket is
    all-reduced with AVG -- the rank-order fp32 mean, rounded once -- and ``verify=False``: DDP
    checks at construction that every rank has the same parameters, so buckets match (a compressed
    bucket still exchanges its sample summary, and is checked in that exchange). On CUDA the
    all-reduce runs on a side stream, so the backward pass keeps computing, and the returned future
    is CUDA-aware: DDP's stream waits for it when it reads the result. On CPU the call completes
    before the hook returns.

    Settings: those of :func:`zipccl.all_reduce` (``ZIPCCL_MODE``, ``ZIPCCL_CHUNK_BYTES``,
    ``ZIPCCL_NATIVE_REDUCE``, ``ZIPCCL_PLAN_CALLS``, the codec's); ``ZIPCCL_VERIFY`` does not
    apply.

    (Real annotations, no ``from __future__``: DDP checks them against dist.GradBucket.)

    Args:
        state (ProcessGroup or None): the group to average over; None: the default group.
        bucket (dist.GradBucket): the bucket DDP passes; its flat buffer is averaged in place.

    Returns:
        torch.futures.Future[Tensor]: completes with the averaged buffer.

    Raises:
        CollectiveMismatchError, PeerError, ValueError: as :func:`zipccl.all_reduce`.

    Example::

        >>> from torch.nn.parallel import DistributedDataParallel as DDP
        >>> local_rank = int(os.environ["LOCAL_RANK"])  # under torchrun
        >>> model = DDP(torch.nn.Linear(1024, 1024).cuda(local_rank), device_ids=[local_rank])
        >>> model.register_comm_hook(None, zipccl.ddp_hook)
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


__all__ = ["ddp_hook"]
