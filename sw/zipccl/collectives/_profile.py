"""The switch's profile of a process group: the native collectives' lines, the codec's, the
local reduction's and what a real compressed call adds, measured once per group, agreed across
ranks (element-wise worst case) and cached by rank 0.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import time
import warnings
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch
import torch.distributed as dist

from zipccl import _kernel_cache, codec, switch
from zipccl.collectives import _exchange, _protocols, _transport
from zipccl.switch import COMPRESSED, Call, Line, Profile

_OP_CODE_PROFILE = 99  # the op code of the profiler's timed descriptor exchanges


_TRANSPORT_ENV = (
    "NCCL_P2P_DISABLE",
    "NCCL_SHM_DISABLE",
    "NCCL_NET",
    "NCCL_IB_DISABLE",
    "NCCL_PROTO",
    "NCCL_ALGO",
    "NCCL_SOCKET_IFNAME",
)


def profile_for(g: _transport.Group) -> Profile:
    """The group's agreed profile: memory, then rank 0's cache file, then a fresh measurement."""
    key = switch.profile_key(g.pg, g.staged)
    if key in switch.PROFILES:
        return switch.PROFILES[key]
    size = 2 * switch.LINES + len(switch.PRIOR_DTYPES)
    shared = torch.zeros(size + 1, dtype=torch.float64, device=g.wire)
    cached = load_profile(g) if g.rank == 0 else None  # never raises: the others wait on it
    if cached is not None:
        shared[1:] = torch.tensor(cached.vector(), dtype=torch.float64)
        shared[0] = 1
    dist.broadcast(shared, src=dist.get_global_rank(g.pg, 0) if g.pg else 0, group=g.pg)
    if shared[0].item() == 1:
        profile = Profile.from_vector(shared[1:].cpu().tolist())
    else:
        mine = torch.tensor(measure(g).vector(), dtype=torch.float64, device=g.wire)
        # ratios: max is the pessimistic choice; alphas: max; betas: min (negate for MAX)
        mine[1::2][: switch.LINES] *= -1
        dist.all_reduce(mine, op=dist.ReduceOp.MAX, group=g.pg)
        mine[1::2][: switch.LINES] *= -1
        profile = Profile.from_vector(mine.cpu().tolist())
        if g.rank == 0:
            save_profile(g, profile)
    switch.PROFILES[key] = profile
    return profile


def cache_path(g: _transport.Group) -> Path:
    """The profile's file in the private cache directory (refused if not private)."""
    device = torch.cuda.get_device_name(g.device) if g.cuda else "cpu"
    env = {k: os.environ.get(k, "") for k in _TRANSPORT_ENV}
    ident = json.dumps([g.backend, g.world, device, torch.__version__, env, _PROFILE_VERSION])
    digest = hashlib.sha256(ident.encode()).hexdigest()[:16]
    return _kernel_cache.cache_dir() / f"profile-{digest}.json"


_PROFILE_BYTES = 1 << 16  # a profile is ~1 KiB of JSON


def load_profile(g: _transport.Group) -> Profile | None:
    """Rank 0's cached profile, or None (measure again) for a missing, corrupt or unsafe one
    -- a warning, never an exception, since the other ranks are waiting on rank 0."""
    try:
        raw = _kernel_cache.read_private(cache_path(g), _PROFILE_BYTES)
        return None if raw is None else Profile.from_json(raw.decode())
    except Exception as exc:  # UnsafeCacheError, a directory, bad UTF-8, JSON or values: any
        warnings.warn(f"zipccl: not using the cached profile, measuring again: {exc}", stacklevel=3)
        return None


def save_profile(g: _transport.Group, profile: Profile) -> None:
    """Cache the agreed profile atomically; a failure to cache costs a later run a measurement,
    so it is a warning."""
    try:
        _kernel_cache.write_private(cache_path(g), profile.to_json().encode())
    except OSError as exc:
        warnings.warn(f"zipccl: could not cache the profile: {exc}", stacklevel=3)


_PROFILE_VERSION = 9  # bumped whenever what a profile measures changes: old caches are not read


def _once(fn: Callable[[], object], cuda: bool) -> float:
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def fastest(fn: Callable[[], object], cuda: bool, reps: int = 5) -> float:
    """Fastest of ``reps`` timings of ``fn`` after one warm-up call: on a shared machine a
    median of few reps still catches scheduling spikes, which then mislead the choice."""
    fn()
    return min(_once(fn, cuda) for _ in range(reps))


def timed_together(
    fns: dict[object, Callable[[], object]], cuda: bool, rounds: int = 11
) -> dict[object, float]:
    """Fastest time of each closure over ``rounds`` rounds that call them all in turn (after one
    warm-up round), starting one later each round. Interleaved, a burst of load on a shared
    machine hits every closure alike instead of skewing one op's line -- which is what made a
    noisy gloo profile pick a2a_reduce over the native all-reduce. The order depends only on the
    keys, so ranks timing collectives call them in the same order."""
    keys = list(fns)
    for key in keys:
        fns[key]()
    best = dict.fromkeys(keys, float("inf"))
    for r in range(rounds):
        for key in keys[r % len(keys) :] + keys[: r % len(keys)]:
            best[key] = min(best[key], _once(fns[key], cuda))
    return best


def _sizes(g: _transport.Group) -> list[int]:
    return [1 << 20, 8 << 20, 32 << 20] if g.cuda else [64 << 10, 192 << 10, 512 << 10]


def measure(g: _transport.Group) -> Profile:

    sizes = _sizes(g)
    closures: dict[object, Callable[[], object]] = {
        (op, s): native_op(g, op, s) for op in switch.OPS for s in sizes
    }
    closures |= {("wire", op, s): wire_op(g, op, s) for op in switch.WIRE_OPS for s in sizes}
    timed = timed_together(closures, g.cuda)

    def fitted(*key: str) -> Line:
        return Line.fit([float(s) for s in sizes], [timed[(*key, s)] for s in sizes])

    native = {op: fitted(op) for op in switch.OPS}
    wire = {op: fitted("wire", op) for op in switch.WIRE_OPS}
    gen = torch.Generator().manual_seed(0)
    data = {s: torch.randn(s // 2, generator=gen).to(torch.bfloat16).to(g.device) for s in sizes}
    book = codec.default_table(data[sizes[-1]])
    packed = {s: codec.compress(x, book) for s, x in data.items()}
    comp = Line.fit(
        [float(s) for s in sizes],
        [fastest(functools.partial(codec.compress, x, book), g.cuda) for x in data.values()],
    )
    table = Line(fastest(lambda: codec.default_table(data[sizes[-1]]), g.cuda), 1e18)
    dec = Line.fit(
        [float(s) for s in sizes],
        [fastest(functools.partial(codec.decompress, c), g.cuda) for c in packed.values()],
    )
    red = Line.fit(
        [float(s) for s in sizes],
        [fastest(functools.partial(_reduce_once, x, g.world), g.cuda) for x in data.values()],
    )
    ratio = {}
    for dtype in switch.PRIOR_DTYPES:
        x = torch.randn(1 << 16, generator=gen).to(dtype).to(g.device)
        ratio[switch.dtype_name(dtype)] = float(codec.compress(x).ratio)
    fields = [_OP_CODE_PROFILE, 0] + [0] * (_exchange.descriptor_words(g.world) - 2)
    carry = None if g.nccl else _exchange.Carry(None)  # and its room for a small call's input

    def descriptor() -> object:
        return _exchange.exchange(g, fields, "profile", _exchange.TAIL_WORDS, None, carry)[0]

    exchange = Line(fastest(descriptor, g.cuda), 1e18)
    lines = Profile(native, comp, dec, red, table, ratio, exchange, wire=wire)
    return replace(lines, overhead=overhead(g, lines, data[sizes[-1]]))


def overhead(g: _transport.Group, p: Profile, x: torch.Tensor) -> Line:
    """What the lines miss of a real compressed call -- host round trips, allocations and
    launches between the stages, ~1-2 ms per call over shared memory: the largest excess of a
    measured call of each of zipccl's protocols (at the largest profiled size; one chunk, or a
    staged group's host chunks) over
    the model's prediction for it, never negative. Without it the model took a shared-memory
    all-to-all for a 1.28x win that measured 0.97x (BENCHMARKS.md, run D)."""

    x = x[: x.numel() // g.world * g.world]
    n = x.numel() * x.element_size()
    chunks = _chunks_moved(g, n)  # as the wire lines were timed
    excess = 0.0
    for op in ("all_gather", "all_to_all", "broadcast"):
        measured = fastest(_protocols.protocol_call(g, op, x, chunks), g.cuda)
        call = Call(op, n, x.dtype, g.world, chunks)
        excess = max(excess, measured - switch.predict_stages(p, call)[COMPRESSED])
    return Line(excess, 1e18)


def _reduce_once(x: torch.Tensor, world: int) -> torch.Tensor:
    parts = x.view(world, -1) if x.numel() % world == 0 else x[: x.numel() // world * world]
    return parts.view(world, -1).float().sum(0).to(x.dtype)


def wire_op(g: _transport.Group, op: str, nbytes: int) -> Callable[[], object]:
    """A closure making the transfer a compressed ``op`` (a WIRE_OPS entry) makes of ``nbytes``
    per rank: _transport's all-gather (gloo: an all-to-all), all-to-all (two ranks on NCCL:
    _protocols.swap's all-gather of the outgoing half) or broadcast. A staged group moves it as
    its compressed calls do: in host chunks (switch.host_chunks), some in flight while others
    cross pinned memory (_protocols.pipelined); timed as one transfer, its line charged every
    byte the copies down and up in full and kept calls native that compress faster."""
    x = torch.zeros(nbytes // g.world * g.world, dtype=torch.uint8, device=g.device)
    parts = x.chunk(_chunks_moved(g, x.numel()))
    moves = [_transfer(g, op, part) for part in parts]

    def run() -> None:
        _protocols.pipelined(g, range(len(moves)), lambda k: moves[k](), lambda _, p: p.wait())

    return run


def _chunks_moved(g: _transport.Group, nbytes: int) -> int:
    """The chunks ``auto`` moves ``nbytes`` in where the profile times them: a staged group's
    host chunks (switch.host_chunks), else one."""
    return switch.host_chunks(nbytes) if g.staged else 1


def _transfer(g: _transport.Group, op: str, x: torch.Tensor) -> Callable[[], _transport.Pending]:
    """A closure starting one transfer of a compressed ``op``'s kind of the flat ``x``."""
    if op == "all_gather":
        out = torch.empty(x.numel() * g.world, dtype=x.dtype, device=g.device)
        return lambda: _transport.all_gather(g, out, x)
    out = torch.empty_like(x)
    if op == "all_to_all" and _protocols.swaps_by_gather(g):
        return lambda: _transport.all_gather(g, out, x[: x.numel() // 2])
    if op == "all_to_all":
        return lambda: _transport.all_to_all(g, out, x)
    if op == "broadcast":
        return lambda: _transport.broadcast(g, x, 0)
    raise ValueError(f"unknown wire op {op!r}")


def native_op(g: _transport.Group, op: str, nbytes: int) -> Callable[[], object]:
    """A closure running the native collective on ``nbytes`` per rank (BF16 data)."""
    numel = nbytes // 2 // g.world * g.world
    x = torch.zeros(numel, dtype=torch.bfloat16, device=g.device)
    if op == "all_gather":
        out = torch.empty(numel * g.world, dtype=x.dtype, device=g.device)
        return lambda: _transport.native_all_gather(out, x, g.pg)
    if op == "all_to_all":
        out = torch.empty_like(x)
        return lambda: dist.all_to_all_single(out, x, group=g.pg)
    if op == "reduce_scatter":
        out = torch.empty(numel // g.world, dtype=x.dtype, device=g.device)
        return lambda: _transport.native_reduce_scatter(out, x, dist.ReduceOp.SUM, g.pg)
    if op == "all_reduce":
        return lambda: dist.all_reduce(x, group=g.pg)
    if op == "broadcast":
        src = dist.get_global_rank(g.pg, 0) if g.pg else 0
        return lambda: dist.broadcast(x, src=src, group=g.pg)
    raise ValueError(f"unknown op {op!r}")
