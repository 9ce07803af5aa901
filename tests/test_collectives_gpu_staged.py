"""The staged transport on a GPU: CUDA tensors on a gloo group, the ranks sharing GPU 0.

Each op's result on CUDA tensors (compressed, chunked, through pinned host memory) must equal
torch.distributed's on the same values as host tensors, bit for bit (reductions: the fp32
rank-order reference); a mismatch raises on every rank. Run on a CUDA machine:
``python -m pytest -m gpu tests/test_collectives_gpu_staged.py``.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import zipccl

from tests import test_collectives as base
from tests import test_collectives_inline as inline
from tests import test_collectives_staged as staged

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

CHUNKED = {"ZIPCCL_MODE": "always", "ZIPCCL_CHUNK_BYTES": "65536"}


pair, trio = base.pair, base.trio  # the module-scoped clusters of 2 and 3 gloo ranks


def sc_every_op(rank: int, world: int, dtype: torch.dtype, numel: int) -> dict[str, bool]:
    """Every op on CUDA tensors against the same op on host tensors (plain gloo)."""
    torch.cuda.set_device(0)
    cuda = torch.device("cuda", 0)
    x = base.data(900 + rank, numel * world, dtype)
    ok: dict[str, bool] = {}

    got = torch.empty(world * x.numel(), dtype=dtype, device=cuda)
    zipccl.all_gather_into_tensor(got, x.to(cuda))
    want = torch.empty(world * x.numel(), dtype=dtype)
    dist.all_gather_into_tensor(base.wire(want), base.wire(x))
    ok["all_gather"] = base.same_bits(got.cpu(), want)

    got = torch.empty_like(x, device=cuda)
    zipccl.all_to_all_single(got, x.to(cuda))
    want = torch.empty_like(x)
    dist.all_to_all_single(base.wire(want), base.wire(x))
    ok["all_to_all"] = base.same_bits(got.cpu(), want)

    rows = [(rank + j) % 3 + 1 for j in range(world)]
    into = [(i + rank) % 3 + 1 for i in range(world)]
    xs = x[: sum(rows) * 7].view(sum(rows), 7)
    got = torch.empty(sum(into), 7, dtype=dtype, device=cuda)
    zipccl.all_to_all_single(got, xs.to(cuda), into, rows)
    want = torch.empty(sum(into), 7, dtype=dtype)
    dist.all_to_all_single(base.wire(want), base.wire(xs), into, rows)
    ok["all_to_all_uneven"] = base.same_bits(got.cpu(), want)

    t = x.to(cuda)
    zipccl.broadcast(t, src=world - 1)
    want = x.clone()
    dist.broadcast(base.wire(want), world - 1)
    ok["broadcast"] = base.same_bits(t.cpu(), want)

    inputs = [base.data(900 + r, numel * world, dtype) for r in range(world)]
    shard = torch.empty(numel, dtype=dtype, device=cuda)
    zipccl.reduce_scatter_tensor(shard, x.to(cuda))
    parts = [i.view(world, numel)[rank] for i in inputs]
    ok["reduce_scatter"] = base.same_reduction(shard.cpu(), zipccl.reference_reduce(parts))

    t = x[: numel * world - 1].to(cuda)
    zipccl.all_reduce(t, op=dist.ReduceOp.AVG)
    ref = zipccl.reference_reduce([i[: numel * world - 1] for i in inputs], dist.ReduceOp.AVG)
    ok["all_reduce"] = base.same_reduction(t.cpu(), ref)
    return ok


@pytest.mark.parametrize("dtype", base.DTYPES, ids=str)
@pytest.mark.parametrize("env", [base.ALWAYS, CHUNKED], ids=["one_chunk", "chunked"])
def test_every_op_bit_exact_on_a_shared_gpu(pair, dtype, env):
    for result in pair.run(sc_every_op, dtype, 60_000, env=env):
        assert all(result.values()), result  # type: ignore[union-attr]


def test_three_ranks_on_a_shared_gpu(trio):
    for result in trio.run(sc_every_op, torch.bfloat16, 50_001, env=CHUNKED):
        assert all(result.values()), result  # type: ignore[union-attr]


def sc_mismatch_on_gpu(rank: int, world: int) -> str:
    torch.cuda.set_device(0)
    x = torch.randn(1000 + 10 * rank, device="cuda").to(torch.bfloat16)
    out = torch.empty(world * x.numel(), dtype=x.dtype, device="cuda")
    try:
        zipccl.all_gather_into_tensor(out, x)
    except zipccl.CollectiveMismatchError as exc:
        return str(exc)
    return "no error"


def test_mismatch_raises_on_every_rank(pair):
    msgs = pair.run(sc_mismatch_on_gpu, env=base.ALWAYS)
    assert all("disagree on the input numel" in m for m in msgs), msgs  # type: ignore[operator]


def sc_auto_profiles_the_staged_transport(rank: int, world: int) -> tuple[str, bool]:
    """auto mode measures this transport's own profile (not the host tensors' one) and keeps
    the result exact whatever it picks."""
    torch.cuda.set_device(0)
    x = base.data(77 + rank, 4 << 20, torch.bfloat16)
    got = torch.empty(world * x.numel(), dtype=x.dtype, device="cuda")
    zipccl.all_gather_into_tensor(got, x.cuda())
    want = torch.empty(world * x.numel(), dtype=x.dtype)
    dist.all_gather_into_tensor(want, x)
    return zipccl.collectives.STATS.strategy, base.same_bits(got.cpu(), want)


def test_auto_on_a_shared_gpu(pair):
    results = pair.run(sc_auto_profiles_the_staged_transport, env={"ZIPCCL_MODE": "auto"})
    assert all(exact for _, exact in results), results  # type: ignore[misc]
    assert len({strategy for strategy, _ in results}) == 1, results  # type: ignore[misc]


@pytest.mark.parametrize("dtype_name", ["bfloat16", "float8_e4m3fn", "int32"])
def test_small_calls_ride_in_the_exchange_on_a_shared_gpu(pair, trio, dtype_name):
    """CUDA tensors that fit the descriptor row's room: their bytes cross in the descriptor
    exchange (copied down and up), torch's bits, no torch.distributed call."""
    numel = inline.fitting(dtype_name)
    for ranks in (pair, trio):
        for sc in (inline.sc_moves, inline.sc_reductions):
            for bad in ranks.run(sc, dtype_name, numel, "cuda", env=inline.AUTO):
                assert not bad, (ranks.world, sc.__name__, bad)


def test_native_repeats_stage_their_input_before_the_exchange(pair):
    staged.check_native_repeats(pair.run(staged.sc_native_repeats, "cuda", env=inline.AUTO))
