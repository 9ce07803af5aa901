"""Where a compressed offload's time goes (zipccl.offload_tensor, then wait, and load): a
torch.profiler timeline of the down and up calls with the offload's steps labelled, and the
round trip timed for several chunk sizes beside one plain pinned copy each way.

Run from the repository root on a GPU machine::

    PYTHONPATH=sw python3 -m benchmarks.investigations.offload_trace --mib 256 --out OUT

Prints the last traced down and up call (labelled host ranges, every runtime call, GPU kernels
and copies; microseconds from the call's start) and the timings, and writes the chrome trace and
the timings (``offload-trace.json``, ``offload-chunks.json``) to ``OUT``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
import zipccl
from torch.profiler import ProfilerActivity, profile, record_function
from zipccl.offload import _host_copy, _host_pool

from benchmarks.collectives.phases import timeline

MIB = 1 << 20
STEPS: list[tuple[object, str]] = [
    (_host_copy.HostCopy, "_compress"),
    (_host_copy.HostCopy, "_copy_guessed"),
    (_host_copy.HostCopy, "_settle"),
    (_host_copy.HostCopy, "_load"),
    (_host_copy.HostCopy, "_load_piece"),
    (_host_copy._Piece, "read_header"),
    (_host_pool.HostPool, "alloc"),
    (_host_pool.HostPool, "trim"),
    (_host_copy, "compress_into"),
    (_host_copy, "decompress"),
]


def labelled() -> None:
    """Wrap each step in a profiler range named after it (looked up at call time)."""

    def wrap(name: str, fn: Callable[..., object]) -> Callable[..., object]:
        def run(*a: object, **kw: object) -> object:
            with record_function(name):
                return fn(*a, **kw)

        return run

    for owner, name in STEPS:
        label = f"zipccl.{getattr(owner, '__name__', '?').rsplit('.', 1)[-1]}.{name}"
        setattr(owner, name, wrap(label, getattr(owner, name)))


def sync() -> None:
    torch.cuda.synchronize()


def round_trip(x: torch.Tensor, reps: int, **kw: object) -> dict:
    """Median seconds down (offload_tensor, then wait) and up (load, then synchronize)."""
    downs, ups = [], []
    for rep in range(reps + 1):
        sync()
        t0 = time.perf_counter()
        copy = zipccl.offload_tensor(x, **kw)  # type: ignore[arg-type]
        copy.wait()
        t1 = time.perf_counter()
        y = copy.load()
        sync()
        t2 = time.perf_counter()
        assert torch.equal(y, x)
        if rep:
            downs.append(t1 - t0)
            ups.append(t2 - t1)
        del copy, y
    return {"down_s": statistics.median(downs), "up_s": statistics.median(ups)}


def plain(x: torch.Tensor, reps: int) -> dict:
    pinned = torch.empty(x.shape, dtype=x.dtype, pin_memory=True)
    back = torch.empty_like(x)

    def timed(fn: Callable[[], object]) -> float:
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        return time.perf_counter() - t0

    downs = [timed(lambda: pinned.copy_(x, non_blocking=True)) for _ in range(reps + 1)][1:]
    ups = [timed(lambda: back.copy_(pinned, non_blocking=True)) for _ in range(reps + 1)][1:]
    return {"down_s": statistics.median(downs), "up_s": statistics.median(ups)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--chunks-mib", type=int, nargs="+", default=[64, 32, 16])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(args.mib * MIB // 2, dtype=torch.bfloat16, device="cuda", generator=gen)
    rows = {"plain": plain(x, args.reps)}
    for mib in args.chunks_mib:
        rows[f"compressed_{mib}"] = round_trip(x, args.reps, chunk_bytes=mib * MIB)
        rows[f"raw_{mib}"] = round_trip(x, args.reps, compress=False, chunk_bytes=mib * MIB)
    base = rows["plain"]
    for name, row in rows.items():
        gbs = {w: x.numel() * 2 / row[f"{w}_s"] / 1e9 for w in ("down", "up")}
        row.update({f"{w}_gbs": v for w, v in gbs.items()})
        row.update({f"{w}_x_plain": base[f"{w}_s"] / row[f"{w}_s"] for w in ("down", "up")})
        print(
            f"{name:>15}: down {gbs['down']:.1f} GB/s ({row['down_x_plain']:.3f}x), "
            f"up {gbs['up']:.1f} GB/s ({row['up_x_plain']:.3f}x)",
            flush=True,
        )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "offload-chunks.json").write_text(json.dumps(rows, indent=1))

    labelled()
    round_trip(x, 1)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            sync()
            with record_function("zipccl.call"):
                copy = zipccl.offload_tensor(x)
                copy.wait()
            with record_function("zipccl.call"):
                y = copy.load()
                sync()
            del copy, y
    path = args.out / "offload-trace.json"
    prof.export_chrome_trace(str(path))
    chrome = json.loads(path.read_text())
    calls = sorted(
        (
            e
            for e in chrome["traceEvents"]
            if e.get("name") == "zipccl.call"
            and e.get("ph") == "X"
            and e.get("cat") != "gpu_user_annotation"
        ),
        key=lambda e: e["ts"],
    )
    for which, call in (("down", calls[-2]), ("up", calls[-1])):
        print(f"--- {which}: {call['dur']:.0f} us", flush=True)
        print(timeline(chrome, at=call["ts"], min_runtime_us=0), flush=True)


if __name__ == "__main__":
    main()
