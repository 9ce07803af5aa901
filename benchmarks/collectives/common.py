"""What every part of the benchmark shares: the device, the data, the ops as closures, the
expected results and the timing of collectives in interleaved rounds."""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import zipccl

OPS = ("all_gather", "all_to_all", "reduce_scatter", "all_reduce", "broadcast")
MODES = ("native", "auto", "auto_nv", "always")  # auto_nv: auto with ZIPCCL_VERIFY=0
# (runs A/B, in git history, predate ZIPCCL_VERIFY=auto: their "auto" is =1)
DEV = torch.device("cuda")  # set by __main__ (--cpu: a gloo smoke test on any machine)


def sync() -> None:
    if DEV.type == "cuda":
        torch.cuda.synchronize()


def make_data(kind: str, nbytes: int, rank: int, minilm: Path) -> torch.Tensor:
    n = nbytes // 2
    if kind == "normal":
        gen = torch.Generator(device=DEV).manual_seed(1234 + rank)
        return torch.randn(n, device=DEV, generator=gen).to(torch.bfloat16)
    bits = np.load(minilm)["bf16_weights"]
    src = torch.from_numpy(np.roll(bits, rank * 7919).view(np.int16)).to(DEV).view(torch.bfloat16)
    return src.repeat(-(-n // src.numel()))[:n].contiguous()


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
