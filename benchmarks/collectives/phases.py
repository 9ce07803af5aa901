"""Where one compressed call's time goes: a torch.profiler timeline (``--trace``) and CUDA-event
phases (``--phases``), beside native and the wire's own time for the compressed bytes."""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
import zipccl
from zipccl.collectives import STATS

from benchmarks.collectives import common
from benchmarks.collectives.common import make_data, op_call, sync, timed
from benchmarks.timing import MIB, recorded


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
    sent = torch.tensor([STATS.sent], device=common.DEV)  # a broadcast's receivers sent nothing
    dist.all_reduce(sent, dist.ReduceOp.MAX)
    piece = torch.empty(int(sent.item()), dtype=torch.uint8, device=common.DEV)
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


def timeline(chrome: dict, at: float | None = None, min_runtime_us: float = 20) -> str:
    """A ``zipccl.call`` of a chrome trace (the last, or the one starting at ``at``) as text
    lines: start, duration, kind, name; runtime calls of at least ``min_runtime_us``."""
    events = [e for e in chrome["traceEvents"] if e.get("ph") == "X"]
    call = max(
        (
            e
            for e in events
            if e["name"] == "zipccl.call"
            and e.get("cat") != "gpu_user_annotation"
            and (at is None or e["ts"] == at)
        ),
        key=lambda e: e["ts"],
    )
    t0, t1 = call["ts"], call["ts"] + call["dur"]
    keep = []
    for e in events:
        cat, dur = e.get("cat", ""), e.get("dur", 0)
        gpu = cat in ("kernel", "gpu_memcpy", "gpu_memset")
        runtime = cat == "cuda_runtime" and dur >= min_runtime_us
        if not (gpu or e["name"].startswith("zipccl.") or runtime):
            continue
        if t0 - 50 <= e["ts"] <= t1 + (5e4 if gpu else 0):
            where = f"s{e['args'].get('stream', '?')}" if gpu else "host"
            keep.append((e["ts"] - t0, dur, where, e["name"][:70]))
    lines = [f"{'start us':>10} {'dur us':>9} {'where':>6}  name"]
    lines += [f"{t:10.0f} {d:9.0f} {w:>6}  {n}" for t, d, w, n in sorted(keep)]
    return "\n".join(lines)


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
