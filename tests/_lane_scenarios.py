"""The ``zipccl`` backend's calls on lanes (zipccl._lanes), several in flight at once: scenarios
for tests/test_backend_gpu_staged.py (CUDA tensors on the staged transport, where the backend
makes its lanes) and tests/test_lanes.py (host tensors, on lanes the test installs). Each runs on
every rank of a zipccl default group (tests/test_backend.py's clusters) on ``device``'s tensors.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import zipccl
from zipccl.collectives import reference_reduce

from tests import test_collectives as base

SIZES = (70_000, 1 << 20, 12_345, 3 << 20, 999, 400_000)  # more calls than lanes, uneven
BF16 = torch.bfloat16


def _on(device: str) -> torch.device:
    if device == "cuda":
        torch.cuda.set_device(0)  # the ranks share GPU 0
        return torch.device("cuda", 0)
    return torch.device(device)


def _mine(rank: int, i: int, numel: int) -> torch.Tensor:
    return base.data(100 * i + rank, numel, BF16, huge=False)


def sc_buckets_in_flight(rank: int, world: int, device: str) -> dict[str, object]:
    """DDP's pattern: every bucket's all-reduce issued before any is waited for."""
    ts = [_mine(rank, i, n).to(_on(device)) for i, n in enumerate(SIZES)]
    works = [dist.all_reduce(t, async_op=True) for t in ts]
    for w in works:
        w.wait()
    exact = all(  # auto keeps two ranks' all-reduce native: gloo's own sum, its own NaN payloads
        base.same_reduction(t.cpu(), reference_reduce([_mine(r, i, n) for r in range(world)]))
        for i, (n, t) in enumerate(zip(SIZES, ts, strict=True))
    )
    kinds = {type(w).__name__ for w in works}  # LaneWork: each call was handed to a lane
    return {"lanes": dist.group.WORLD.lanes, "works": kinds, "exact": exact}


def sc_every_op_in_flight(rank: int, world: int, device: str) -> dict[str, bool]:
    """All-gather (tensor and list), reduce-scatter, all-to-all and broadcast issued together,
    then waited for."""
    on, n = _on(device), 1 << 18
    everyone = [_mine(r, 7, n * world) for r in range(world)]
    x = everyone[rank].to(on)
    gathered = torch.empty(world * x.numel(), dtype=BF16, device=on)
    pieces = [torch.empty(n, dtype=BF16, device=on) for _ in range(world)]
    shard = torch.empty(n, dtype=BF16, device=on)
    swapped = torch.empty_like(x)
    root = x.clone()
    works = [
        dist.all_gather_into_tensor(gathered, x, async_op=True),
        dist.all_gather(pieces, x[:n], async_op=True),
        dist.reduce_scatter_tensor(shard, x, async_op=True),
        dist.all_to_all_single(swapped, x, async_op=True),
        dist.broadcast(root, src=world - 1, async_op=True),
    ]
    for w in works:
        w.wait()
    mine = [e[rank * n : (rank + 1) * n] for e in everyone]
    return {
        "all_gather": base.same_bits(gathered.cpu(), torch.cat(everyone)),
        "all_gather_list": all(
            base.same_bits(p.cpu(), e[:n]) for p, e in zip(pieces, everyone, strict=True)
        ),
        "reduce_scatter": base.same_reduction(shard.cpu(), reference_reduce(mine)),
        "all_to_all": base.same_bits(swapped.cpu(), torch.cat(mine)),
        "broadcast": base.same_bits(root.cpu(), everyone[world - 1]),
    }


def sc_gather_into_host_list(rank: int, world: int, device: str) -> bool:
    """A list all-gather of a ``device`` input into host outputs, on a lane: the lane marks only
    its own device's tensors in use, and the call copies into the others; the result is exact."""
    n = 1 << 12
    everyone = [_mine(r, 11, n) for r in range(world)]
    pieces = [torch.empty(n, dtype=BF16) for _ in range(world)]
    dist.all_gather(pieces, everyone[rank].to(_on(device)), async_op=True).wait()
    return all(base.same_bits(p, e) for p, e in zip(pieces, everyone, strict=True))


def sc_mismatch_on_a_lane(rank: int, world: int, device: str) -> tuple[str, bool]:
    """Ranks disagreeing on a call's size: wait() raises on both; every lane serves the next."""
    on = _on(device)
    bad = torch.ones(5000 + rank, dtype=BF16, device=on)
    try:
        dist.all_reduce(bad, async_op=True).wait()
        error = "no error"
    except zipccl.CollectiveMismatchError as exc:
        error = str(exc)
    for _ in range(dist.group.WORLD.lanes):  # one call on every lane, the failed one's too
        good = torch.ones(5000, dtype=BF16, device=on)
        dist.all_reduce(good)
        if not bool((good == world).all()):
            return error, False
    return error, True


MISMATCH = "disagree on the tensor numel"
