"""The ``zipccl`` torch.distributed backend on 2-3 gloo CPU processes.

Each cluster's default group is re-created as ``init_process_group("zipccl")``; a plain gloo group
of the same ranks is the reference. In ``ZIPCCL_MODE=always`` every float collective must go
through zipccl's compressed protocols (``STATS.strategy``) and give torch's bits (data-moving
ops) or :func:`zipccl.reference_reduce`'s (reductions); every other op must reach the inner gloo
group untouched (no zipccl call); DDP and FSDP2 training must end with the parameters of
the same training on plain gloo (two ranks) or with every gradient reduced by the rank-order
fp32 reference (three ranks); ranks whose ZIPCCL_* settings differ must all raise at once.
"""

import hashlib
import os
import time
from collections.abc import Callable, Iterator
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
import zipccl
from torch import nn
from torch.distributed.distributed_c10d import _coalescing_manager
from zipccl.collectives import STATS

from tests._collectives_cluster import GLOO_TIMEOUT_S, Cluster

ALWAYS = {"ZIPCCL_MODE": "always"}


def sc_zipccl_world(rank: int, world: int, store_path: str) -> str:
    """Re-create the worker's default group (gloo, from the cluster) as a zipccl one."""
    if dist.is_initialized():
        dist.destroy_process_group()
    _PLAIN.clear()
    dist.init_process_group(
        "zipccl",
        store=dist.FileStore(store_path, world),
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=GLOO_TIMEOUT_S),
    )
    return dist.get_backend()


def _cluster(world: int, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    ranks = Cluster(world)
    store = tmp_path_factory.mktemp(f"zipccl{world}") / "store"
    assert ranks.run(sc_zipccl_world, str(store)) == ["zipccl"] * world
    yield ranks
    ranks.close()


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    yield from _cluster(2, tmp_path_factory)


@pytest.fixture(scope="module")
def trio(tmp_path_factory):
    yield from _cluster(3, tmp_path_factory)


@pytest.fixture(scope="module")
def quad(tmp_path_factory):
    yield from _cluster(4, tmp_path_factory)


_PLAIN: dict[str, dist.ProcessGroup] = {}


def plain() -> dist.ProcessGroup:
    """A gloo group of every rank (made once per worker: new_group is itself a collective)."""
    if "gloo" not in _PLAIN:
        _PLAIN["gloo"] = dist.new_group(backend="gloo")
    return _PLAIN["gloo"]


def data(seed: int, numel: int) -> torch.Tensor:
    return torch.randn(numel, generator=torch.Generator().manual_seed(seed)).bfloat16()


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        a.shape == b.shape
        and a.dtype == b.dtype
        and torch.equal(a.view(torch.int16), b.view(torch.int16))
    )


# --------------------------------------------------------------------------- the ops

N = 1200  # values per rank and op


def finish(work: object, outputs: list[torch.Tensor]) -> None:
    """Wait for an async call as frameworks do: ``wait()``, and the future, whose value must hold
    the outputs (as NCCL's does)."""
    if work is None:
        return
    assert work.wait() and work.is_completed()
    value = work.get_future().wait()
    assert {t.data_ptr() for t in value} >= {t.data_ptr() for t in outputs}, value


def op_cases(rank: int, world: int) -> dict[str, tuple[Callable, list[torch.Tensor]]]:
    """Every form of every data-moving op zipccl compresses: name -> (run(group, async_op) ->
    outputs, the outputs' values, recomputed here from every rank's seed)."""
    xs = [data(r, N) for r in range(world)]
    x = xs[rank]

    def all_gather_into_tensor(g: object, a: bool) -> list[torch.Tensor]:
        out = torch.empty(world * N, dtype=x.dtype)
        finish(dist.all_gather_into_tensor(out, x, group=g, async_op=a), [out])
        return [out]

    def all_gather(g: object, a: bool) -> list[torch.Tensor]:
        outs = [torch.empty(N, dtype=x.dtype) for _ in range(world)]
        finish(dist.all_gather(outs, x, group=g, async_op=a), outs)
        return outs

    def all_gather_coalesced(g: object, a: bool) -> list[torch.Tensor]:
        """As FSDP and DTensor coalesce: one all_gather_single_coalesced call."""
        outs = [torch.empty(world * n, dtype=x.dtype) for n in (N, N // 3)]
        with _coalescing_manager(group=g, async_ops=True) as cm:
            for out in outs:
                dist.all_gather_into_tensor(out, x[: out.numel() // world], group=g)
        cm.wait()
        return outs

    rows = [(i + j) % 3 + 1 for i in range(world) for j in range(world)]  # rows[i*W+j]: i -> j

    def all_to_all_single(g: object, a: bool) -> list[torch.Tensor]:
        ins, outs = rows[rank * world : (rank + 1) * world], rows[rank::world]
        uneven, even = torch.empty(sum(outs), 40, dtype=x.dtype), torch.empty_like(x)
        finish(
            dist.all_to_all_single(
                uneven, x[: sum(ins) * 40].view(-1, 40), outs, ins, group=g, async_op=a
            ),
            [uneven],
        )
        finish(dist.all_to_all_single(even, x, group=g, async_op=a), [even])
        return [uneven, even]

    def all_to_all(g: object, a: bool) -> list[torch.Tensor]:
        ins = x.split([_sizes(rank, j) for j in range(world)] + [N - _sent(rank, world)])
        outs = [torch.empty(_sizes(i, rank), dtype=x.dtype) for i in range(world)]
        finish(dist.all_to_all(outs, list(ins[:world]), group=g, async_op=a), outs)
        return outs

    def broadcast(g: object, a: bool) -> list[torch.Tensor]:
        t = x.clone()
        finish(dist.broadcast(t, src=world - 1, group=g, async_op=a), [t])
        return [t]

    def piece(i: int, counts: list[int], unit: int) -> torch.Tensor:
        """What rank i sends this rank when it sends counts[j] units to each rank j."""
        start = sum(counts[:rank]) * unit
        return xs[i][start : start + counts[rank] * unit]

    a2a_uneven = torch.cat(
        [piece(i, rows[i * world : (i + 1) * world], 40) for i in range(world)]
    ).view(-1, 40)
    a2a_even = torch.cat([piece(i, [N // world] * world, 1) for i in range(world)])
    return {
        "all_gather_into_tensor": (all_gather_into_tensor, [torch.cat(xs)]),
        "all_gather": (all_gather, xs),
        "all_gather_coalesced": (
            all_gather_coalesced,
            [torch.cat(xs), torch.cat([t[: N // 3] for t in xs])],
        ),
        "all_to_all_single": (all_to_all_single, [a2a_uneven, a2a_even]),
        "all_to_all": (
            all_to_all,
            [piece(i, [_sizes(i, j) for j in range(world)], 1) for i in range(world)],
        ),
        "broadcast": (broadcast, [xs[-1]]),
    }


def _sizes(src: int, dst: int) -> int:
    """Values rank ``src`` sends rank ``dst`` in the list all-to-all: a different count per pair,
    each over SMALL_BYTES (smaller pieces are never compressed)."""
    return 30 * (src + 2 * dst) + 260


def _sent(src: int, world: int) -> int:
    return sum(_sizes(src, j) for j in range(world))


def reduction_cases(rank: int, world: int) -> dict[str, tuple[Callable, torch.Tensor]]:
    """name -> (run(group, async_op) -> output, the rank-order fp32 reference)."""
    inputs = [data(100 + r, world * N) for r in range(world)]
    mine = inputs[rank]
    cases = {}
    for op in ("SUM", "AVG", "MAX", "MIN"):
        red = getattr(dist.ReduceOp, op)

        def all_reduce(g: object, a: bool, red: object = red) -> torch.Tensor:
            t = mine.clone()
            finish(dist.all_reduce(t, op=red, group=g, async_op=a), [t])
            return t

        cases[f"all_reduce_{op}"] = (all_reduce, zipccl.reference_reduce(inputs, red))
    rows = [x.view(world, N)[rank] for x in inputs]

    def reduce_scatter_tensor(g: object, a: bool) -> torch.Tensor:
        out = torch.empty(N, dtype=mine.dtype)
        finish(
            dist.reduce_scatter_tensor(out, mine, op=dist.ReduceOp.AVG, group=g, async_op=a), [out]
        )
        return out

    def reduce_scatter(g: object, a: bool) -> torch.Tensor:
        out = torch.empty(N, dtype=mine.dtype)
        finish(dist.reduce_scatter(out, list(mine.view(world, N)), group=g, async_op=a), [out])
        return out

    def reduce_scatter_coalesced(g: object, a: bool) -> torch.Tensor:
        """One reduce_scatter_single_coalesced call: the whole input, then its first third."""
        outs = [torch.empty(n, dtype=mine.dtype) for n in (N, N // 3)]
        with _coalescing_manager(group=g, async_ops=True) as cm:
            for out in outs:
                dist.reduce_scatter_tensor(out, mine[: out.numel() * world], group=g)
        cm.wait()
        return torch.cat(outs)

    def zipccl_all_reduce(g: object, a: bool) -> torch.Tensor:
        """zipccl's own function on the backend's group: handed to torch, compressed once."""
        t = mine.clone()
        finish(zipccl.all_reduce(t, group=g, async_op=a), [t])
        return t

    cases["reduce_scatter_tensor"] = (
        reduce_scatter_tensor,
        zipccl.reference_reduce(rows, dist.ReduceOp.AVG),
    )
    cases["reduce_scatter"] = (reduce_scatter, zipccl.reference_reduce(rows))
    third = [x[: N // 3 * world].view(world, -1)[rank] for x in inputs]
    cases["reduce_scatter_coalesced"] = (
        reduce_scatter_coalesced,
        torch.cat([cases["reduce_scatter"][1], zipccl.reference_reduce(third)]),
    )
    cases["zipccl_all_reduce"] = (zipccl_all_reduce, zipccl.reference_reduce(inputs))
    return cases


def sc_compressed_ops(rank: int, world: int, async_op: bool) -> dict[str, str]:
    """Every compressed op on the zipccl group: compressed (zipccl's last call), and the
    exact bits (data-moving ops) or the reference's (reductions)."""
    found = {}
    for name, (run, want) in op_cases(rank, world).items():
        STATS.reset()
        got = run(None, async_op)
        found[name] = _verdict(STATS.strategy, all(map(same_bits, got, want)))
    for name, (run, want) in reduction_cases(rank, world).items():
        STATS.reset()
        got = run(None, async_op)
        found[name] = _verdict(STATS.strategy, same_bits(got, want))
    return found


def _verdict(strategy: str, same: bool) -> str:
    """ "ok" where zipccl's last call compressed and the bits are right."""
    return "ok" if strategy == "compressed" and same else f"{strategy or 'not zipccl'}, {same}"


def sc_passed_through(rank: int, world: int) -> dict[str, object]:
    """The ops zipccl leaves alone reach the inner gloo group: right results, no zipccl bytes."""
    STATS.reset()
    peer, prev = (rank + 1) % world, (rank - 1) % world
    got = torch.zeros(3)
    if rank % 2 == 0:
        dist.send(torch.full((3,), float(rank)), peer)
        dist.recv(got, prev)
    else:
        dist.recv(got, prev)
        dist.send(torch.full((3,), float(rank)), peer)
    batch = torch.zeros(2)
    for work in dist.batch_isend_irecv(
        [
            dist.P2POp(dist.isend, torch.full((2,), rank + 0.5), peer),
            dist.P2POp(dist.irecv, batch, prev),
        ]
    ):
        work.wait()
    dist.barrier()
    gathered = [torch.zeros(2) for _ in range(world)] if rank == 0 else None
    dist.gather(torch.full((2,), float(rank)), gathered, dst=0)
    scattered = torch.zeros(2)
    dist.scatter(
        scattered, [torch.full((2,), 10.0 + r) for r in range(world)] if rank == 0 else None, src=0
    )
    reduced = torch.ones(2)
    dist.reduce(reduced, dst=0)
    objects: list[object] = [None] * world
    dist.all_gather_object(objects, {"rank": rank})
    coalesced = [torch.ones(3), torch.ones(5)]  # one allreduce_coalesced call
    with _coalescing_manager():
        for t in coalesced:
            dist.all_reduce(t)
    try:  # PREMUL_SUM is the inner backend's own (gloo has none)
        dist.all_reduce(torch.ones(2), op=dist._make_nccl_premul_sum(0.5))
        premul = "no error"
    except RuntimeError as exc:
        premul = str(exc)
    return {
        "p2p": got[0].item() == prev and batch[0].item() == prev + 0.5,
        "gather": rank != 0 or [t[0].item() for t in gathered] == list(range(world)),
        "scatter": scattered[0].item() == 10 + rank,
        "reduce": rank != 0 or reduced[0].item() == world,
        "objects": objects == [{"rank": r} for r in range(world)],
        "coalesced": all(t.eq(world).all() for t in coalesced),
        "premul_sum_native": "PREMUL_SUM with Gloo" in premul,
        "zipccl": STATS.strategy not in ("", "native") or STATS.sent,  # agreed, then native
    }


def sc_subgroup(rank: int, world: int) -> object:
    """A zipccl subgroup of ranks 0 and 2 (new_group takes the default group's backend): its
    inner groups map global ranks (broadcast from global rank 2) like any group."""
    sub = dist.new_group([0, 2])
    if rank == 1:
        return sub is dist.GroupMember.NON_GROUP_MEMBER
    inputs = [data(200 + r, N) for r in (0, 2)]
    t = inputs[rank // 2].clone()
    STATS.reset()
    dist.all_reduce(t, group=sub)
    b = inputs[rank // 2].clone()
    work = dist.broadcast(b, src=2, group=sub, async_op=True)
    work.wait()
    return (
        dist.get_backend(sub),
        dist.get_rank(sub),
        STATS.sent > 0,
        same_bits(t, zipccl.reference_reduce(inputs)),
        same_bits(b, inputs[1]),
    )


def sc_dtensor(rank: int, world: int) -> dict[str, str]:
    """DTensor's redistributions (functional collectives, issued from C++) and a tensor-parallel
    MLP on a mesh of the zipccl group reach zipccl, with the exact or reference bits."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    mesh = DeviceMesh.from_group(dist.group.WORLD, "cpu")
    whole, parts = data(7, world * N), [data(300 + r, world * N) for r in range(world)]
    found = {}

    def check(name: str, got: torch.Tensor, want: torch.Tensor) -> None:
        found[name] = _verdict(STATS.strategy, same_bits(got, want))
        STATS.reset()

    STATS.reset()
    gathered = distribute_tensor(whole, mesh, [Shard(0)]).redistribute(mesh, [Replicate()])
    check("all_gather", gathered.to_local(), whole)
    partial = DTensor.from_local(parts[rank], mesh, [Partial()])
    check(
        "reduce_scatter",
        partial.redistribute(mesh, [Shard(0)]).to_local(),
        zipccl.reference_reduce([p.view(world, N)[rank] for p in parts]),
    )
    check(
        "all_reduce",
        partial.redistribute(mesh, [Replicate()]).to_local(),
        zipccl.reference_reduce(parts),
    )
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16))
    x = torch.randn(64, 16, generator=torch.Generator().manual_seed(1))  # over SMALL_BYTES
    local = mlp(x)
    parallelize_module(mlp, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    out = mlp(x)
    found["tensor_parallel"] = _verdict(STATS.strategy, torch.allclose(out, local, atol=1e-6))
    return found


# --------------------------------------------------------------------------- training

VOCAB = 48


def transformer() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Embedding(VOCAB, 32),
        nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True),
        nn.LayerNorm(32),
        nn.Linear(32, VOCAB),
    )


def train(model: nn.Module, rank: int, steps: int = 3) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    gen = torch.Generator().manual_seed(10 + rank)
    for _ in range(steps):
        tokens = torch.randint(0, VOCAB, (4, 8), generator=gen)
        loss = F.cross_entropy(model(tokens).flatten(0, 1), tokens.roll(-1, 1).flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()


def digests(tensors: Iterator[torch.Tensor]) -> list[str]:
    return [
        hashlib.sha256(t.detach().contiguous().view(torch.uint8).numpy()).hexdigest()[:16]
        for t in tensors
    ]


def reference_hook(
    group: dist.ProcessGroup, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """DDP's own reduction -- each gradient times 1 / W as it enters the bucket, then a sum --
    with the sum in rank order in fp32. (Real annotations, no ``from __future__`` in this
    module: DDP checks them.)"""
    world = dist.get_world_size(group)
    buf = bucket.buffer().mul_(1.0 / world)
    parts = [torch.empty_like(buf) for _ in range(world)]
    dist.all_gather(parts, buf, group=group)
    buf.copy_(zipccl.reference_reduce(parts))
    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    fut.set_result(buf)
    return fut


def sc_ddp(rank: int, world: int, on: str) -> tuple[list[str], int]:
    """Three DDP steps on the zipccl default group, plain gloo, or plain gloo with every bucket
    reduced by the reference; the final parameters' digests and zipccl's bytes."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    group = None if on == "zipccl" else plain()
    model = transformer()
    ddp = DDP(model, process_group=group, bucket_cap_mb=0.02)
    if on == "reference":
        ddp.register_comm_hook(group, reference_hook)
    STATS.reset()
    train(ddp, rank)
    return digests(model.parameters()), STATS.sent


class ReferenceReduceScatter:
    """FSDP2's reduce-scatter on plain gloo, reduced by the reference in rank order."""

    def allocate(
        self, size: tuple[int, ...], *, dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(
        self,
        output_tensor: torch.Tensor,
        input_tensor: torch.Tensor,
        group: dist.ProcessGroup,
        op: object,
    ) -> None:
        rows = torch.empty_like(input_tensor)
        dist.all_to_all_single(rows, input_tensor, group=group)
        output_tensor.copy_(zipccl.reference_reduce(list(rows.view(group.size(), -1)), op))


def sc_fsdp2(rank: int, world: int, on: str) -> tuple[list[str], int]:
    """Three fully_shard steps on the zipccl default group, plain gloo, or plain gloo with the
    reference reduce-scatter; this rank's final shards' digests and zipccl's bytes."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    mesh = DeviceMesh.from_group(dist.group.WORLD if on == "zipccl" else plain(), "cpu")
    model = transformer()
    for module in (*model, model):
        fully_shard(module, mesh=mesh)
        if on == "reference":
            module.set_custom_reduce_scatter(ReferenceReduceScatter())
    STATS.reset()
    train(model, rank)
    return digests(p.to_local() for p in model.parameters()), STATS.sent


# --------------------------------------------------------------------------- settings


def sc_mismatch(rank: int, world: int, how: str, key: str, odd: str) -> tuple[str, float]:
    """Rank 1 alone sets ``key`` to ``odd``, then: ``backend`` makes a zipccl group,
    ``functions`` calls zipccl on a fresh gloo group. Returns the error and the seconds it took."""
    group = plain() if how == "functions" else None
    saved = os.environ.get(key)
    if rank == 1:
        os.environ[key] = odd
    start = time.perf_counter()
    try:
        if how == "backend":
            dist.new_group(backend="zipccl")
        else:
            x = torch.zeros(8, dtype=torch.bfloat16)
            zipccl.all_gather_into_tensor(torch.empty(8 * world, dtype=x.dtype), x, group=group)
        return "no error", 0.0
    except zipccl.CollectiveMismatchError as exc:
        return str(exc), time.perf_counter() - start
    finally:
        if saved is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = saved


def sc_init_mismatch(rank: int, world: int, bad_store: str, good_store: str) -> str:
    """init_process_group("zipccl") with ZIPCCL_MODE differing on rank 1 raises on every rank;
    the worker then re-creates its zipccl default group with agreeing settings."""
    dist.destroy_process_group()
    _PLAIN.clear()
    os.environ["ZIPCCL_MODE"] = "never" if rank == 1 else "always"
    try:
        dist.init_process_group(
            "zipccl", store=dist.FileStore(bad_store, world), rank=rank, world_size=world
        )
        found = "no error"
    except zipccl.CollectiveMismatchError as exc:
        found = str(exc)
    finally:
        os.environ.pop("ZIPCCL_MODE")
    sc_zipccl_world(rank, world, good_store)
    return found


# --------------------------------------------------------------------------- tests


@pytest.mark.parametrize("async_op", [False, True])
def test_compressed_ops_exact(pair, trio, async_op):
    for ranks in (pair, trio):
        for found in ranks.run(sc_compressed_ops, async_op, env=ALWAYS):
            assert {name: v for name, v in found.items() if v != "ok"} == {}


def test_passed_through_ops(pair, trio):
    for ranks in (pair, trio):
        for found in ranks.run(sc_passed_through, env=ALWAYS):
            assert not found.pop("zipccl") and all(found.values()), found


def test_dtensor_and_tensor_parallel(pair):
    for found in pair.run(sc_dtensor, env=ALWAYS):
        assert {name: v for name, v in found.items() if v != "ok"} == {}


def test_subgroup(trio):
    assert trio.run(sc_subgroup, env=ALWAYS) == [
        ("zipccl", 0, True, True, True),
        True,
        ("zipccl", 1, True, True, True),
    ]


@pytest.mark.parametrize("scenario", [sc_ddp, sc_fsdp2], ids=["ddp", "fsdp2"])
def test_training_two_ranks_matches_gloo(pair, scenario):
    zipped = pair.run(scenario, "zipccl", env=ALWAYS)
    native = pair.run(scenario, "gloo", env=ALWAYS)
    assert [params for params, _ in zipped] == [params for params, _ in native]
    assert all(sent for _, sent in zipped) and not any(sent for _, sent in native)


@pytest.mark.parametrize("ranks", ["trio", "quad"])
@pytest.mark.parametrize("scenario", [sc_ddp, sc_fsdp2], ids=["ddp", "fsdp2"])
def test_training_three_four_ranks_is_the_rank_order_reduction(request, ranks, scenario):
    ranks = request.getfixturevalue(ranks)
    zipped = ranks.run(scenario, "zipccl", env=ALWAYS)
    reference = ranks.run(scenario, "reference", env=ALWAYS)
    native = ranks.run(scenario, "gloo", env=ALWAYS)
    assert [params for params, _ in zipped] == [params for params, _ in reference]
    assert all(sent for _, sent in zipped)
    assert [params for params, _ in zipped] != [params for params, _ in native], (
        "gloo's own summation order gave the reference's bits: the check cannot tell them apart"
    )


@pytest.mark.parametrize("how", ["backend", "functions"])
@pytest.mark.parametrize(
    ("key", "odd", "shown"),
    [
        ("ZIPCCL_MODE", "never", "ZIPCCL_MODE (rank 0: always, rank 1: never)"),
        ("ZIPCCL_MODE", "auto", "ZIPCCL_MODE (rank 0: always, rank 1: auto)"),
        ("ZIPCCL_CHUNK_BYTES", "4096", "ZIPCCL_CHUNK_BYTES (rank 0: None, rank 1: 4096)"),
        ("ZIPCCL_VERIFY", "1", "ZIPCCL_VERIFY (rank 0: auto, rank 1: 1)"),
        ("ZIPCCL_NATIVE_REDUCE", "1", "ZIPCCL_NATIVE_REDUCE (rank 0: False, rank 1: True)"),
        ("ZIPCCL_CHECKSUM", "1", "ZIPCCL_CHECKSUM (rank 0: False, rank 1: True)"),
        ("ZIPCCL_LANES", "2", "ZIPCCL_LANES (rank 0: 8, rank 1: 2)"),
        ("ZIPCCL_STRIPES", "2", "ZIPCCL_STRIPES (rank 0: 4, rank 1: 2)"),
        ("ZIPCCL_MODE", "Sometimes", "rank 1: invalid 'sometimes'"),
        ("ZIPCCL_MODE", "\udcff", "rank 1: invalid '\\\\xff'"),  # not UTF-8: the byte 0xff
    ],
)
def test_mismatched_settings_raise_on_every_rank(pair, how, key, odd, shown):
    """Issue 18's cases (one rank's chunk size aborted gloo, never/always aborted, auto/always
    and the verify policies hung): a zipccl group's creation, or the first zipccl call on a
    group, raises on every rank at once."""
    for msg, seconds in pair.run(sc_mismatch, how, key, odd, env=ALWAYS):
        assert "ranks disagree on" in msg and shown in msg, msg
        assert seconds < 5, seconds


def test_settings_parsed_once_per_variable(monkeypatch):
    from zipccl import settings

    for key in settings.KEYS:
        monkeypatch.delenv(key, raising=False)
    assert settings.current() == settings.Settings()
    monkeypatch.setenv("ZIPCCL_MODE", " Always ")
    monkeypatch.setenv("ZIPCCL_CHUNK_BYTES", "4096")
    assert settings.current() == settings.Settings(mode="always", chunk_bytes=4096)
    monkeypatch.setenv("ZIPCCL_CHUNK_BYTES", "4k")
    with pytest.raises(ValueError, match="ZIPCCL_CHUNK_BYTES must be a positive integer"):
        settings.current()
    assert settings.value("ZIPCCL_MODE") == "always"  # one bad variable spoils only its own
    monkeypatch.setenv("ZIPCCL_LANES", "0")
    assert settings.value("ZIPCCL_LANES") == 0  # the staged transport's calls on the caller


@pytest.mark.parametrize(
    ("key", "odd"),
    [
        ("ZIPCCL_MODE", "\udcff"),  # os.environ's spelling of the byte 0xff: not UTF-8
        ("ZIPCCL_CHUNK_BYTES", "\udcff"),
        ("ZIPCCL_CHUNK_BYTES", "\u00b2"),  # a digit to str.isdigit, not to int()
        ("ZIPCCL_CHUNK_BYTES", "9" * 5000),  # past int()'s digit limit
        ("ZIPCCL_PLAN_CALLS", "\u0663"),
        ("ZIPCCL_LANES", "-1"),
        ("ZIPCCL_STRIPES", "0"),
        ("ZIPCCL_STRIPES", "17"),  # past MAX_STRIPES: each holds sockets and threads
        ("ZIPCCL_BACKEND", "\udcff"),
    ],
)
def test_malformed_setting_is_a_value_error_naming_it(monkeypatch, key, odd):
    """Issue 37: a non-UTF-8 value raised UnicodeDecodeError, from the error handler too."""
    from zipccl import settings

    monkeypatch.setenv(key, odd)
    with pytest.raises(ValueError, match=key) as caught:
        settings.value(key)
    assert not isinstance(caught.value, UnicodeError)
    published = settings._published(settings.raw())
    if key in settings.KEYS:
        assert published[settings.KEYS.index(key)].startswith("invalid "), published


def test_init_process_group_mismatch(pair, tmp_path):
    found = pair.run(sc_init_mismatch, str(tmp_path / "bad"), str(tmp_path / "good"))
    assert all("ZIPCCL_MODE (rank 0: always, rank 1: never)" in m for m in found), found


@pytest.mark.parametrize(
    ("choice", "gpus", "nccl", "want"),
    [
        ("auto", ["a", "b"], True, "nccl"),
        ("auto", ["a", "a"], True, "gloo"),  # ranks sharing a GPU: NCCL refuses them
        ("auto", ["a", "b"], False, "gloo"),  # no NCCL in this torch
        ("gloo", ["a", "b"], True, "gloo"),
        ("nccl", ["a", "a"], True, "nccl"),
    ],
)
def test_what_moves_cuda_tensors(monkeypatch, choice, gpus, nccl, want) -> None:
    """ZIPCCL_CUDA_TRANSPORT and the ranks' GPUs decide the inner group of CUDA tensors: the
    host-staged gloo transport where NCCL cannot serve or is not wanted."""
    from zipccl import backend

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(dist, "is_nccl_available", lambda: nccl)
    assert backend._cuda_backend(choice, gpus) == want
    monkeypatch.setattr(dist, "is_nccl_available", lambda: False)
    with pytest.raises(ValueError, match="ZIPCCL_CUDA_TRANSPORT=nccl, but this torch has no NCCL"):
        backend._cuda_backend("nccl", gpus)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert backend._cuda_backend(choice, gpus) is None


@pytest.mark.parametrize(
    ("asked", "choice", "gpus", "want"),
    [
        ({"cuda": "nccl"}, "auto", ["a", "b"], {"cuda": "nccl"}),
        ({"cuda": "nccl"}, "auto", ["a", "a"], {"cuda": "gloo"}),  # NCCL refuses a shared GPU
        ({"cuda": "nccl", "cpu": "gloo"}, "gloo", ["a", "b"], {"cpu": "gloo", "cuda": "gloo"}),
        ({"cuda": "gloo"}, "nccl", ["a", "b"], {"cuda": "gloo"}),  # gloo asked: gloo kept
    ],
)
def test_nccl_asked_by_a_script_shares_a_gpu(monkeypatch, asked, choice, gpus, want) -> None:
    """A script's "nccl" group under zipccl-run (inner backends given) on ranks that share a GPU
    moves its CUDA tensors through the host-staged gloo transport, as a plain zipccl group does:
    NCCL would refuse the ranks."""
    from zipccl import backend

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
    assert backend._plan(backend.Options(asked), choice, gpus) == want


@pytest.mark.parametrize(
    ("plan", "cuda", "want"),
    [
        ({"cpu": "gloo", "cuda": "gloo"}, True, 4),  # the staged transport on a GPU: lanes
        ({"cpu": "gloo", "cuda": "nccl"}, True, 0),  # NCCL queues calls on streams itself
        ({"cpu": "gloo", "cuda": "gloo"}, False, 0),  # CUDA tensors asked of gloo, no GPU here
        ({"cpu": "gloo"}, True, 0),
    ],
)
def test_lanes_only_for_the_staged_transport_on_a_gpu(monkeypatch, plan, cuda, want) -> None:
    """The lane count rides in the plan's round, so ranks that differ raise there."""
    from zipccl import backend

    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    assert backend._with_lanes(plan, 4) == (plan, want)
