"""The ``zipccl`` backend on a GPU its ranks share: CUDA calls on the host-staged transport's
lanes, several in flight at once (zipccl._lanes), each result bit-exact, a mismatch raised by
``wait()`` on every rank. Run on a CUDA machine:
``python -m pytest -m gpu tests/test_backend_gpu_staged.py``.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import zipccl
from zipccl.collectives import reference_reduce

from tests import test_backend
from tests import test_collectives as base

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

pair = test_backend.pair  # the module-scoped cluster of 2 ranks on a zipccl default group
SIZES = (70_000, 1 << 20, 12_345, 3 << 20, 999, 400_000)  # more calls than lanes, uneven
BF16 = torch.bfloat16


def _mine(rank: int, i: int, numel: int) -> torch.Tensor:
    return base.data(100 * i + rank, numel, BF16, huge=False)


def sc_buckets_in_flight(rank: int, world: int) -> dict[str, object]:
    """DDP's pattern: every bucket's all-reduce issued before any is waited for."""
    torch.cuda.set_device(0)
    ts = [_mine(rank, i, n).cuda() for i, n in enumerate(SIZES)]
    works = [dist.all_reduce(t, async_op=True) for t in ts]
    for w in works:
        w.wait()
    exact = all(  # auto keeps two ranks' all-reduce native: gloo's own sum, its own NaN payloads
        base.same_reduction(t.cpu(), reference_reduce([_mine(r, i, n) for r in range(world)]))
        for i, (n, t) in enumerate(zip(SIZES, ts, strict=True))
    )
    return {"lanes": dist.group.WORLD.lanes, "exact": exact}


def sc_every_op_in_flight(rank: int, world: int) -> dict[str, bool]:
    """All-gather, reduce-scatter, all-to-all and broadcast issued together, then waited."""
    torch.cuda.set_device(0)
    n = 1 << 18
    everyone = [_mine(r, 7, n * world) for r in range(world)]
    x = everyone[rank].cuda()
    gathered = torch.empty(world * x.numel(), dtype=BF16, device="cuda")
    shard = torch.empty(n, dtype=BF16, device="cuda")
    swapped = torch.empty_like(x)
    root = x.clone()
    works = [
        dist.all_gather_into_tensor(gathered, x, async_op=True),
        dist.reduce_scatter_tensor(shard, x, async_op=True),
        dist.all_to_all_single(swapped, x, async_op=True),
        dist.broadcast(root, src=world - 1, async_op=True),
    ]
    for w in works:
        w.wait()
    return {
        "all_gather": base.same_bits(gathered.cpu(), torch.cat(everyone)),
        "reduce_scatter": base.same_reduction(
            shard.cpu(), reference_reduce([e[rank * n : (rank + 1) * n] for e in everyone])
        ),
        "all_to_all": base.same_bits(
            swapped.cpu(), torch.cat([e[rank * n : (rank + 1) * n] for e in everyone])
        ),
        "broadcast": base.same_bits(root.cpu(), everyone[world - 1]),
    }


@pytest.mark.parametrize("mode", ["auto", "always"])
def test_buckets_in_flight_are_exact(pair, mode):
    for found in pair.run(sc_buckets_in_flight, env={"ZIPCCL_MODE": mode}):
        assert found == {"lanes": 4, "exact": True}, found


@pytest.mark.parametrize("mode", ["auto", "always"])
def test_every_op_in_flight_is_exact(pair, mode):
    for found in pair.run(sc_every_op_in_flight, env={"ZIPCCL_MODE": mode}):
        assert all(found.values()), found  # type: ignore[union-attr]


def sc_mismatch_on_a_lane(rank: int, world: int) -> tuple[str, bool]:
    """Ranks disagreeing on a call's size: wait() raises on both; the lane serves the next."""
    torch.cuda.set_device(0)
    bad = torch.ones(5000 + rank, dtype=BF16, device="cuda")
    try:
        dist.all_reduce(bad, async_op=True).wait()
        error = "no error"
    except zipccl.CollectiveMismatchError as exc:
        error = str(exc)
    for _ in range(dist.group.WORLD.lanes):  # one call on every lane, the failed one's too
        good = torch.ones(5000, dtype=BF16, device="cuda")
        dist.all_reduce(good)
        if not bool((good == world).all()):
            return error, False
    return error, True


def test_mismatch_on_a_lane_raises_on_every_rank(pair):
    for error, recovered in pair.run(sc_mismatch_on_a_lane, env=test_backend.ALWAYS):
        assert "disagree on the tensor numel" in error, error
        assert recovered
