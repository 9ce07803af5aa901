"""Where a compressed call's time goes on the host-staged transport (CUDA tensors on gloo, ranks
sharing one GPU): torch.profiler over a few calls in ``--mode`` (``always``, or ``auto`` to see
what a call it keeps native or compresses pays), zipccl's protocol steps labelled.

Run from the repository root on a GPU machine::

    torchrun --nproc-per-node 2 -m benchmarks.investigations.staged_trace --op all_reduce \\
        --mib 24 --out OUT

Prints rank 0's timeline of the last call (labelled host ranges, runtime calls over 20 us, GPU
kernels and copies; microseconds from the call's start) beside the native and zipccl wall
times, and writes the chrome trace to ``OUT``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
import zipccl
from torch.profiler import ProfilerActivity, profile, record_function

from benchmarks.collectives import common
from benchmarks.collectives.phases import timeline

MIB = 1 << 20
STEPS = {
    "zipccl.collectives._agree": ["agree", "_exchanged", "strategy_and_chunks", "_summaries"],
    "zipccl.collectives._exchange": ["exchange"],
    "zipccl.collectives._reduce": ["_reduce_scatter", "_gather_half", "_reduce_into"],
    "zipccl.collectives._protocols": [
        "gather_compressed",
        "a2a_compressed",
        "broadcast_compressed",
        "settle",
        "swap",
    ],
    "zipccl.collectives._transport": ["all_gather", "all_to_all", "broadcast", "_down"],
    "zipccl.collectives._slots": ["shared_sources", "sources", "buffers", "pack", "summary_fill"],
}


def labelled() -> None:
    """Wrap each step in a profiler range named after it (callers look the names up at call
    time, so patching the module attribute labels every call)."""

    def wrap(name: str, fn: Callable[..., object]) -> Callable[..., object]:
        def run(*a: object, **kw: object) -> object:
            with record_function(name):
                return fn(*a, **kw)

        return run

    for module, names in STEPS.items():
        mod = importlib.import_module(module)
        for name in names:
            if hasattr(mod, name):
                setattr(
                    mod, name, wrap(f"zipccl.{module.rsplit('.', 1)[1]}.{name}", getattr(mod, name))
                )


def wall(fn: Callable[[], object], reps: int) -> float:
    times = []
    for _ in range(reps):
        dist.barrier()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--op", default="all_reduce", choices=common.OPS)
    ap.add_argument("--mib", type=int, default=24)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--mode", default="always", choices=["always", "auto"])
    ap.add_argument("--data", default="normal", choices=["normal", "weights"])
    ap.add_argument("--minilm", type=Path, default=Path(".data/minilm.npz"))
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    torch.cuda.set_device(0)
    common.DEV = torch.device("cuda", 0)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    x = common.make_data(args.data, args.mib * MIB, rank, args.minilm)
    native, _ = common.op_call(args.op, x, world, dist)
    zipped, _ = common.op_call(args.op, x, world, zipccl)
    os.environ["ZIPCCL_MODE"] = args.mode
    zipped()  # auto: profiles the link first
    times = {"native": wall(native, args.reps), args.mode: wall(zipped, args.reps)}
    labelled()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            dist.barrier()
            torch.cuda.synchronize()
            with record_function("zipccl.call"):
                zipped()
            torch.cuda.synchronize()
    if rank == 0:
        args.out.mkdir(parents=True, exist_ok=True)
        name = f"staged-{args.op}-{args.mib}mib-{args.data}-w{world}-{args.mode}.json"
        path = args.out / name
        prof.export_chrome_trace(str(path))
        print({k: f"{1e3 * v:.2f} ms" for k, v in times.items()}, flush=True)
        print(timeline(json.loads(path.read_text())), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
