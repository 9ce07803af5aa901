"""2-GPU benchmark of zipccl's collectives against native NCCL, and a DDP training comparison.

One launch per transport (NCCL reads its transport variables once per process group)::

    export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
    torchrun --nproc-per-node 2 benchmarks/collectives.py sweep --transport nvlink --out OUT
    NCCL_P2P_DISABLE=1 torchrun ... sweep --transport shm --train --out OUT
    NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 torchrun ... sweep --transport socket --out OUT
    python benchmarks/collectives.py table OUT > benchmarks/results/collectives-tables.md

Where one compressed call's time goes: ``--skip-sweep --trace 256 --trace-ops all_gather
all_to_all`` prints rank 0's timeline of each (torch.profiler: the protocol's stages, runtime
calls over 20 us, every kernel and copy) and writes the chrome traces to OUT. ``--skip-sweep
--phases 256 512`` times its phases without a profiler (CUDA events: to the wire, the collective,
after it) beside native and the native collective of the compressed bytes, into
``OUT/phases-TRANSPORT.json``.

Host overhead of the native fast path and of the compressed protocol (``always``), and the
codec's fixed costs (``probe``: microseconds per call at each ``--kib``), on CPU with gloo (no GPU
needed)::

    OMP_NUM_THREADS=1 torchrun --nproc-per-node 2 benchmarks/collectives.py overhead --out OUT
    OMP_NUM_THREADS=1 torchrun --nproc-per-node 2 benchmarks/collectives.py probe --out OUT

For every op, per-rank size and data (BF16 N(0,1); real MiniLM BF16 weights from
``.data/minilm.npz`` tiled to size, rotated per rank so the ranks differ) the same process times
native torch.distributed, zipccl in ``auto`` and in ``always`` mode: median wall time around
device syncs after a barrier, speedup over native, and bytes each rank sent to other ranks
(zipccl's own count; native: the analytic count). Each zipccl result is checked against native
first (bit for bit for data moves; for reductions against the fp32 rank-order reference).

``overhead``: per-call wall time of small BF16 collectives (default 4 KiB, 64 KiB, 1 MiB per rank)
through torch.distributed directly, zipccl auto (default verification policy), zipccl auto with
``ZIPCCL_VERIFY=1`` and zipccl always (the compressed protocol), calls interleaved, median of
``--calls`` each; plus zipccl's own host time on the native path with the torch op stubbed out.
Host-side overhead only, not a GPU figure. ``--stub-codec`` replaces the CPU codec's kernels by
no-ops, so ``always`` shows the compressed protocol's own host cost rather than the torch codec's.

``--train`` then trains a small GPT (bf16 params, DDP, 200 steps) without and with
``zipccl.ddp_hook`` (twice, to show the zipccl runs repeat exactly) and records step times and
loss curves.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import time
import timeit
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
import zipccl
from torch import nn
from zipccl import switch
from zipccl.collectives import STATS

MIB = 1 << 20
OPS = ("all_gather", "all_to_all", "reduce_scatter", "all_reduce", "broadcast")
MODES = ("native", "auto", "auto_nv", "always")  # auto_nv: auto with ZIPCCL_VERIFY=0
# (run A/B in benchmarks/results/collectives.md predate ZIPCCL_VERIFY=auto: their "auto" is =1)
DEV = torch.device("cuda")  # --cpu: a gloo smoke test of this script on any machine


def sync() -> None:
    if DEV.type == "cuda":
        torch.cuda.synchronize()


# --------------------------------------------------------------------------- data


def make_data(kind: str, nbytes: int, rank: int, minilm: Path) -> torch.Tensor:
    n = nbytes // 2
    if kind == "normal":
        gen = torch.Generator(device=DEV).manual_seed(1234 + rank)
        return torch.randn(n, device=DEV, generator=gen).to(torch.bfloat16)
    bits = np.load(minilm)["bf16_weights"]
    src = torch.from_numpy(np.roll(bits, rank * 7919).view(np.int16)).to(DEV).view(torch.bfloat16)
    return src.repeat(-(-n // src.numel()))[:n].contiguous()


# --------------------------------------------------------------------------- ops


def op_call(
    op: str, x: torch.Tensor, world: int, lib: object, fresh: bool = True
) -> tuple[Callable[[], object], torch.Tensor]:
    """A closure running ``op`` through ``lib`` (torch.distributed or zipccl) and its output;
    in-place ops restore their input first unless ``fresh`` is False."""
    if op == "all_gather":
        out = torch.empty(world * x.numel(), dtype=x.dtype, device=x.device)
        return lambda: lib.all_gather_into_tensor(out, x), out
    if op == "all_to_all":
        out = torch.empty_like(x)
        return lambda: lib.all_to_all_single(out, x), out
    if op == "reduce_scatter":
        out = torch.empty(x.numel() // world, dtype=x.dtype, device=x.device)
        return lambda: lib.reduce_scatter_tensor(out, x), out
    if op == "all_to_all_splits":  # explicit (here equal) splits: zipccl's uneven path
        out, rows = torch.empty_like(x), [x.numel() // world] * world
        return lambda: lib.all_to_all_single(out, x, rows, rows), out
    buf = x.clone()
    if op == "all_reduce":
        return lambda: (fresh and buf.copy_(x), lib.all_reduce(buf)), buf
    if op == "broadcast":
        return lambda: (fresh and buf.copy_(x), lib.broadcast(buf, src=0)), buf
    raise ValueError(op)


def native_wire(op: str, nbytes: int, world: int, rank: int) -> int:
    """Bytes a rank sends to other ranks in the native collective (ring/pairwise volumes)."""
    share = nbytes * (world - 1) // world
    return {
        "all_gather": nbytes,
        "all_to_all": share,
        "reduce_scatter": share,
        "all_reduce": 2 * share,
        "broadcast": nbytes if rank == 0 else 0,
    }[op]


def reference(op: str, x: torch.Tensor, world: int, rank: int) -> torch.Tensor:
    """The expected result: native for data moves, the fp32 rank-order reduction otherwise."""
    if op in ("all_gather", "all_to_all", "broadcast"):
        fn, out = op_call(op, x, world, dist)
        fn()
        return out
    parts = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(parts, x)
    if op == "reduce_scatter":
        return zipccl.reference_reduce([p.view(world, -1)[rank] for p in parts])
    return zipccl.reference_reduce(parts)


OVERHEAD_MODES = {
    "native": {"ZIPCCL_MODE": "never"},
    "auto": {"ZIPCCL_MODE": "auto"},
    "auto_verify": {"ZIPCCL_MODE": "auto", "ZIPCCL_VERIFY": "1"},
    "always": {"ZIPCCL_MODE": "always"},  # the whole compressed protocol
    "native_again": {"ZIPCCL_MODE": "never"},
}  # control: the noise floor


def stub_codec() -> None:
    """The torch backend's kernels replaced by no-ops that claim a 2 % payload: ``always`` then
    times what zipccl adds around the codec (table, buffers, copies, headers, both phases,
    syncs), not the CPU codec's own compute, which dwarfs it. Results are garbage: timing only."""
    from zipccl import _torch

    _torch.encode_into = lambda x, fmt, table, block, out: x.numel() // 50
    _torch.decode_into = lambda *args: None


def overhead(args: argparse.Namespace, rank: int, world: int) -> list[dict]:
    """Per-call host time of small collectives: torch direct vs zipccl auto (+ ZIPCCL_VERIFY=1).

    The modes are interleaved call by call in an order shuffled per round (the same on every rank),
    so drift on a shared machine and the position after another mode hit them alike; native is
    timed twice (the noise floor).
    """
    from zipccl import switch

    if args.stub_codec:
        stub_codec()
    if args.native_profile:  # instant links, slow codec: auto keeps every call native
        fast, slow = switch.Line(1e-6, 1e15), switch.Line(1e-3, 1e9)
        switch.set_profile(
            None,
            switch.Profile(
                {op: fast for op in switch.OPS}, slow, slow, slow, slow, {"bfloat16": 0.7}
            ),
        )
    rows = []
    for kib in args.kib:
        x = make_data("normal", kib << 10, rank, Path())
        for op in (*OPS, "all_to_all_splits"):
            fns = {
                m: op_call(op, x, world, dist if "native" in m else zipccl, fresh=False)[0]
                for m in OVERHEAD_MODES
            }
            times: dict[str, list[float]] = {m: [] for m in OVERHEAD_MODES}
            strategy = {}
            for m, env in OVERHEAD_MODES.items():
                os.environ.pop("ZIPCCL_VERIFY", None)
                os.environ.update(env)
                STATS.reset()
                fns[m]()  # warm-up; loads the profile on the first auto call
                strategy[m] = STATS.strategy or "native"
            order, shuffle = list(OVERHEAD_MODES.items()), random.Random(kib).shuffle
            for i in range(args.calls + 20):
                shuffle(order)
                for m, env in order:
                    os.environ.pop("ZIPCCL_VERIFY", None)
                    os.environ.update(env)
                    t0 = time.perf_counter()
                    fns[m]()
                    if i >= 20:
                        times[m].append(time.perf_counter() - t0)
            os.environ.pop("ZIPCCL_VERIFY", None)
            os.environ["ZIPCCL_MODE"] = "auto"
            row = {
                "op": op,
                "kib": kib,
                "strategy": strategy["auto"],
                "verify_strategy": strategy["auto_verify"],
                "host_us": host_cost(op, fns["auto"], fns["native"]),
            }
            row.update({f"{m}_us": 1e6 * statistics.median(t) for m, t in times.items()})
            rows.append(row)
            if rank == 0:
                print(json.dumps(row), flush=True)
    return rows


TORCH_NAME = {
    "all_gather": "all_gather_into_tensor",
    "all_to_all": "all_to_all_single",
    "all_to_all_splits": "all_to_all_single",
    "reduce_scatter": "reduce_scatter_tensor",
    "all_reduce": "all_reduce",
    "broadcast": "broadcast",
}


def host_cost(
    op: str, zipped: Callable[[], object], native: Callable[[], object], calls: int = 20000
) -> float:
    """Microseconds zipccl adds to a call on its native path, free of transport noise: both
    closures timed with the torch.distributed op replaced by a no-op (local, no communication)."""
    name = TORCH_NAME[op]
    real = getattr(dist, name)
    setattr(dist, name, lambda *args, **kwargs: None)
    try:
        t = [
            statistics.median(timeit.repeat(fn, number=calls // 5, repeat=5)) / (calls // 5)
            for fn in (zipped, native)
        ]
    finally:
        setattr(dist, name, real)
    return 1e6 * (t[0] - t[1])


def overhead_table(rows: list[dict]) -> str:
    lines = [
        "| op | KiB/rank | native us | native again / native | auto us | auto / native |"
        " auto path | zipccl host us | auto, VERIFY=1 us | VERIFY=1 / native |"
        " always us | always / native |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        n = r["native_us"]
        host = f"{r['host_us']:.2f}" if r["strategy"] == "native" else "-"  # stub: native only
        lines.append(
            f"| {r['op']} | {r['kib']} | {n:.1f} | {r['native_again_us'] / n:.2f} | "
            f"{r['auto_us']:.1f} | {r['auto_us'] / n:.2f} | {r['strategy']} | "
            f"{host} | {r['auto_verify_us']:.1f} | "
            f"{r['auto_verify_us'] / n:.2f} | {r['always_us']:.1f} | "
            f"{r['always_us'] / n:.2f} |"
        )
    return "\n".join(lines)


def set_mode(mode: str) -> None:
    """The environment of one sweep column (MODES)."""
    os.environ["ZIPCCL_MODE"] = {"native": "never", "auto_nv": "auto"}.get(mode, mode)
    os.environ["ZIPCCL_VERIFY"] = "0" if mode == "auto_nv" else "auto"


def timed_together(
    calls: dict[str, Callable[[], object]],
    reps: int,
    prepare: Callable[[str], None] = lambda _: None,
) -> dict[str, float]:
    """Median seconds of each call, timed in interleaved rounds (``prepare(key)``, then one call
    of each per round, between barriers and syncs), so drift in the machine's load hits every
    call alike."""
    times: dict[str, list[float]] = {mode: [] for mode in calls}
    for _ in range(reps):
        for mode, fn in calls.items():
            prepare(mode)
            dist.barrier()
            sync()
            t0 = time.perf_counter()
            fn()
            sync()
            times[mode].append(time.perf_counter() - t0)
    return {mode: statistics.median(t) for mode, t in times.items()}


def timed(fn: Callable[[], object], reps: int) -> float:
    """Median seconds of ``fn`` after one warm-up call."""
    fn()
    return timed_together({"": fn}, reps)[""]


def probe(rank: int, kib: int = 32 << 10) -> dict[str, float]:
    """Fixed costs behind the protocols: the descriptor exchange and the codec's calls (default
    32 MiB), median seconds."""
    from zipccl import _comm, codec

    g = _comm.resolve(None)
    x = make_data("normal", kib << 10, rank, Path())
    table = codec.default_table(x)
    c = codec.compress(x, table)
    out = torch.empty_like(x)
    cases = {
        "exchange": lambda: _comm.exchange(g, [1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0], "probe"),
        "default_table": lambda: codec.default_table(x),
        "compress_given_table": lambda: codec.compress(x, table),
        "compress_default_table": lambda: codec.compress(x),
        "decompress": lambda: codec.decompress(c, out=out),
    }
    return {k: timed(fn, 10) for k, fn in cases.items()}


def trace(rank: int, world: int, mib: int, op: str, out_dir: Path) -> str:
    """Where one compressed call's time goes: torch.profiler over three ``always`` calls of
    ``op``, the protocol's stages labelled; returns rank 0's timeline of the last call (host
    ranges, runtime calls over 20 us, every GPU kernel and copy, microseconds from the call's
    start) and writes the chrome trace to ``out_dir``."""
    from torch.profiler import ProfilerActivity, profile, record_function
    from zipccl import collectives as coll

    def labelled(name: str, fn: Callable[..., object]) -> Callable[..., object]:
        def run(*a: object, **kw: object) -> object:
            with record_function(name):
                return fn(*a, **kw)

        return run

    stages = [(coll, "_agree"), (coll, "_pack"), (coll._Unpack, "settle")]
    plain = [getattr(obj, name) for obj, name in stages]
    for (obj, name), fn in zip(stages, plain, strict=True):
        setattr(obj, name, labelled(f"zipccl.{name.strip('_')}", fn))
    try:
        x = make_data("normal", mib * MIB, rank, Path())
        fn, _ = op_call(op, x, world, zipccl)
        os.environ["ZIPCCL_MODE"] = "always"
        for _ in range(3):
            fn()
        sync()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                dist.barrier()
                sync()
                with record_function("zipccl.call"):
                    fn()
                sync()
    finally:
        for (obj, name), fn in zip(stages, plain, strict=True):
            setattr(obj, name, fn)
    path = out_dir / f"trace-{op}-{mib}-rank{rank}.json"
    prof.export_chrome_trace(str(path))
    return timeline(json.loads(path.read_text()))


class _Marked:
    """A collective's Work whose wait() also records when the collective delivered."""

    def __init__(self, work: object, marks: dict[str, torch.cuda.Event]) -> None:
        self.work, self.marks = work, marks

    def wait(self, *args: object) -> object:
        done = self.work.wait(*args)
        self.marks["done"] = recorded()
        return done


def recorded() -> torch.cuda.Event:
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


WIRE_OPS = ("all_gather_into_tensor", "all_to_all_single", "broadcast")


def phases(rank: int, world: int, mib: int, op: str, reps: int = 10) -> dict:
    """Where one compressed call's time goes, from CUDA events rather than a profiler (whose own
    host cost distorts a host-bound protocol): from the call's start to its data collective's
    inputs being ready (descriptor exchange, setup, encode), the collective itself, and from its
    delivery to the call's return (decode, the final read, host checks). Medians of ``reps``
    ``always`` calls of one chunk, beside native ``op`` on the same data and the native
    all-gather / broadcast of the compressed bytes (uint8): the wire's own time for them (two
    ranks, whose compressed all-to-all moves by one all-gather)."""
    marks: dict[str, torch.cuda.Event] = {}
    real = {name: getattr(dist, name) for name in WIRE_OPS}

    def marking(name: str) -> Callable[..., object]:
        def run(tensor: torch.Tensor, *args: object, **kw: object) -> object:
            data = tensor.numel() * tensor.element_size() >= MIB  # not the descriptor exchange
            if data:
                marks["ready"] = recorded()
            work = real[name](tensor, *args, **kw)
            return _Marked(work, marks) if data and work is not None else work

        return run

    x = make_data("normal", mib * MIB, rank, Path())
    fn, _ = op_call(op, x, world, zipccl, fresh=False)
    native, _ = op_call(op, x, world, dist, fresh=False)
    saved = {k: os.environ.get(k) for k in ("ZIPCCL_MODE", "ZIPCCL_CHUNK_BYTES")}
    os.environ.update(ZIPCCL_MODE="always", ZIPCCL_CHUNK_BYTES=str(4 * mib * MIB))
    spans: list[tuple[float, ...]] = []
    try:
        for name in WIRE_OPS:
            setattr(dist, name, marking(name))
        for i in range(reps + 2):
            STATS.reset()
            dist.barrier()
            sync()
            start, t0 = recorded(), time.perf_counter()
            fn()
            end, t1 = recorded(), time.perf_counter()
            sync()
            if i >= 2:  # warm-up calls
                spans.append(
                    (
                        start.elapsed_time(marks["ready"]),
                        marks["ready"].elapsed_time(marks["done"]),
                        marks["done"].elapsed_time(end),
                        1e3 * (t1 - t0),
                    )
                )
    finally:
        for name, f in real.items():
            setattr(dist, name, f)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k)
            else:
                os.environ[k] = v
    sent = torch.tensor([STATS.sent], device=DEV)  # a broadcast's receivers sent nothing
    dist.all_reduce(sent, dist.ReduceOp.MAX)
    piece = torch.empty(int(sent.item()), dtype=torch.uint8, device=DEV)
    wire, _ = op_call(
        "broadcast" if op == "broadcast" else "all_gather", piece, world, dist, fresh=False
    )
    ready, collective, tail, host = (statistics.median(c) for c in zip(*spans, strict=True))
    return {
        "op": op,
        "mib": mib,
        "ready_ms": ready,
        "collective_ms": collective,
        "tail_ms": tail,
        "call_ms": host,
        "sent_bytes": piece.numel(),
        "native_ms": 1e3 * timed(native, reps),
        "wire_ms": 1e3 * timed(wire, reps),
    }


def timeline(chrome: dict) -> str:
    """The last ``zipccl.call`` of a chrome trace as text lines: start, duration, kind, name."""
    events = [e for e in chrome["traceEvents"] if e.get("ph") == "X"]
    call = max(
        (e for e in events if e["name"] == "zipccl.call" and e.get("cat") != "gpu_user_annotation"),
        key=lambda e: e["ts"],
    )
    t0, t1 = call["ts"], call["ts"] + call["dur"]
    keep = []
    for e in events:
        cat, dur = e.get("cat", ""), e.get("dur", 0)
        gpu = cat in ("kernel", "gpu_memcpy", "gpu_memset")
        if not (gpu or e["name"].startswith("zipccl.") or (cat == "cuda_runtime" and dur > 20)):
            continue
        if t0 - 50 <= e["ts"] <= t1 + (5e4 if gpu else 0):
            where = f"s{e['args'].get('stream', '?')}" if gpu else "host"
            keep.append((e["ts"] - t0, dur, where, e["name"][:70]))
    lines = [f"{'start us':>10} {'dur us':>9} {'where':>6}  name"]
    lines += [f"{t:10.0f} {d:9.0f} {w:>6}  {n}" for t, d, w, n in sorted(keep)]
    return "\n".join(lines)


def sweep(args: argparse.Namespace, rank: int, world: int) -> list[dict]:
    rows = []
    for kind in args.data:
        for mib in args.sizes:
            x = make_data(kind, mib * MIB, rank, args.minilm)
            for op in OPS:
                want = reference(op, x, world, rank)
                row = {"transport": args.transport, "data": kind, "op": op, "mib": mib}
                calls = {}
                for mode in MODES:
                    set_mode(mode)
                    fn, out = op_call(op, x, world, zipccl if mode != "native" else dist)
                    STATS.reset()
                    fn()
                    sync()
                    sent, strategy = STATS.sent, STATS.strategy
                    row[f"{mode}_ok"] = torch.equal(out.view(torch.int16), want.view(torch.int16))
                    if mode == "native" or strategy == "native":
                        sent = native_wire(op, mib * MIB, world, rank)
                    row[f"{mode}_wire"] = sent
                    row[f"{mode}_strategy"] = strategy or "native"
                    calls[mode] = fn
                reps = 3 if mib >= 256 else 15
                for mode, seconds in timed_together(calls, reps, set_mode).items():
                    row[f"{mode}_s"] = seconds
                del calls
                rows.append(row)
                if rank == 0:
                    print(json.dumps(row), flush=True)
            del x
    return rows


# --------------------------------------------------------------------------- training


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        att = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        att = att.masked_fill(mask, float("-inf")).softmax(-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    """A small decoder-only transformer (explicit attention: deterministic kernels)."""

    def __init__(self, vocab: int, d: int, layers: int, heads: int, ctx: int) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(ctx, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def train(args: argparse.Namespace, rank: int, hooked: bool) -> dict:
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True, warn_only=True)
    vocab, ctx = 8192, args.ctx
    model = GPT(vocab, args.d_model, args.layers, 8, ctx).to(DEV, torch.bfloat16)
    ddp = DDP(model, bucket_cap_mb=args.bucket_mb)
    if hooked:
        ddp.register_comm_hook(None, zipccl.ddp_hook if args.hook == "zipccl" else allreduce_hook)
    opt = torch.optim.AdamW(ddp.parameters(), lr=3e-4)
    gen = torch.Generator(device=DEV).manual_seed(100 + rank)
    # a learnable stream: token t = start + a * t (mod vocab), one of 8 fixed strides a
    a = torch.randint(1, vocab, (8,), device=DEV, generator=gen)
    losses, times = [], []
    switch.ROUTES.clear()  # a cache: what remains after the steps is what the hook decided
    for _ in range(args.steps):
        start = torch.randint(0, vocab, (args.batch, 1), device=DEV, generator=gen)
        which = torch.randint(0, 8, (args.batch, 1), device=DEV, generator=gen)
        seq = (start + a[which] * torch.arange(ctx + 1, device=DEV)) % vocab
        sync()
        t0 = time.perf_counter()
        logits = ddp(seq[:, :-1])
        loss = F.cross_entropy(logits.float().view(-1, vocab), seq[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sync()
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
    params = sum(p.numel() for p in model.parameters())
    routes = {int(k[3]): v for k, v in switch.ROUTES.items() if k[1] == "all_reduce"}
    return {
        "hooked": hooked,
        "losses": losses,
        "step_s": statistics.median(times[20:]),
        "params": params,
        "routes": routes,
    }


# --------------------------------------------------------------------------- report


def phases_table(rows: list[dict]) -> str:
    """Markdown of :func:`phases` rows."""
    lines = [
        "| op | MiB/rank | to the wire ms | collective ms | after it ms | call ms |"
        " native ms | x | wire alone ms (its bytes, native) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r['op']} | {r['mib']} | {r['ready_ms']:.2f} | {r['collective_ms']:.2f} "
            f"| {r['tail_ms']:.2f} | {r['call_ms']:.2f} | {r['native_ms']:.2f} | "
            f"{r['native_ms'] / r['call_ms']:.2f} | {r['wire_ms']:.2f} |"
        )
    return "\n".join(lines)


def table(out: Path) -> str:
    lines = []
    for path in sorted(out.glob("phases-*.json")):
        found = json.loads(path.read_text())
        lines += [
            f"\n### phases of one compressed call, transport: {found['transport']}\n",
            phases_table(found["rows"]),
        ]
    for path in sorted(out.glob("sweep-*.json")):
        rows = json.loads(path.read_text())["rows"]
        lines += [
            f"\n### transport: {rows[0]['transport']}\n",
            "| data | op | MiB/rank | native ms | auto ms | auto x | auto path |"
            " auto, no verify x | always ms | always x | wire always / native | exact |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for r in rows:
            n = r["native_s"]
            exact = all(r[f"{m}_ok"] is not False for m in MODES)
            lines.append(
                f"| {r['data']} | {r['op']} | {r['mib']} | {1e3 * n:.2f} | "
                f"{1e3 * r['auto_s']:.2f} | {n / r['auto_s']:.2f} | {r['auto_strategy']} | "
                f"{n / r['auto_nv_s']:.2f} | {1e3 * r['always_s']:.2f} | {n / r['always_s']:.2f} | "
                f"{r['always_wire'] / max(1, r['native_wire']):.3f} | {'yes' if exact else 'NO'} |"
            )
    for path in sorted(out.glob("train-*.json")):
        found = json.loads(path.read_text())
        runs, conf, hook = found["runs"], found.get("config", ""), found.get("hook", "zipccl")
        base = runs[0]
        lines += [
            f"\n### DDP training ({path.stem}, {base['params'] / 1e6:.1f} M params) {conf}\n",
            "| run | median step ms | speedup | final loss | max abs loss diff vs native |",
            "| --- | --- | --- | --- | --- |",
        ]
        for i, r in enumerate(runs):
            diff = max(abs(x - y) for x, y in zip(r["losses"], base["losses"], strict=True))
            name = "native" if not r["hooked"] else f"{hook} hook #{i}"
            lines.append(
                f"| {name} | {1e3 * r['step_s']:.2f} | {base['step_s'] / r['step_s']:.3f}"
                f" | {r['losses'][-1]:.4f} | {diff:.3g} |"
            )
        paths = {n: p for r in runs for n, p in r.get("routes", {}).items()}
        if paths:
            listed = ", ".join(
                f"{int(n) / MIB:.1f} MiB {p}"
                for n, p in sorted(paths.items(), key=lambda kv: int(kv[0]))
            )
            lines.append(f"\nThe hook's buckets: {listed}")
        hooked = [r["losses"] for r in runs if r["hooked"]]
        lines.append(
            f"\n{hook} runs identical to each other: {all(h == hooked[0] for h in hooked)}"
            f"; identical to native: {hooked[0] == base['losses']}"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("what", choices=["sweep", "table", "overhead", "probe"])
    ap.add_argument("--kib", type=int, nargs="+", default=[4, 64, 1024])
    ap.add_argument("--calls", type=int, default=400)
    ap.add_argument(
        "--native-profile",
        action="store_true",
        help="overhead: a synthetic profile under which auto keeps every call native",
    )
    ap.add_argument(
        "--stub-codec",
        action="store_true",
        help="overhead: the CPU codec's kernels as no-ops (protocol cost only)",
    )
    ap.add_argument("out", nargs="?", type=Path)
    ap.add_argument("--out", dest="out_dir", type=Path)
    ap.add_argument("--transport", default="nvlink")
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 16, 64, 256, 512])
    ap.add_argument("--data", nargs="+", default=["normal", "weights"])
    ap.add_argument("--minilm", type=Path, default=Path(".data/minilm.npz"))
    ap.add_argument("--train", action="store_true")
    ap.add_argument(
        "--trace",
        type=int,
        default=0,
        help="timeline of one compressed call of each --trace-ops at this many MiB",
    )
    ap.add_argument("--trace-ops", nargs="+", default=["all_gather"], choices=OPS)
    ap.add_argument(
        "--phases",
        type=int,
        nargs="*",
        default=[],
        help="CUDA-event phases of a compressed call of each --phase-ops at these MiB",
    )
    ap.add_argument(
        "--phase-ops",
        nargs="+",
        default=["all_gather", "all_to_all", "broadcast"],
        choices=["all_gather", "all_to_all", "broadcast"],
    )
    ap.add_argument("--skip-sweep", action="store_true")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--d-model", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--bucket-mb", type=float, default=25.0)
    ap.add_argument("--train-mode", default="auto", choices=["auto", "always", "never"])
    ap.add_argument(
        "--hook",
        default="zipccl",
        choices=["zipccl", "torch"],
        help="the hooked runs' hook: zipccl.ddp_hook, or torch's own Python "
        "allreduce_hook (what any Python comm hook costs against DDP's built-in)",
    )
    ap.add_argument("--cpu", action="store_true", help="gloo on CPU: a smoke test of the script")
    args = ap.parse_args()
    if args.what == "table":
        print(table(args.out or args.out_dir))
        return
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    global DEV
    if args.cpu or args.what in ("overhead", "probe"):
        DEV = torch.device("cpu")
        dist.init_process_group("gloo")
    else:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        DEV = torch.device("cuda", torch.cuda.current_device())
        dist.init_process_group("nccl", device_id=DEV)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    if args.what == "overhead":
        rows = overhead(args, rank, world)
        if rank == 0:
            (args.out_dir / "overhead-cpu.json").write_text(
                json.dumps({"rows": rows, "world": world, "torch": torch.__version__}, indent=1)
            )
            print(overhead_table(rows), flush=True)
        dist.destroy_process_group()
        return
    if args.what == "probe":  # the codec's fixed costs at each --kib on this device
        probed = {kib: probe(rank, kib) for kib in args.kib}
        if rank == 0:
            print(
                json.dumps(
                    {kib: {k: round(1e6 * v, 1) for k, v in p.items()} for kib, p in probed.items()}
                ),
                flush=True,
            )
        dist.destroy_process_group()
        return
    for op in args.trace_ops if args.trace else ():
        text = trace(rank, world, args.trace, op, args.out_dir)
        if rank == 0:
            print(f"trace {op} {args.trace} MiB\n{text}", flush=True)
    if args.phases:
        if DEV.type != "cuda":
            raise SystemExit("--phases times CUDA events: it needs the GPUs")
        found = [phases(rank, world, mib, op) for mib in args.phases for op in args.phase_ops]
        if rank == 0:
            (args.out_dir / f"phases-{args.transport}.json").write_text(
                json.dumps({"rows": found, "transport": args.transport}, indent=1)
            )
            print(phases_table(found), flush=True)
    if not args.skip_sweep:
        probed = probe(rank) if DEV.type == "cuda" else {}
        rows = sweep(args, rank, world)
        if rank == 0:
            print("probe", json.dumps(probed), flush=True)
            (args.out_dir / f"sweep-{args.transport}.json").write_text(
                json.dumps(
                    {"rows": rows, "world": world, "probe": probed, "device": str(DEV)}, indent=1
                )
            )
    if args.train:
        os.environ["ZIPCCL_MODE"] = args.train_mode
        runs = [train(args, rank, hooked) for hooked in (False, True, True)]
        if rank == 0:
            (args.out_dir / f"train-{args.transport}.json").write_text(
                json.dumps(
                    {
                        "runs": runs,
                        "hook": args.hook,
                        "config": f"ZIPCCL_MODE={args.train_mode}, "
                        f"bucket_cap_mb={args.bucket_mb}, hook={args.hook}",
                    },
                    indent=1,
                )
            )
            for r in runs:
                print("train", r["hooked"], r["step_s"], r["losses"][-1], flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
