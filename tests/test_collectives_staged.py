"""The staged transport (CUDA tensors on a gloo group, through pinned host memory) on CPU.

zipccl.collectives._transport.STAGE_HOST_TENSORS makes a gloo group stage host tensors as it
stages CUDA ones: every byte then crosses an extra host buffer, the transfers go through the
same copies down and up, and the protocols pipeline their chunks as they do on a GPU (chunks sent
ahead of the one received). The scenarios are test_collectives.py's, so the results are checked
against torch.distributed bit for bit; tests/test_collectives_gpu_staged.py runs the CUDA path.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
import torch
import torch.distributed as dist
import zipccl
from torch.distributed import distributed_c10d as c10d
from zipccl import _groups
from zipccl.collectives import _protocols, _stripes, _transport
from zipccl.golden.theory import SAMPLE_SIZE

from tests import test_collectives as base
from tests._collectives_cluster import Cluster
from tests.test_collectives_inline import AUTO, native_profiles, values

DTYPES = base.DTYPES
ALWAYS = base.ALWAYS
SMALL_CHUNKS = base.SMALL_CHUNKS


pair, trio = base.pair, base.trio  # the module-scoped clusters of 2 and 3 gloo ranks


def sc_staged(rank: int, world: int, scenario: str, *args: object) -> tuple[object, int]:
    """test_collectives' ``scenario`` with host tensors staged; returns its result and how many
    buffers crossed the staged transport's copy down (0 would mean the path was not taken)."""
    downs = 0
    real = _transport._down

    def counted(t: torch.Tensor, copies: int = 1) -> torch.Tensor:
        nonlocal downs
        downs += 1
        return real(t, copies)

    _transport.STAGE_HOST_TENSORS, _transport._down = True, counted
    try:
        fn: Callable[..., object] = getattr(base, scenario)
        return fn(rank, world, *args), downs
    finally:
        _transport.STAGE_HOST_TENSORS, _transport._down = False, real


def staged(cluster: Cluster, scenario: str, *args: object, env: dict[str, str]) -> list[object]:
    """The scenario's per-rank results, after checking that data crossed the staged path (a
    broadcast's receivers copy nothing down)."""
    results = cluster.run(sc_staged, scenario, *args, env=env)
    assert any(downs > 0 for _, downs in results), results  # type: ignore[misc]
    return [result for result, _ in results]  # type: ignore[misc]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("env", [ALWAYS, SMALL_CHUNKS], ids=["one_chunk", "chunked"])
def test_every_op_bit_exact(pair, dtype, env):
    assert all(staged(pair, "sc_all_gather", dtype, 5000, env=env))
    assert all(staged(pair, "sc_all_to_all", dtype, 700, env=env))
    assert all(staged(pair, "sc_broadcast", dtype, 5000, env=env))
    assert all(staged(pair, "sc_reduce_scatter", dtype, 2500, "SUM", env=env))
    assert all(staged(pair, "sc_all_reduce", dtype, 4999, "AVG", env=env))


@pytest.mark.parametrize("seed", range(4))
def test_three_ranks_random_splits(trio, seed):
    assert all(staged(trio, "sc_all_to_all_random", seed, env=ALWAYS))


def test_three_ranks_reductions_chunked(trio):
    assert all(staged(trio, "sc_all_reduce", torch.bfloat16, 7001, "SUM", env=SMALL_CHUNKS))
    assert all(staged(trio, "sc_reduce_scatter", torch.float32, 3000, "MAX", env=SMALL_CHUNKS))


def test_overflowed_payloads_are_resent_raw(pair):
    """A payload that outgrew its room is resent raw through the staged transport too."""
    results = staged(pair, "sc_overflow", 6 * SAMPLE_SIZE, env=base.ALWAYS)
    assert all(ok for ok, _ in results), results  # type: ignore[misc]
    assert all(resends > 0 for _, resends in results), results  # type: ignore[misc]


@pytest.mark.parametrize(
    ("case", "needle"),
    [
        ("dtype", "disagree on the dtype (rank 0: bfloat16, rank 1: float16)"),
        ("numel", "disagree on the input numel"),
        ("splits", "rank 0 sends 2 rows to rank 1, which expects 3"),
        ("reduce_op", "disagree on the reduce op"),
    ],
)
def test_mismatch_raises_on_every_rank(pair, case, needle):
    msgs = pair.run(sc_staged, "sc_mismatch", case, env=ALWAYS)
    assert all(needle in m for m, _ in msgs), msgs  # type: ignore[misc]


def sc_failing_decode(rank: int, world: int) -> str:
    """Rank 1's decode raises inside a staged, chunked all-gather: every rank must raise."""
    real = _protocols._slots.Unpack.__call__

    def broken(self, key, got, seg, table, out):  # type: ignore[no-untyped-def]
        if rank == 1:
            raise ValueError("injected decode failure")
        return real(self, key, got, seg, table, out)

    _protocols._slots.Unpack.__call__ = broken  # type: ignore[method-assign]
    try:
        sc_staged(rank, world, "sc_all_gather", torch.bfloat16, 9000)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    finally:
        _protocols._slots.Unpack.__call__ = real  # type: ignore[method-assign]
    return "no error"


def test_failure_on_one_rank_raises_on_every_rank(pair):
    """The failing rank raises its own error, its peer a PeerError naming it; both within the
    cluster's timeout (far under the group's), and the group carries the next call."""
    msgs = pair.run(sc_failing_decode, env=SMALL_CHUNKS)
    assert msgs[1].startswith("ValueError: injected decode failure"), msgs
    assert msgs[0].startswith("PeerError") and "rank 1 failed" in msgs[0], msgs
    assert all(staged(pair, "sc_all_gather", torch.bfloat16, 3000, env=SMALL_CHUNKS))


def test_pipelined_sends_ahead_on_host_transports() -> None:
    """On a host transport the next chunks are sent before a chunk is received; on NCCL each
    chunk's receive follows its send (both queue without blocking there)."""
    order: list[str] = []

    def send(k: int) -> int:
        order.append(f"s{k}")
        return k

    def receive(k: int, sent: int) -> None:
        assert sent == k
        order.append(f"r{k}")

    host = _transport.Group(None, 0, 2, torch.device("cpu"), "gloo")
    _protocols.pipelined(host, range(4), send, receive)
    assert order == ["s0", "s1", "s2", "r0", "s3", "r1", "r2", "r3"]
    order.clear()
    nccl = _transport.Group(None, 0, 2, torch.device("cuda", 0), "nccl")
    _protocols.pipelined(nccl, range(3), send, receive)
    assert order == ["s0", "r0", "s1", "r1", "s2", "r2"]


NATIVE_REPEAT_NUMEL = 100_003 * 2  # BF16 values: more than any row carries, even over 2 ranks


def _native_repeats(x: torch.Tensor, world: int) -> dict[str, Callable[..., torch.Tensor]]:
    """Each op zipccl may stage itself when it repeats natively, as ``call(lib, async_op)``
    returning its result: broadcast from rank 1, all-reduce (SUM), even all-to-all."""

    def broadcast(lib: Any, async_op: bool) -> torch.Tensor:
        buf = x.clone()
        _waited(lib.broadcast(buf, src=1, async_op=async_op))
        return buf

    def all_reduce(lib: Any, async_op: bool) -> torch.Tensor:
        buf = x.clone()
        _waited(lib.all_reduce(buf, async_op=async_op))
        return buf

    def all_to_all(lib: Any, async_op: bool) -> torch.Tensor:
        out = torch.empty_like(x)
        _waited(lib.all_to_all_single(out, x, async_op=async_op))
        return out

    return {"broadcast": broadcast, "all_reduce": all_reduce, "all_to_all": all_to_all}


def _waited(work: object) -> None:
    if work is not None:
        work.wait()  # type: ignore[attr-defined]


def sc_native_repeats(rank: int, world: int, device: str = "cpu") -> dict[str, object]:
    """Native calls on the staged transport (``device``'s tensors: host ones staged as CUDA ones
    are), each made three times and then once with ``async_op``: every result must be torch's
    bits on host tensors; the second and third calls (repeats) copy their input down before the
    exchange (:class:`_transport.Prestaged`), the async one leaves the call to torch. Then a
    repeat meeting a mismatched call raises on both ranks."""
    counted: list[str] = []
    real = _transport.Prestaged

    class Counted(real):  # type: ignore[misc, valid-type]
        def __init__(self, t: torch.Tensor, sends: bool = True) -> None:
            counted.append(f"{op}:{'sends' if sends else 'receives'}")
            super().__init__(t, sends)

    if device == "cuda":
        torch.cuda.set_device(0)  # the ranks share GPU 0
    x = values(300 + rank, NATIVE_REPEAT_NUMEL, torch.bfloat16)
    on = x.to(device)
    exact, op = {}, ""
    _transport.STAGE_HOST_TENSORS, _transport.Prestaged = device == "cpu", Counted
    try:
        with native_profiles():
            wanted = _native_repeats(x, world)
            for op, call in _native_repeats(on, world).items():
                want = wanted[op](dist, False)
                got = [call(zipccl, False) for _ in range(3)] + [call(zipccl, True)]
                exact[op] = all(base.same_bits(g.cpu(), want) for g in got)
            op = "mismatch"
            bad = on[: NATIVE_REPEAT_NUMEL - 2 * rank].clone()
            try:
                zipccl.all_reduce(bad)
                error = "no error"
            except zipccl.CollectiveMismatchError as exc:
                error = str(exc)
    finally:
        _transport.STAGE_HOST_TENSORS, _transport.Prestaged = False, real
    return {"exact": exact, "prestaged": counted, "error": error}


def test_native_repeats_stage_their_input_before_the_exchange(pair):
    check_native_repeats(pair.run(sc_native_repeats, env=AUTO))


def check_native_repeats(results: list[object]) -> None:
    """sc_native_repeats' results: exact, the repeats prestaged, the mismatch raised."""
    for rank, found in enumerate(results):
        assert isinstance(found, dict)
        assert all(found["exact"].values()), found
        source = "sends" if rank == 1 else "receives"
        assert found["prestaged"] == [  # the repeats, not the first or the async call
            *[f"broadcast:{source}"] * 2,
            *["all_reduce:sends"] * 2,
            *["all_to_all:sends"] * 2,
            *(["mismatch:sends"] if rank == 0 else []),  # rank 0's call repeats the last
        ], found
        assert "disagree on the tensor numel" in found["error"], found


STRIPES = {"ZIPCCL_STRIPES": "3"}


def sc_striped(rank: int, world: int, scenario: str, *args: object) -> dict[str, object]:
    """``scenario`` (this module's) with stripes of 64 KiB and up, so that a native repeat's
    host bytes (NATIVE_REPEAT_NUMEL BF16 values) are cut: its result, each cut's number of
    stripes, and the stripe groups this rank made for the default group."""
    cuts: list[int] = []
    real_cut, real_min = _stripes.cut, _stripes.MIN_STRIPE_BYTES

    def counted(*cut_args: Any, **kwargs: Any) -> list[tuple[torch.Tensor, object]]:
        parts = real_cut(*cut_args, **kwargs)
        cuts.append(len(parts))
        return parts

    _stripes.cut, _stripes.MIN_STRIPE_BYTES = counted, 64 << 10  # type: ignore[assignment]
    try:
        result = globals()[scenario](rank, world, *args)
    finally:
        _stripes.cut, _stripes.MIN_STRIPE_BYTES = real_cut, real_min  # type: ignore[assignment]
    made = _stripes._MADE.get(_groups.key(None), ())
    return {"result": result, "cuts": cuts, "made": len(made)}


def test_native_repeats_in_stripes(pair):
    """Two ranks: a native repeat's all-reduce and broadcast cut their host bytes into the
    stripes (torch's bits all the same), over groups made for the default group (two at least:
    the cluster's earlier tests may have made more, under the default ZIPCCL_STRIPES)."""
    results = pair.run(sc_striped, "sc_native_repeats", env=AUTO | STRIPES)
    check_native_repeats([found["result"] for found in results])  # type: ignore[index]
    for found in results:
        assert found["made"] >= 2, found  # type: ignore[index]
        assert found["cuts"] == [3] * 4, found  # type: ignore[index]  # 2 broadcasts, 2 reduces


def sc_reductions(rank: int, world: int) -> dict[str, bool]:
    """Native repeats of an all-reduce, SUM and MAX, on staged host tensors: torch's bits."""
    x = values(500 + rank, NATIVE_REPEAT_NUMEL, torch.bfloat16)
    exact = {}
    _transport.STAGE_HOST_TENSORS = True
    try:
        with native_profiles():
            for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX):
                want = x.clone()
                dist.all_reduce(want, op)
                got = [x.clone() for _ in range(3)]
                for buf in got:
                    zipccl.all_reduce(buf, op)
                exact[str(op)] = all(base.same_bits(g, want) for g in got)
    finally:
        _transport.STAGE_HOST_TENSORS = False
    return exact


def test_three_ranks_cut_only_order_free_reductions(trio):
    """Three ranks: gloo's ring gives each cut of a buffer its own order of summing, so a SUM is
    moved uncut and a MAX in stripes; both give torch's bits."""
    env = AUTO | STRIPES | {"ZIPCCL_NATIVE_REDUCE": "1"}
    for found in trio.run(sc_striped, "sc_reductions", env=env):
        assert all(found["result"].values()), found  # type: ignore[index]
        assert found["cuts"] == [1, 1, 3, 3], found  # type: ignore[index]


def sc_stripes_end_with_their_group(rank: int, world: int) -> tuple[int, int, float]:
    """A subgroup's staged calls in chunks make its stripe groups, with its timeout; destroying
    the subgroup ends them too. Returns the registered groups' count before and after the
    destroy, less the count before the subgroup was made, and the stripes' timeout (s)."""
    start = len(c10d._world.pg_map)
    sub = dist.new_group(list(range(world)), backend="gloo", timeout=timedelta(seconds=41))
    x = values(700 + rank, 3000, torch.bfloat16)
    _transport.STAGE_HOST_TENSORS = True
    try:
        out = torch.empty(world * x.numel(), dtype=x.dtype)
        zipccl.all_gather_into_tensor(out, x, group=sub)
    finally:
        _transport.STAGE_HOST_TENSORS = False
    made = len(c10d._world.pg_map) - start
    stripe = _stripes.groups(sub)[1]
    assert stripe is not None
    timeout = stripe._get_backend(torch.device("cpu")).options._timeout.total_seconds()
    del stripe
    dist.destroy_process_group(sub)
    del sub
    gc.collect()
    return made, len(c10d._world.pg_map) - start, timeout


def test_stripe_groups_end_with_their_group(pair):
    for found in pair.run(sc_stripes_end_with_their_group, env=SMALL_CHUNKS | STRIPES):
        assert found == (3, 0, 41.0)  # the subgroup and its two stripes, its timeout; then none
