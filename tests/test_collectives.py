"""zipccl collectives on 2-3 gloo CPU processes: bit-exact against torch.distributed.

Data-moving ops (all-gather, all-to-all, broadcast) must return exactly torch.distributed's bytes;
reduce ops must return :func:`zipccl.reference_reduce` (fp32, rank order, rounded once) of every
rank's input, which each worker recomputes from the shared seeds. Mismatched calls must raise
CollectiveMismatchError on every rank.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator

import pytest
import torch
import torch.distributed as dist
import zipccl
from hypothesis import given, settings
from hypothesis import strategies as st
from zipccl import _torch, codec, switch
from zipccl.collectives import (
    STATS,
    _agree,
    _exchange,
    _profile,
    _protocols,
    _reduce,
    _slots,
    _transport,
)
from zipccl.golden.container import DEFAULT_BLOCK, HEADER_BYTES
from zipccl.golden.theory import SAMPLE_SIZE, zipccl_layout

from tests._collectives_cluster import Cluster, module_cluster

DTYPES = [torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn, torch.float8_e5m2]
ALWAYS = {"ZIPCCL_MODE": "always"}
DEBUG = {"ZIPCCL_VERIFY": "1"}
SMALL_CHUNKS = {"ZIPCCL_MODE": "always", "ZIPCCL_CHUNK_BYTES": "3000"}


pair = module_cluster(2)


trio = module_cluster(3)


# --------------------------------------------------------------------------- data


def data(seed: int, numel: int, dtype: torch.dtype, huge: bool = True) -> torch.Tensor:
    """N(0, 1) values plus the awkward ones (zeros, +-inf, NaN, subnormals, huge). The huge value
    sets the theory table's RMS, so every buffer falls back to the raw layout; ``huge=False``
    puts -300 there instead, and BF16 of >= 1500 values then takes the split layout."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(numel, generator=gen)
    if numel >= 16:
        x[:8] = torch.tensor(
            [
                0.0,
                -0.0,
                float("inf"),
                -float("inf"),
                float("nan"),
                1e-40,
                -3e38 if huge else -300.0,
                1e-8,
            ]
        )
    if dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        x = x.clamp(-448, 448)
    return x.to(dtype)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        a.shape == b.shape
        and a.dtype == b.dtype
        and torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))
    )


def same_reduction(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-equal except NaN payloads: no backend defines which NaN a reduction returns."""
    nan_a, nan_b = a.float().isnan(), b.float().isnan()
    return torch.equal(nan_a, nan_b) and same_bits(a[~nan_a], b[~nan_b])


def wire(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2) else t


# --------------------------------------------------------------------------- scenarios
# Each runs on every rank as fn(rank, world, *args) and returns something small to compare.


def sc_all_gather(rank: int, world: int, dtype: torch.dtype, numel: int, huge: bool = True) -> bool:
    x = data(100 + rank, numel, dtype, huge)
    got = torch.empty(world * numel, dtype=dtype)
    zipccl.all_gather_into_tensor(got, x)
    want = torch.empty_like(got)
    dist.all_gather_into_tensor(wire(want), wire(x))
    listed = [torch.empty(numel, dtype=dtype) for _ in range(world)]
    work = zipccl.all_gather(listed, x, async_op=True)
    work.wait()
    return same_bits(got, want) and same_bits(torch.cat(listed), want)


def sc_all_to_all(rank: int, world: int, dtype: torch.dtype, row: int, huge: bool = True) -> bool:
    # rank i sends (i + j) % 3 rows to rank j (some zero), each row of ``row`` elements
    ins = [(rank + j) % 3 for j in range(world)]
    outs = [(i + rank) % 3 for i in range(world)]
    x = data(200 + rank, sum(ins) * row, dtype, huge).view(sum(ins), row)
    got = torch.empty(sum(outs), row, dtype=dtype)
    zipccl.all_to_all_single(got, x, outs, ins)
    want = torch.empty_like(got)
    dist.all_to_all_single(wire(want), wire(x), outs, ins)
    even = data(300 + rank, world * 700 * (1 if huge else 4), dtype, huge)
    got2, want2 = torch.empty_like(even), torch.empty_like(even)
    zipccl.all_to_all_single(got2, even)
    dist.all_to_all_single(wire(want2), wire(even))
    return same_bits(got, want) and same_bits(got2, want2)


def sc_all_to_all_random(rank: int, world: int, seed: int) -> bool:
    """Splits, row size, dtype and chunk size drawn from ``seed`` (the same on every rank)."""
    gen = torch.Generator().manual_seed(seed)
    rows = torch.randint(0, 5, (world, world), generator=gen).tolist()  # rows[i][j]: i -> j
    row = int(torch.randint(1, 300, (1,), generator=gen))
    dtype = DTYPES[int(torch.randint(0, len(DTYPES), (1,), generator=gen))]
    chunk = str(int(torch.randint(64, 4096, (1,), generator=gen)))
    ins, outs = rows[rank], [rows[i][rank] for i in range(world)]
    x = data(seed * 10 + rank, sum(ins) * row, dtype).view(sum(ins), row)
    got, want = torch.empty(sum(outs), row, dtype=dtype), torch.empty(sum(outs), row, dtype=dtype)
    saved = os.environ.get("ZIPCCL_CHUNK_BYTES")
    os.environ["ZIPCCL_CHUNK_BYTES"] = chunk
    try:
        zipccl.all_to_all_single(got, x, outs, ins)
    finally:  # later scenarios in this worker must not inherit it
        if saved is None:
            del os.environ["ZIPCCL_CHUNK_BYTES"]
        else:
            os.environ["ZIPCCL_CHUNK_BYTES"] = saved
    dist.all_to_all_single(wire(want), wire(x), outs, ins)
    return same_bits(got, want)


def sc_broadcast(rank: int, world: int, dtype: torch.dtype, numel: int, huge: bool = True) -> bool:
    src = world - 1
    x = data(400 + rank, numel, dtype, huge).view(-1, 1) if numel else torch.empty(0, dtype=dtype)
    want = x.clone()
    zipccl.broadcast(x, src=src)
    dist.broadcast(wire(want), src)
    return same_bits(x, want)


def sc_reduce_scatter(rank: int, world: int, dtype: torch.dtype, numel: int, op: str) -> bool:
    red = getattr(dist.ReduceOp, op)
    inputs = [data(500 + r, world * numel, dtype) for r in range(world)]
    got = torch.empty(numel, dtype=dtype)
    zipccl.reduce_scatter_tensor(got, inputs[rank].clone(), op=red)
    parts = [x.view(world, numel)[rank] for x in inputs]
    return same_reduction(got, zipccl.reference_reduce(parts, red))


def sc_all_reduce(
    rank: int, world: int, dtype: torch.dtype, numel: int, op: str, huge: bool = True
) -> bool:
    red = getattr(dist.ReduceOp, op)
    inputs = [data(600 + r, numel, dtype, huge).view(-1, 1) for r in range(world)]
    t = inputs[rank].clone()
    zipccl.all_reduce(t, op=red)
    return same_reduction(t, zipccl.reference_reduce(inputs, red))


def sc_native_fallbacks(rank: int, world: int) -> bool:
    """Integers and float64 are not coded: they go through torch unchanged."""
    x = torch.arange(10, dtype=torch.int32) * (rank + 1)
    zipccl.all_reduce(x)
    g = torch.empty(world * 3, dtype=torch.float64)
    zipccl.all_gather_into_tensor(g, torch.full((3,), float(rank), dtype=torch.float64))
    return torch.equal(
        x, torch.arange(10, dtype=torch.int32) * sum(range(1, world + 1))
    ) and torch.equal(g, torch.arange(world, dtype=torch.float64).repeat_interleave(3))


def sc_explicit_table(rank: int, world: int, same: bool) -> str:
    ranks = [127, 126, 125, 128, 124, 129, 123]
    if not same and rank == 1:
        ranks = ranks[::-1]
    table = zipccl_layout(ranks, "test")
    x = data(700 + rank, 5000, torch.bfloat16)
    out = torch.empty(world * 5000, dtype=torch.bfloat16)
    try:
        zipccl.all_gather_into_tensor(out, x, table=table)
    except zipccl.CollectiveMismatchError as exc:
        return str(exc)
    want = torch.empty_like(out)
    dist.all_gather_into_tensor(want, x)
    return "equal" if same_bits(out, want) else "different"


def native_profile() -> switch.Profile:
    """A switch profile under which auto keeps every call native (instant links, slow codec)."""
    fast, slow = switch.Line(1e-6, 1e15), switch.Line(1e-3, 1e9)
    return switch.Profile(
        {op: fast for op in switch.OPS},
        slow,
        slow,
        slow,
        slow,
        {str(d).removeprefix("torch."): 0.7 for d in DTYPES},
    )


def slow_link_profile() -> switch.Profile:
    """A profile under which large enough calls compress (1 MB/s links, instant codec)."""
    link, codec = switch.Line(1e-6, 1e6), switch.Line(1e-6, 1e15)
    return switch.Profile(
        {op: link for op in switch.OPS},
        codec,
        codec,
        codec,
        codec,
        {str(d).removeprefix("torch."): 0.7 for d in DTYPES},
    )


PROFILES = {"native": native_profile, "slow_link": slow_link_profile}


@contextlib.contextmanager
def installed(profile: str | None) -> Iterator[None]:
    """Auto mode's profile for the default group replaced by a synthetic one, then forgotten."""
    if profile is not None:
        switch.set_profile(None, PROFILES[profile]())
    try:
        yield
    finally:
        if profile is not None:
            switch.set_profile(None, None)


def sc_mismatch(rank: int, world: int, case: str, profile: str | None = None) -> str:
    """One rank calls differently; every rank must raise (returns the message)."""
    with installed(profile):
        return _mismatch(rank, world, case)


def _mismatch(rank: int, world: int, case: str) -> str:
    odd = rank == 1
    try:
        if case == "dtype":
            x = torch.zeros(64, dtype=torch.float16 if odd else torch.bfloat16)
            zipccl.all_gather_into_tensor(torch.empty(64 * world, dtype=x.dtype), x)
        elif case == "numel":
            x = torch.zeros(65 if odd else 64, dtype=torch.bfloat16)
            zipccl.all_gather_into_tensor(torch.empty(x.numel() * world, dtype=x.dtype), x)
        elif case == "output":
            x = torch.zeros(64, dtype=torch.bfloat16)
            zipccl.all_gather_into_tensor(torch.empty(64 * world + odd, dtype=x.dtype), x)
        elif case == "splits":
            ins = [2] * world
            outs = [3 if odd else 2] + [2] * (world - 1)
            x = torch.zeros(sum(ins), 4, dtype=torch.bfloat16)
            zipccl.all_to_all_single(torch.empty(sum(outs), 4, dtype=x.dtype), x, outs, ins)
        elif case == "src":
            zipccl.broadcast(torch.zeros(8, dtype=torch.bfloat16), src=int(odd))
        elif case == "op":
            x = torch.zeros(64, dtype=torch.bfloat16)
            if odd:
                zipccl.broadcast(x, src=0)
            else:
                zipccl.all_reduce(x)
        elif case == "reduce_op":
            zipccl.all_reduce(torch.zeros(64), op=dist.ReduceOp.MAX if odd else dist.ReduceOp.SUM)
        elif case == "mode":
            os.environ["ZIPCCL_MODE"] = "auto" if odd else "always"
            zipccl.all_reduce(torch.zeros(64))
        else:
            raise ValueError(case)
    except zipccl.CollectiveMismatchError as exc:
        return str(exc)
    return "no error"


TORCH_OPS = (
    _transport.ALL_GATHER,
    "all_gather",
    "all_to_all_single",
    _transport.REDUCE_SCATTER,
    "all_reduce",
    "broadcast",
)
CASES = {
    "all_gather_into_tensor": _transport.ALL_GATHER,
    "all_gather": "all_gather",
    "all_to_all": "all_to_all_single",
    "all_to_all_uneven": "all_to_all_single",
    "reduce_scatter": _transport.REDUCE_SCATTER,
    "all_reduce": "all_reduce",
    "broadcast": "broadcast",
}  # case -> the torch.distributed op it must call


@contextlib.contextmanager
def counted() -> Iterator[list[tuple]]:
    """torch.distributed's collectives and zipccl's descriptor exchange, wrapped to log every call
    as (name, args, kwargs, result); the exchange's own round of rows is logged too ("rows")."""
    log: list[tuple] = []
    saved = {name: getattr(dist, name) for name in TORCH_OPS}
    saved_exchange, saved_rows = _exchange.exchange, _exchange._swap_rows

    def wrap(name: str, fn: Callable) -> Callable:
        def call(*args: object, **kwargs: object) -> object:
            result = fn(*args, **kwargs)
            log.append((name, args, kwargs, result))
            return result

        return call

    for name, fn in saved.items():
        setattr(dist, name, wrap(name, fn))
    _exchange.exchange = wrap("exchange", saved_exchange)
    _exchange._swap_rows = wrap("rows", saved_rows)
    try:
        yield log
    finally:
        for name, fn in saved.items():
            setattr(dist, name, fn)
        _exchange.exchange, _exchange._swap_rows = saved_exchange, saved_rows


def op_case(
    case: str,
    rank: int,
    world: int,
    lib: object,
    async_op: bool,
    verify: bool | None = None,
    per: int = 600,
) -> tuple[Callable[[], object], list[torch.Tensor], list[torch.Tensor]]:
    """One call through ``lib`` (zipccl, with ``verify``, or torch.distributed) on fresh seeded
    BF16 tensors of ``world * per`` values (600: small enough to ride in the descriptor exchange,
    _exchange.inline_bytes): (run, the caller's tensors in torch's argument order, the
    results)."""
    kw = {"verify": verify} if lib is zipccl else {}
    x = data(1100 + rank, world * per, torch.bfloat16)
    if case == "all_gather_into_tensor":
        out = torch.empty(world * x.numel(), dtype=x.dtype)
        return lambda: lib.all_gather_into_tensor(out, x, async_op=async_op, **kw), [out, x], [out]
    if case == "all_gather":
        outs = [torch.empty_like(x) for _ in range(world)]
        return lambda: lib.all_gather(outs, x, async_op=async_op, **kw), [*outs, x], outs
    if case == "all_to_all":
        out = torch.empty_like(x)
        return lambda: lib.all_to_all_single(out, x, async_op=async_op, **kw), [out, x], [out]
    if case == "all_to_all_uneven":
        ins = [(rank + j) % 3 + 1 for j in range(world)]
        outs = [(i + rank) % 3 + 1 for i in range(world)]
        row = per // 3  # over SMALL_BYTES: compressed in always
        x = x[: sum(ins) * row].view(sum(ins), row)
        out = torch.empty(sum(outs), row, dtype=x.dtype)
        return (
            lambda: lib.all_to_all_single(out, x, outs, ins, async_op=async_op, **kw),
            [out, x],
            [out],
        )
    if case == "reduce_scatter":
        out = torch.empty(per, dtype=x.dtype)
        return (lambda: lib.reduce_scatter_tensor(out, x, async_op=async_op, **kw), [out, x], [out])
    t = x.clone()
    if case == "all_reduce":
        return lambda: lib.all_reduce(t, async_op=async_op, **kw), [t], [t]
    return lambda: lib.broadcast(t, src=0, async_op=async_op, **kw), [t], [t]


def _tensors(args: tuple) -> list[torch.Tensor]:
    flat = [a for arg in args for a in (arg if isinstance(arg, list) else [arg])]
    return [a for a in flat if isinstance(a, torch.Tensor)]


def sc_calls(
    rank: int,
    world: int,
    case: str,
    async_op: bool,
    profile: str | None = None,
    verify: bool | None = None,
    per: int = 600,
) -> dict:
    """One zipccl call (op_case's, ``per``) under the job's env with every torch.distributed call
    logged.

    Returns the logged call names, whether the last call got the caller's own tensors and
    ``async_op`` and its result came back unchanged, and whether the result equals a direct
    torch.distributed call (bit for bit; reductions: up to NaN payloads) and the fp32 rank-order
    reference (reductions).
    """
    _agree.entered(None)  # the group's settings agreement, its first call's round: not logged
    with installed(profile), counted() as log:
        run, mine, results = op_case(case, rank, world, zipccl, async_op, verify, per)
        returned = run()
        if async_op:
            returned.wait()
    run, _, want = op_case(case, rank, world, dist, async_op, per=per)
    work = run()
    if async_op:
        work.wait()
    inputs = [data(1100 + r, world * per, torch.bfloat16) for r in range(world)]
    if case == "reduce_scatter":
        ref = [zipccl.reference_reduce([x.view(world, -1)[rank] for x in inputs])]
    else:
        ref = [zipccl.reference_reduce(inputs)] if case == "all_reduce" else want
    same = same_reduction if case in ("reduce_scatter", "all_reduce") else same_bits
    _, args, kwargs, result = log[-1]
    passed = _tensors(args)
    return {
        "calls": [entry[0] for entry in log],
        "caller_args": [id(t) for t in passed] == [id(t) for t in mine]
        and args[-1] is async_op
        and not kwargs,
        "torch_result": returned is result,
        "same_as_torch": all(same(a, b) for a, b in zip(results, want, strict=True)),
        "same_as_reference": all(same_reduction(a, b) for a, b in zip(results, ref, strict=True)),
    }


def sc_ddp(rank: int, world: int, hooked: bool) -> list[float]:
    """Three DDP steps of a small bf16 MLP; returns the rank's final parameters' checksum bits."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64)
    ).to(torch.bfloat16)
    ddp = DDP(model, bucket_cap_mb=0.05)
    if hooked:
        ddp.register_comm_hook(None, zipccl.ddp_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(10 + rank)
    for _ in range(3):
        x = torch.randn(16, 64, generator=gen).to(torch.bfloat16)
        loss = ddp(x).float().pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return [p.detach().float().sum().item() for p in model.parameters()]


def sc_fsdp_comms(rank: int, world: int) -> bool:
    from zipccl._fsdp2 import ZipAllGather, ZipReduceScatter

    x = data(800 + rank, 3000, torch.bfloat16)
    out = ZipAllGather().allocate((world * 3000,), dtype=x.dtype, device=x.device)
    ZipAllGather()(out, x, dist.group.WORLD)
    want = torch.empty_like(out)
    dist.all_gather_into_tensor(want, x)
    inputs = [data(900 + r, world * 3000, torch.float32) for r in range(world)]
    got = torch.empty(3000)
    ZipReduceScatter()(got, inputs[rank], dist.group.WORLD, dist.ReduceOp.SUM)
    ref = zipccl.reference_reduce([t.view(world, -1)[rank] for t in inputs])
    return same_bits(out, want) and same_reduction(got, ref)


def sc_fsdp2(rank: int, world: int, hooked: bool) -> list[float]:
    """Three steps of a bf16 MLP under fully_shard, optionally with zipccl's FSDP2 comms."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 64)
    ).to(torch.bfloat16)
    for layer in (model[0], model[2], model):
        fully_shard(layer, mesh=mesh)
        if hooked:
            layer.set_custom_all_gather(zipccl.ZipAllGather())
            layer.set_custom_reduce_scatter(zipccl.ZipReduceScatter())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(10 + rank)
    STATS.reset()
    for _ in range(3):
        loss = model(torch.randn(16, 64, generator=gen).to(torch.bfloat16)).float().pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return [p.to_local().float().sum().item() for p in model.parameters()], STATS.sent > 0


def sc_auto_profile(rank: int, world: int) -> list[float]:
    """Auto mode profiles once (rank 0 caches it), later groups read the cache; same everywhere."""
    from zipccl import switch

    switch.set_profile(None, None)
    x = data(1000 + rank, 4096, torch.bfloat16)
    out = torch.empty(world * 4096, dtype=x.dtype)
    zipccl.all_gather_into_tensor(out, x)
    first = _profile.profile_for(_transport.resolve(None)).vector()
    switch.set_profile(None, None)
    zipccl.all_gather_into_tensor(out, x)
    again = _profile.profile_for(_transport.resolve(None)).vector()
    want = torch.empty_like(out)
    dist.all_gather_into_tensor(want, x)
    assert first == again, (first, again)
    assert same_bits(out, want)
    return first


# --------------------------------------------------------------------------- tests


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_all_gather_bit_exact(pair, dtype):
    assert all(pair.run(sc_all_gather, dtype, 4099, env=ALWAYS))
    assert all(pair.run(sc_all_gather, dtype, 9000, env=SMALL_CHUNKS))


@pytest.mark.parametrize("numel", [0, 1, 100])
def test_all_gather_tiny_and_empty(pair, numel):
    assert all(pair.run(sc_all_gather, torch.bfloat16, numel, env=ALWAYS))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_all_to_all_uneven(pair, dtype):
    assert all(pair.run(sc_all_to_all, dtype, 1500, env=ALWAYS))


def test_all_to_all_three_ranks_chunked(trio):
    assert all(trio.run(sc_all_to_all, torch.bfloat16, 1500, env=SMALL_CHUNKS))


@settings(max_examples=8, deadline=None)
@given(st.integers(0, 2**31 - 1))
def test_all_to_all_random_splits(trio, seed):
    print(f"seed={seed}")
    assert all(trio.run(sc_all_to_all_random, seed, env=ALWAYS))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn], ids=str)
@pytest.mark.parametrize("numel", [0, 5000])
def test_broadcast(pair, dtype, numel):
    assert all(pair.run(sc_broadcast, dtype, numel, env=SMALL_CHUNKS))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_reduce_scatter_fp32_rank_order(pair, dtype):
    assert all(pair.run(sc_reduce_scatter, dtype, 3001, "SUM", env=ALWAYS))


@pytest.mark.parametrize("op", ["SUM", "AVG", "MAX", "MIN", "PRODUCT"])
def test_reductions_three_ranks(trio, op):
    assert all(trio.run(sc_reduce_scatter, torch.bfloat16, 2000, op, env=ALWAYS))
    assert all(trio.run(sc_all_reduce, torch.bfloat16, 4001, op, env=SMALL_CHUNKS))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_all_reduce_uneven_length(pair, dtype):
    assert all(pair.run(sc_all_reduce, dtype, 5001, "SUM", env=ALWAYS))


@pytest.mark.parametrize("mode", ["auto", "never"])
def test_native_paths_agree(pair, mode):
    env = {"ZIPCCL_MODE": mode}
    assert all(pair.run(sc_all_gather, torch.bfloat16, 1000, env=env))
    assert all(pair.run(sc_all_to_all, torch.float16, 100, env=env))
    assert all(pair.run(sc_all_reduce, torch.bfloat16, 999, "SUM", env=env))
    assert all(pair.run(sc_native_fallbacks, env=env))


@pytest.mark.parametrize("world", [4, pytest.param(8, marks=pytest.mark.slow)])
def test_many_ranks_every_op(world: int) -> None:
    """Every op on 4 and 8 gloo ranks: what the CPUs allow of the 4- and 8-GPU scaling runs."""
    ranks = Cluster(world)
    try:
        assert all(ranks.run(sc_all_gather, torch.bfloat16, 3001, env=SMALL_CHUNKS))
        assert all(ranks.run(sc_all_to_all_random, 7, env=ALWAYS))
        assert all(ranks.run(sc_broadcast, torch.float16, 2000, env=ALWAYS))
        assert all(ranks.run(sc_reduce_scatter, torch.bfloat16, 1001, "AVG", env=SMALL_CHUNKS))
        auto = {"ZIPCCL_MODE": "auto"}
        assert all(ranks.run(sc_all_reduce, torch.float32, 999, "SUM", env=auto))
    finally:
        ranks.close()


SPLIT = {"ZIPCCL_MODE": "always", "ZIPCCL_CHUNK_BYTES": "8000"}


def test_split_layout_every_op(pair, trio):
    """Moderate data takes the split layout (slots with payload room, the split decode) in every
    op, in chunks; the default data's huge value makes every buffer raw."""
    assert codec.compress(data(100, 4000, torch.bfloat16, huge=False)).layout == "split"
    assert codec.compress(data(100, 4000, torch.bfloat16)).layout == "raw"
    bf16 = torch.bfloat16
    for ranks in (pair, trio):
        assert all(ranks.run(sc_all_gather, bf16, 9001, False, env=SPLIT))
        assert all(ranks.run(sc_all_to_all, bf16, 1500, False, env=SPLIT))
        assert all(ranks.run(sc_broadcast, bf16, 9001, False, env=SPLIT))
        assert all(ranks.run(sc_all_reduce, bf16, 12001, "SUM", False, env=SPLIT))


def lopsided(seed: int, numel: int) -> torch.Tensor:
    """BF16 whose values at the sample's positions (every ``numel // SAMPLE_SIZE``-th) are
    N(0, 1) and the rest spread over 2^-60..2^60: the sample sees only the tame ones, so the
    payload outgrows the room its prediction gave it."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(numel, generator=gen)
    wild = torch.randint(-60, 61, (numel,), generator=gen).float().exp2() * x.sign()
    tame = torch.zeros(numel, dtype=torch.bool)
    tame[:: numel // SAMPLE_SIZE] = True
    return torch.where(tame, x, wild).bfloat16()


def sc_overflow(rank: int, world: int, numel: int) -> tuple[bool, int]:
    """Every op on :func:`lopsided` data: the exact result, and how many raw resends it took."""
    resends = 0
    real = _protocols.resend, _protocols.resend_pairs

    def counted(fn: Callable) -> Callable:
        def run(*args: object) -> object:
            nonlocal resends
            resends += 1
            return fn(*args)

        return run

    _protocols.resend, _protocols.resend_pairs = map(counted, real)
    try:
        x = lopsided(700 + rank, numel)
        got, want = (
            torch.empty(world * numel, dtype=x.dtype),
            torch.empty(world * numel, dtype=x.dtype),
        )
        zipccl.all_gather_into_tensor(got, x)
        dist.all_gather_into_tensor(want, x)
        a2a, a2a_want = torch.empty_like(x), torch.empty_like(x)
        zipccl.all_to_all_single(a2a, x)
        dist.all_to_all_single(a2a_want, x)
        b = x.clone()
        zipccl.broadcast(b, src=0)
        dist.broadcast(x, src=0)
        ok = same_bits(got, want) and same_bits(a2a, a2a_want) and same_bits(b, x)
    finally:
        _protocols.resend, _protocols.resend_pairs = real
    return ok, resends


def test_overflowed_payloads_are_resent_raw(pair, trio):
    """Data whose sample misleads the payload prediction still moves exactly: the pieces whose
    payload outgrew their room go again, raw, in one extra collective per call (every rank agrees
    on which from the headers it has seen)."""
    for ranks in (pair, trio):
        env = {**ALWAYS, "ZIPCCL_CHUNK_BYTES": str(1 << 20)}  # pieces the split layout takes
        for ok, resends in ranks.run(sc_overflow, 6 * SAMPLE_SIZE, env=env):
            assert ok and resends >= 3, (ok, resends)


def sc_host_reads(rank: int, world: int, numel: int) -> list[int]:
    """Host reads after the exchange (``_slots.read_back``: each one device-to-host copy, a
    sync on CUDA) of compressed all-gathers, all-to-alls and a broadcast, each of ``numel`` BF16
    values per rank."""
    reads = []
    real = _slots.read_back

    def counted(streams: object, parts: list[torch.Tensor]) -> object:
        reads[-1] += sum(t.numel() for t in parts) > 0  # an empty read copies nothing
        return real(streams, parts)

    _slots.read_back = counted
    try:
        for fn in (sc_all_gather, sc_all_to_all, sc_broadcast):
            reads.append(0)
            assert fn(
                rank, world, torch.bfloat16, numel // 2 if fn is sc_all_to_all else numel, False
            )
    finally:
        _slots.read_back = real
    return reads


def test_one_host_read_per_call(pair):
    """After its exchange a compressed call reads the host once, whatever its chunk count: the
    headers and the decoders' flag, after every chunk has been queued. 20000-byte chunks:
    sc_all_gather makes two calls of 40000 BF16 values (4 chunks each), sc_all_to_all an uneven
    one (6 chunks) and an even one (1 chunk), sc_broadcast one (4 chunks); every piece is large
    enough for the split layout."""
    env = {**ALWAYS, "ZIPCCL_CHUNK_BYTES": "20000"}
    assert pair.run(sc_host_reads, 40000, env=env) == [[2, 2, 1], [2, 2, 1]]


def sc_exchange_reuse(rank: int, world: int) -> list[list[list[int]]]:
    """Three exchanges through the kept buffers -- two of one width, one wider with a filled
    tail -- and the first one's rows as returned, read after the others."""
    g = _transport.resolve(None)
    first, _ = _exchange.exchange(g, [7, 0, 10 + rank], "probe")
    second, _ = _exchange.exchange(g, [7, 0, 20 + rank], "probe")
    tail, _ = _exchange.exchange(g, [7, 0, 30 + rank], "probe", 2, lambda t: t.fill_(rank - 5))
    return [first.tolist(), second.tolist(), tail.tolist()]


def test_exchange_rows_are_each_calls_own(pair):
    """The exchange keeps its rows between calls; what it returns is a copy, and a wider row's
    tail holds what ``fill`` wrote there on each rank."""
    got = pair.run(sc_exchange_reuse)
    want = [
        [[7, 0, 10], [7, 0, 11]],
        [[7, 0, 20], [7, 0, 21]],
        [[7, 0, 30, -5, -5], [7, 0, 31, -4, -4]],
    ]
    assert got == [want, want]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("numel", [1, 700, 5000])
@pytest.mark.parametrize("huge", [False, True])
def test_packed_piece_is_codec_bytes(dtype, numel, huge):
    """A piece packed for the wire (_slots.pack, queued) is codec.compress_into's split
    buffer for the same table; with a room too small for its payload, the header still tells
    the payload's size (the receivers then know to take the piece raw); a raw piece is the
    values' bytes."""
    x = data(numel, numel, dtype, huge)
    table = codec.default_table(x)
    want = codec.compress_into(
        x, torch.empty(codec.max_compressed_bytes(dtype, numel), dtype=torch.uint8), table
    )
    fixed = codec.fixed_part_bytes(dtype, numel)
    if want.layout == "split":
        store = torch.empty(want.nbytes, dtype=torch.uint8)
        _slots.pack(x, _slots.Seg(numel, fixed, want.nbytes), table, store)
        assert store.equal(want.buffer)
    payload = _torch.encode_into(
        x,
        codec._fmt(dtype),
        table,
        DEFAULT_BLOCK,
        torch.empty(fixed + numel * 8, dtype=torch.uint8),
    )
    short = torch.empty(fixed, dtype=torch.uint8)
    _slots.pack(x, _slots.Seg(numel, fixed, fixed), table, short)
    assert _slots.payload_size(short[:HEADER_BYTES].numpy().tobytes()) == payload
    raw = torch.empty(numel * x.element_size(), dtype=torch.uint8)
    _slots.pack(x, _slots.Seg(numel, 0, raw.numel()), table, raw)
    assert raw.equal(x.view(torch.uint8))


def test_native_fallbacks_when_always(pair):
    assert all(pair.run(sc_native_fallbacks, env=ALWAYS))


def test_explicit_table(pair):
    assert pair.run(sc_explicit_table, True, env=ALWAYS) == ["equal", "equal"]
    msgs = pair.run(sc_explicit_table, False, env=ALWAYS)
    assert all("disagree on the table" in m for m in msgs), msgs


@pytest.mark.parametrize(
    ("case", "needle"),
    [
        ("dtype", "disagree on the dtype (rank 0: bfloat16, rank 1: float16)"),
        ("numel", "disagree on the input numel"),
        ("output", "rank 1: output tensor has the wrong number of elements"),
        ("splits", "rank 0 sends 2 rows to rank 1, which expects 3"),
        ("src", "disagree on src"),
        ("op", "ranks called different collectives"),
        ("reduce_op", "disagree on the reduce op"),
        ("mode", "disagree on ZIPCCL_MODE"),
    ],
)
def test_mismatch_raises_on_every_rank(pair, case, needle):
    """Debug mode (ZIPCCL_VERIFY=1) and, on gloo, the default policy catch every mismatch, on
    native and compressed paths."""
    envs = [{**ALWAYS, **DEBUG}, {"ZIPCCL_MODE": "auto", **DEBUG}, ALWAYS, {"ZIPCCL_MODE": "auto"}]
    for env in envs:
        profile = "native" if env["ZIPCCL_MODE"] == "auto" else None
        msgs = pair.run(sc_mismatch, case, profile, env=env)
        assert all(needle in m for m in msgs), (env, msgs)


def test_mismatch_three_ranks(trio):
    msgs = trio.run(sc_mismatch, "splits", env=ALWAYS)
    assert all("mismatched pairs" in m for m in msgs), msgs


def test_ddp_hook_matches_default_hook(pair):
    native = pair.run(sc_ddp, False, env={"ZIPCCL_MODE": "never"})
    hooked = pair.run(sc_ddp, True, env=ALWAYS)
    auto = pair.run(sc_ddp, True, env={"ZIPCCL_MODE": "auto"})  # small buckets: the native branch
    assert native[0] == native[1] == hooked[0] == hooked[1] == auto[0] == auto[1]


AUTO = {"ZIPCCL_MODE": "auto"}


LARGER = 20000  # BF16 values per rank and world rank: no op's input fits a descriptor row


@pytest.mark.parametrize("async_op", [False, True])
@pytest.mark.parametrize("case", list(CASES))
def test_auto_native_is_the_exchange_and_one_torch_call(pair, case, async_op):
    """Auto with a native profile on gloo, a call larger than _exchange.inline_bytes: the
    descriptor exchange, then exactly one torch.distributed call with the caller's tensors and
    async_op, torch's own result (Work or None) returned, same bits; with ZIPCCL_VERIFY=0, that
    call alone."""
    for verify, before in ((None, ["rows", "exchange"]), (False, [])):
        for r in pair.run(sc_calls, case, async_op, "native", verify, LARGER, env=AUTO):
            assert r["calls"] == [*before, CASES[case]], r
            assert r["caller_args"] and r["torch_result"] and r["same_as_torch"], r


@pytest.mark.parametrize("async_op", [False, True])
@pytest.mark.parametrize("case", list(CASES))
def test_a_small_native_call_completes_in_its_exchange(pair, case, async_op):
    """The same call of at most _exchange.inline_bytes: its input rides in the descriptor
    exchange, which is then the call's only round -- torch's bits; with ZIPCCL_VERIFY=0 torch's
    call alone, as above."""
    for verify, calls in ((None, ["rows", "exchange"]), (False, [CASES[case]])):
        for r in pair.run(sc_calls, case, async_op, "native", verify, env=AUTO):
            assert r["calls"] == calls and r["same_as_torch"], r


@pytest.mark.parametrize("case", ["reduce_scatter", "all_reduce"])
def test_native_reduce_opt_in_three_ranks(trio, case):
    """W = 3: auto runs its own a2a_reduce (verified, the rank-order reference) unless
    ZIPCCL_NATIVE_REDUCE=1, which hands the call (once agreed) to the backend's reduction."""
    for per, calls in ((600, ["rows", "exchange"]), (LARGER, None)):  # in the exchange, or not
        for r in trio.run(sc_calls, case, False, "native", None, per, env=AUTO):
            assert r["calls"][:2] == ["rows", "exchange"] and r["same_as_reference"], r
            assert calls is None or r["calls"] == calls, r
    for r in trio.run(sc_calls, case, True, "native", env={**AUTO, "ZIPCCL_NATIVE_REDUCE": "1"}):
        assert r["calls"] == ["rows", "exchange", CASES[case]], r  # fp32, 3 ranks: any order
        assert r["caller_args"] and r["torch_result"] and r["same_as_torch"], r


@pytest.mark.parametrize("case", list(CASES))
def test_verification_policy(pair, case):
    """Compressed calls exchange the descriptor once whatever the policy (it carries the sample
    summaries that size their pieces; two ranks' compressed all-reduce is one all-gather of the
    whole tensors); on gloo the default verifies native calls too, as do verify=True and
    ZIPCCL_VERIFY=1, and verify=False leaves them alone."""
    runs = [
        (ALWAYS, None, None, 1),
        ({**ALWAYS, "ZIPCCL_VERIFY": "0"}, None, None, 1),
        (AUTO, "native", None, 1),
        (AUTO, "native", True, 1),
        ({**AUTO, **DEBUG}, "native", None, 1),
        ({**AUTO, **DEBUG}, "native", False, 0),
    ]
    for env, profile, verify, exchanges in runs:
        for r in pair.run(sc_calls, case, False, profile, verify, env=env):
            assert r["calls"].count("exchange") == exchanges, (env, verify, r)
            assert r["same_as_torch"] and r["same_as_reference"], (env, verify, r)


def test_uneven_all_to_all_agrees_where_compression_may_pay(pair, trio):
    """With a profile that compresses these all-to-alls, the call exchanges the descriptor once
    even with ZIPCCL_VERIFY=0 (explicit splits: the ranks' sizes differ; even ones: the sample
    summaries), then moves the exact bits in one all-to-all per chunk (on gloo also between two
    ranks: _protocols.swap takes NCCL's all-gather only); the ranks' agreement on the call's
    outcome (a round of rows) closes it."""
    env = {**AUTO, "ZIPCCL_VERIFY": "0"}
    exchange = ["rows", "exchange"]  # the exchange's own round first
    runs = [(pair, "all_to_all_uneven"), (pair, "all_to_all"), (trio, "all_to_all")]
    for cluster, case in runs:
        for r in cluster.run(sc_calls, case, False, "slow_link", env=env):
            assert r["calls"][:2] == exchange and r["same_as_torch"], r
            assert set(r["calls"][2:-1]) == {"all_to_all_single"}, r
            assert r["calls"][-1] == "rows", r


def test_fsdp2_comm_objects(pair):
    assert all(pair.run(sc_fsdp_comms, env=ALWAYS))


@pytest.mark.skipif(not zipccl.FSDP2_HOOKS, reason="this torch has no FSDP2 custom comms")
def test_fsdp2_training_matches_default_comms(pair):
    native = pair.run(sc_fsdp2, False, env={"ZIPCCL_MODE": "never"})
    zipped = pair.run(sc_fsdp2, True, env=ALWAYS)
    assert [params for params, _ in native] == [params for params, _ in zipped]
    assert all(compressed for _, compressed in zipped)


def test_auto_profile_cached_and_agreed(pair, tmp_path):
    profiles = pair.run(
        sc_auto_profile, env={"ZIPCCL_MODE": "auto", "ZIPCCL_CACHE_DIR": str(tmp_path)}
    )
    assert profiles[0] == profiles[1]
    assert len(list(tmp_path.glob("profile-*.json"))) == 1


def test_unpack_checks_every_header_against_the_agreed_piece():
    """A received piece decodes when its payload fits its room; one that overflowed is reported
    (its ranks then resend it raw) and not decoded; a header for other values (count or table)
    is a corrupt buffer."""
    from zipccl.collectives._transport import Group, Streams

    x = data(5, 3000, torch.bfloat16, huge=False)
    table = codec.default_table(x)
    c = codec.compress(x, table)
    assert c.layout == "split" and c.payload_bytes > 0
    g, streams = Group(None, 0, 2, torch.device("cpu"), "gloo"), Streams(None, None)
    fixed = codec.fixed_part_bytes(x.dtype, x.numel())
    seg = _slots.Seg(x.numel(), fixed, c.nbytes)
    unpack, out = _slots.Unpack(g, x.dtype), torch.empty_like(x)
    unpack("fits", c.buffer, seg, table, out)
    assert unpack.settle(streams) == set() and same_bits(out, x)
    unpack, out = _slots.Unpack(g, x.dtype), torch.zeros_like(x)
    unpack("over", c.buffer, _slots.Seg(x.numel(), fixed, c.nbytes - 1), table, out)
    assert unpack.settle(streams) == {"over"} and not out.any()
    other = zipccl_layout(list(range(120, 127)), "other")
    for wrong, book in ((_slots.Seg(2999, fixed, c.nbytes), table), (seg, other)):
        unpack = _slots.Unpack(g, x.dtype)
        unpack.note("wrong", c.buffer, wrong, book)
        with pytest.raises(ValueError, match="corrupt compressed header"):
            unpack.settle(streams)


def test_unpack_refuses_a_piece_whose_alignment_gaps_are_not_zero():
    """Issue 37 item 9: the host decode took a received piece with junk in its alignment gaps
    (every decoder of the format requires zeros there; the header's CRC does not cover them)."""
    from zipccl.collectives._transport import Group
    from zipccl.golden.container import Sections

    x = data(5, 3000, torch.bfloat16, huge=False)
    table = codec.default_table(x)
    c = codec.compress(x, table)
    fmt = _slots.Unpack(Group(None, 0, 2, torch.device("cpu"), "gloo"), x.dtype).fmt
    (lo, _), *_ = Sections.of(fmt, x.numel(), codec.DEFAULT_BLOCK).gaps
    seg = _slots.Seg(x.numel(), codec.fixed_part_bytes(x.dtype, x.numel()), c.nbytes)
    bad = c.buffer.clone()
    bad[lo] = 1
    unpack = _slots.Unpack(Group(None, 0, 2, torch.device("cpu"), "gloo"), x.dtype)
    with pytest.raises(ValueError, match="alignment gap"):
        unpack("gap", bad, seg, table, torch.empty_like(x))


def test_a_failure_report_in_an_unknown_phase_is_a_peer_error():
    """Issue 37 item 9: a peer's report naming a phase that does not exist raised KeyError."""
    with pytest.raises(zipccl.collectives.PeerError, match="rank 1 failed in an unknown phase 7"):
        _exchange._raise_reported("all_gather", None, 0, {1: (7, "ValueError: lies")})


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([torch.bfloat16, torch.float16, torch.float32]), st.integers(0, 2**32 - 1))
def test_two_part_sum_is_the_reference_reduction(dtype, seed):
    """_reduce._reduce_into's one add equals reference_reduce bit for bit (specials too)."""
    a, b = (data(seed % 1000 + k, 3000, dtype, huge=bool(seed & 1)) for k in (0, 1))
    b[::7] = torch.finfo(dtype).max  # overflows to inf, and inf - inf = nan
    out = torch.empty_like(a)
    _reduce._reduce_into(out, [a, b], dist.ReduceOp.SUM)
    assert same_bits(out, zipccl.reference_reduce([a, b])), f"seed {seed}"
