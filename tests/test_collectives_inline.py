"""A small call on a host transport completes inside its descriptor exchange: its input rides in
the row (the room: 4 KiB at least, grown to the larger calls a group's recent exchanges saw, up to
64 KiB per rank between two ranks), so the exchange is the call's only round.

On 2 and 3 gloo ranks, ``ZIPCCL_MODE=auto`` with a profile that keeps every call uncompressed:
every op, for every dtype the descriptor names, gives torch.distributed's own bits -- a
reduction torch's where every order of it gives one result (integers; floating point SUM and
PRODUCT of two ranks), else zipccl's rank-order reference, which its a2a_reduce strategy computes
anyway -- with no torch.distributed call; a byte more takes the exchange and torch's call; and
nothing of an earlier call's input reaches the peers.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist
import zipccl
from zipccl import switch
from zipccl.collectives import _agree, _exchange, _transport

from tests._collectives_cluster import module_cluster
from tests.test_collectives import (
    counted,
    installed,
    native_profile,
    same_bits,
    same_reduction,
)

AUTO = {"ZIPCCL_MODE": "auto"}

DTYPES = ["bfloat16", "float16", "float32", "float64", "int32", "int8", "uint8", "bool"]

FP8 = ["float8_e4m3fn", "float8_e5m2"]  # moved as bytes; gloo reduces none: the reference


pair = module_cluster(2)


trio = module_cluster(3)


def values(seed: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
    """Seeded values of ``dtype``: floats with zeros of both signs, infinities, NaN and
    subnormals among them; integers over their whole range."""
    gen = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, (numel,), generator=gen).bool()
    if not dtype.is_floating_point:
        info = torch.iinfo(dtype)
        return torch.randint(info.min, info.max, (numel,), generator=gen, dtype=torch.int64).to(
            dtype
        )
    x = torch.randn(numel, generator=gen) * 4
    x[:6] = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 1e-40])
    return x.to(dtype)


def _calls(run: Callable[[], object]) -> list[str]:
    """The torch.distributed calls ``run`` makes (zipccl's exchange and its round not counted;
    the group's settings agreement, its first zipccl call's own round, made before)."""
    _agree.entered(None)
    with counted() as log:
        run()
    return [name for name, *_ in log if name not in ("exchange", "rows")]


def _moves(rank: int, world: int, x: torch.Tensor) -> Iterator[tuple[str, Callable, list]]:
    """(name, call(lib), its outputs) of every data-moving op on ``x``."""
    n = x.numel()
    gathered, listed = torch.empty(world * n, dtype=x.dtype, device=x.device), []
    swapped, cast = torch.empty_like(x), x.clone()
    ins = [(rank + j) % 3 for j in range(world)]  # uneven rows, 2 values each
    outs = [(i + rank) % 3 for i in range(world)]
    uneven_in = x[: 2 * sum(ins)].view(-1, 2)
    uneven_out = torch.empty(sum(outs), 2, dtype=x.dtype, device=x.device)
    yield "all_gather_into_tensor", lambda lib: lib.all_gather_into_tensor(gathered, x), [gathered]
    yield "all_gather", lambda lib: lib.all_gather(listed, x), listed
    yield "all_to_all_single", lambda lib: lib.all_to_all_single(swapped, x), [swapped]
    yield (
        "all_to_all_single uneven",
        lambda lib: lib.all_to_all_single(uneven_out, uneven_in, outs, ins),
        [uneven_out],
    )
    yield "broadcast", lambda lib: lib.broadcast(cast, src=world - 1), [cast]


def sc_moves(rank: int, world: int, dtype_name: str, numel: int, device: str = "cpu") -> list[str]:
    """Every data-moving op through zipccl (on ``device``: CUDA tensors take the staged
    transport), then through torch.distributed on the same host inputs; the ops whose bits
    differ or that called torch.distributed from zipccl (a call larger than the row's room: its
    one torch call is expected and not reported)."""
    dtype, bad = getattr(torch, dtype_name), []
    x = values(100 + rank, numel, dtype)
    inline = numel * x.element_size() <= _exchange.MIN_ROOM
    with native_profiles():
        for (name, call, got), (_, call_torch, want) in zip(
            _moves(rank, world, _on(x, device)), _moves(rank, world, x), strict=True
        ):
            if name == "all_gather":
                got.extend(_on(torch.empty_like(x), device) for _ in range(world))
                want.extend(torch.empty_like(x) for _ in range(world))
            calls = _calls(lambda call=call: call(zipccl))
            wire = [t.view(torch.uint8) if dtype_name in FP8 else t for t in want]
            _moves_torch(call_torch, dtype_name)
            if inline and calls:
                bad.append(f"{name}: called {calls}")
            if not all(same_bits(a.cpu().view(b.dtype), b) for a, b in zip(got, wire, strict=True)):
                bad.append(f"{name}: other bits")
    return bad


def _moves_torch(call: Callable, dtype_name: str) -> None:
    """torch.distributed's call; gloo moves FP8 as its bytes only (zipccl's own wire form)."""
    if dtype_name not in FP8:
        call(dist)
        return

    class Bytes:  # the lib the call sees: every tensor argument as its bytes
        def __getattr__(self, name: str) -> Callable:
            def run(*args: object, **kwargs: object) -> object:
                def raw(a: object) -> object:
                    if isinstance(a, list):
                        return [raw(t) for t in a]
                    return a.view(torch.uint8) if isinstance(a, torch.Tensor) else a

                return getattr(dist, name)(*map(raw, args), **kwargs)

            return run

    call(Bytes())


REDUCE_OPS = ["SUM", "PRODUCT", "MIN", "MAX"]


@contextlib.contextmanager
def native_profiles() -> Iterator[None]:
    """Auto keeps every call uncompressed, on host tensors and on the staged transport alike
    (each has its own profile)."""
    switch.set_profile(None, native_profile(), staged=True)
    try:
        with installed("native"):
            yield
    finally:
        switch.set_profile(None, None, staged=True)


def _on(t: torch.Tensor, device: str) -> torch.Tensor:
    """``t`` on ``device`` (CUDA: the workers share GPU 0)."""
    if device == "cuda":
        torch.cuda.set_device(0)
    return t.to(device)


def sc_reductions(
    rank: int, world: int, dtype_name: str, numel: int, device: str = "cpu"
) -> list[str]:
    """all_reduce and reduce_scatter_tensor under every reduce op through zipccl: where the
    result is torch's bits (integers; float SUM and PRODUCT of two ranks) it must equal torch's;
    where zipccl reduces a codec dtype itself (three ranks; FP8, which gloo cannot reduce) the
    rank-order reference -- either made without a torch.distributed call. Returns what
    differs."""
    dtype, bad = getattr(torch, dtype_name), []
    inputs = [values(200 + r, numel, dtype) for r in range(world)]
    integral, fp8 = not dtype.is_floating_point, dtype_name in FP8
    with native_profiles():
        for op in REDUCE_OPS:
            red = getattr(dist.ReduceOp, op)
            alike = integral or (world == 2 and op in ("SUM", "PRODUCT") and not fp8)
            reference = dtype in _exchange.CODEC_DTYPES and (world > 2 or fp8)
            if not (alike or reference):
                continue  # torch's own call (float MIN/MAX, float64 of three ranks)
            here, there = (
                _reductions(inputs[rank], world, red),
                _reductions(_on(inputs[rank], device), world, red),
            )
            for name, run in there.items():
                got, calls = run(zipccl)
                got = got.cpu()
                if reference:
                    want = _reference(name, inputs, rank, world, red)
                else:
                    want, _ = here[name](dist)
                if calls:
                    bad.append(f"{name} {op}: called {calls}")
                if not same_reduction(got, want):
                    bad.append(f"{name} {op}: other bits")
    return bad


def _reductions(
    x: torch.Tensor, world: int, red: object
) -> dict[str, Callable[[Any], tuple[torch.Tensor, list[str]]]]:
    """(the result, the torch.distributed calls made) of each reduction through a lib."""

    def all_reduce(lib: Any) -> tuple[torch.Tensor, list[str]]:
        t = x.clone()
        return t, _calls(lambda: lib.all_reduce(t, red))

    def reduce_scatter(lib: Any) -> tuple[torch.Tensor, list[str]]:
        out = torch.empty(x.numel() // world, dtype=x.dtype, device=x.device)
        return out, _calls(lambda: lib.reduce_scatter_tensor(out, x, red))

    return {"all_reduce": all_reduce, "reduce_scatter": reduce_scatter}


def _reference(
    name: str, inputs: list[torch.Tensor], rank: int, world: int, red: object
) -> torch.Tensor:
    if name == "all_reduce":
        return zipccl.reference_reduce(inputs, red)
    return zipccl.reference_reduce([x.view(world, -1)[rank] for x in inputs], red)


def fitting(dtype_name: str) -> int:
    """The most values of ``dtype_name`` that ride in any row (its least room) and split evenly
    over 2 or 3."""
    return 6 * (_exchange.MIN_ROOM // getattr(torch, dtype_name).itemsize // 6)


@pytest.mark.parametrize("dtype_name", DTYPES + FP8)
def test_small_moves_are_torchs_bits_in_one_round(pair, trio, dtype_name):
    for ranks in (pair, trio):
        for bad in ranks.run(sc_moves, dtype_name, fitting(dtype_name), env=AUTO):
            assert not bad, (ranks.world, bad)


@pytest.mark.parametrize("dtype_name", [d for d in DTYPES if d != "bool"] + FP8)
def test_small_reductions_in_one_round(pair, trio, dtype_name):
    for ranks in (pair, trio):
        for bad in ranks.run(sc_reductions, dtype_name, fitting(dtype_name), env=AUTO):
            assert not bad, (ranks.world, bad)


def sc_room(rank: int, world: int) -> list[list[str]]:
    """The torch calls of all-reduces in order: MIN_ROOM bytes (rides at once); a value more
    (the first time torch's call follows the exchange, then it rides: the room has grown);
    the most a row may carry (likewise); a value more than that (never rides); ROOM_WINDOW
    calls of 8 bytes, then MIN_ROOM and a value again (the room has shrunk back)."""
    out = []
    _exchange._ROOMS.clear()
    room, cap = _exchange.MIN_ROOM, _exchange.inline_bytes(world)
    with installed("native"):
        for numel in (room // 2, room // 2 + 1, room // 2 + 1, cap // 2, cap // 2, cap // 2 + 1):
            x = values(rank, numel, torch.bfloat16)
            out.append(_calls(lambda x=x: zipccl.all_reduce(x)))
        for _ in range(_exchange.ROOM_WINDOW):
            zipccl.all_reduce(torch.ones(4, dtype=torch.bfloat16))
        x = values(rank, room // 2 + 1, torch.bfloat16)
        out.append(_calls(lambda x=x: zipccl.all_reduce(x)))
    return out


def test_the_rows_room_grows_and_shrinks_with_the_calls(pair, trio):
    for ranks in (pair, trio):
        for calls in ranks.run(sc_room, env=AUTO):
            rounds = [2 if called else 1 for called in calls]  # torch's (or a2a_reduce's) after
            assert rounds == [1, 2, 1, 2, 1, 2, 2], calls


def sc_no_stale_bytes(rank: int, world: int) -> bytes:
    """Calls of 12 KiB of 0xFF (the second rides in a row whose room has grown to 16 KiB), then
    a call of 8 bytes in a row of the same room: what this rank received from rank 0 after
    those 8 bytes in the last call's round."""
    seen: list[tuple[torch.Tensor, int]] = []
    real = _exchange._swap_rows

    def swap(g: object, bufs: object) -> None:
        real(g, bufs)  # type: ignore[arg-type]
        seen.append((bufs.host_table.clone(), bufs.carried))  # type: ignore[attr-defined]

    _exchange._ROOMS.clear()
    _exchange._swap_rows = swap
    try:
        with installed("native"):
            full = torch.full((12 << 10,), 255, dtype=torch.uint8)
            for _ in range(2):
                out = torch.empty(world * full.numel(), dtype=full.dtype)
                zipccl.all_gather_into_tensor(out, full)
            small = torch.ones(8, dtype=torch.uint8)
            zipccl.all_gather_into_tensor(torch.empty(world * 8, dtype=small.dtype), small)
    finally:
        _exchange._swap_rows = real
    table, words = seen[-1]
    assert words * 8 == 16 << 10, words  # the room the 12 KiB calls grew
    row = table.view(world, -1)[0].view(torch.uint8)
    return row[-8 * words + 8 :].numpy().tobytes()


def test_no_earlier_input_reaches_the_peers(pair):
    for tail in pair.run(sc_no_stale_bytes, env=AUTO):
        assert tail == bytes((16 << 10) - 8)


def sc_staged(rank: int, world: int, dtype_name: str, numel: int) -> list[str]:
    """sc_moves and sc_reductions with host tensors staged as CUDA tensors are (a staged
    group's rows: the summary words apart from the host row that carries the input)."""
    _transport.STAGE_HOST_TENSORS = True
    try:
        return sc_moves(rank, world, dtype_name, numel) + sc_reductions(
            rank, world, dtype_name, numel
        )
    finally:
        _transport.STAGE_HOST_TENSORS = False


def test_small_calls_on_the_staged_transport(pair):
    for bad in pair.run(sc_staged, "bfloat16", fitting("bfloat16"), env=AUTO):
        assert not bad, bad
