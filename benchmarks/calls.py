"""The public calls as a user makes them, side by side with DietGPU in the same process.

    python benchmarks/calls.py --out OUT [--sizes 0.0625,1,4,16,64,256,1024] [--dietgpu SO]
                               [--checksum]

Per size and dtype (N(0,1); FP8 absmax-scaled): ``zipccl.compress(x)`` with its default table,
``decompress(c, out=y)`` with ``sync=False`` (the hot path) and with ``sync=True`` (validated before
returning), DietGPU's compress/decompress of the same tensor (BF16: its float codec; FP8: its ANS
byte codec; checksum off, preallocated buffers), optionally nvCOMP ANS (``--nvcomp``,
benchmarks/codec.py's timing) and a device copy of the same bytes (the floor). ``per call``: CUDA
events around 20 back-to-back calls, divided by 20 (what a loop of calls sustains), median of runs.
Each call's result is dropped before the next call, so ``compress`` gets its buffer back from
torch's caching allocator, as DietGPU writes into the same preallocated buffers every call;
``compress_kept`` keeps the 20 results alive (20 buffers written at fresh addresses, about 3 µs
more per call at 16 MiB on an H200: the caches and TLB see new memory).
``host``: the call's own time on the host, from entry to return, after the device went idle, median
of 200. ``gpu``: the call replayed from a CUDA graph (its kernels alone). ``--checksum`` adds the
same calls with ``checksum=True`` (keys ``ck_...``) and DietGPU with its checksum on
(``dietgpu_ck_...``).
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
from codec import nvcomp_row
from timing import MIB, event_median, graph_median

BATCH = 20


def per_call(fn: Callable[[], object], runs: int = 15, keep: bool = False) -> float:
    """Seconds per call of ``fn`` issued back to back (CUDA events around BATCH calls); each
    result is dropped before the next call unless ``keep``."""

    def batch() -> object:
        if keep:
            return [fn() for _ in range(BATCH)]
        for _ in range(BATCH):
            fn()
        return None

    return event_median(batch, runs) / BATCH


def host_time(fn: Callable[[], object], runs: int = 200) -> float:
    """Median seconds from entry to return of ``fn`` with an idle device."""
    times = []
    for _ in range(runs):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def make(dtype: torch.dtype, nbytes: int) -> torch.Tensor:
    """N(0,1) values; FP8 absmax-scaled (max |x| at the format's largest finite value), the
    usual FP8 recipe."""
    n = nbytes // torch.tensor([], dtype=dtype).element_size()
    gen = torch.Generator(device="cuda").manual_seed(nbytes)
    x = torch.randn(n, device="cuda", generator=gen)
    if dtype.itemsize == 1:
        x *= torch.finfo(dtype).max / x.abs().max()
    return x.to(dtype)


def zipccl_row(x: torch.Tensor, checksum: bool = False) -> dict[str, float | bool | str]:
    c = zipccl.compress(x, checksum=checksum)
    y = torch.empty_like(x)
    zipccl.decompress(c, out=y)
    ok = torch.equal(y.view(torch.uint8), x.view(torch.uint8))
    row: dict[str, float | bool | str] = {"ratio": c.ratio, "layout": c.layout, "roundtrip_ok": ok}
    calls = {
        "compress": lambda: zipccl.compress(x, checksum=checksum),
        "decompress": lambda: zipccl.decompress(c, out=y, sync=False),
        "decompress_sync": lambda: zipccl.decompress(c, out=y),
    }
    for name, fn in calls.items():
        row[f"{name}_us"] = per_call(fn) * 1e6
        row[f"{name}_host_us"] = host_time(fn) * 1e6
    row["compress_kept_us"] = per_call(calls["compress"], keep=True) * 1e6
    row["compress_gpu_us"] = graph_median(calls["compress"], 20) * 1e6
    row["decompress_gpu_us"] = graph_median(calls["decompress"], 20) * 1e6
    zipccl.check_errors()
    if checksum:
        return {f"ck_{key}": value for key, value in row.items()}
    row["copy_us"] = per_call(lambda: y.copy_(x)) * 1e6
    return row


class DietGPU:
    """DietGPU's torch ops with preallocated buffers (its fast path: checksum off)."""

    def __init__(self, library: str) -> None:
        torch.ops.load_library(library)
        self.ops = torch.ops.dietgpu

    def row(self, x: torch.Tensor, checksum: bool = False) -> dict[str, float | bool]:
        as_float = x.element_size() > 1  # FP8: its byte (ANS) codec on the bytes
        data = x if as_float else x.view(torch.uint8)
        size_of = (
            self.ops.max_float_compressed_output_size
            if as_float
            else self.ops.max_any_compressed_output_size
        )
        rows, cols = size_of([data])
        comp = torch.empty([rows, cols], dtype=torch.uint8, device="cuda")
        sizes = torch.zeros([1], dtype=torch.int, device="cuda")
        out = torch.empty_like(data)
        status = torch.empty([1], dtype=torch.uint8, device="cuda")
        nbytes = x.numel() * x.element_size()  # its scratch: 512 MiB is too little past 256 MiB
        self.temp = torch.empty(max(512 * MIB, 2 * nbytes), dtype=torch.uint8, device="cuda")
        words = torch.empty([1], dtype=torch.int32, device="cuda")

        def compress() -> None:
            self.ops.compress_data(as_float, [data], checksum, self.temp, comp, sizes)

        def decompress() -> None:
            self.ops.decompress_data(as_float, [comp[0]], [out], checksum, self.temp, status, words)

        compress()
        decompress()
        ok = torch.equal(out.view(torch.uint8), data.view(torch.uint8))
        tag = "dietgpu_ck" if checksum else "dietgpu"
        return {
            f"{tag}_ratio": int(sizes.item()) / (x.numel() * x.element_size()),
            f"{tag}_roundtrip_ok": ok,
            f"{tag}_compress_us": per_call(compress) * 1e6,
            f"{tag}_decompress_us": per_call(decompress) * 1e6,
        }


def main() -> None:
    ap = argparse.ArgumentParser(
        prog="python benchmarks/calls.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--sizes", default="0.0625,1,4,16,64,256,1024", help="MiB, comma separated")
    ap.add_argument("--dtypes", default="bfloat16,float8_e4m3fn")
    ap.add_argument("--dietgpu", default="", help="DietGPU's built torch-ops library (.so)")
    ap.add_argument("--nvcomp", action="store_true", help="nvCOMP ANS on the same tensors too")
    ap.add_argument(
        "--checksum", action="store_true", help="also with checksum=True (DietGPU: its checksum)"
    )
    ap.add_argument("--out", default="benchmarks/results/codec")
    args = ap.parse_args()
    diet = DietGPU(args.dietgpu) if args.dietgpu else None
    rows = []
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for dtype in (getattr(torch, d) for d in args.dtypes.split(",")):
        for mib in (float(s) for s in args.sizes.split(",")):
            x = make(dtype, int(mib * MIB))
            row = {"dtype": str(dtype).removeprefix("torch."), "MiB": mib} | zipccl_row(x)
            if args.checksum:
                row |= zipccl_row(x, checksum=True)
            if args.nvcomp:  # its own timing (wall clock around device syncs): see codec.py
                row |= nvcomp_row(x, 10)
            if diet is not None:
                try:
                    row |= diet.row(x)
                    if args.checksum:
                        row |= diet.row(x, checksum=True)
                except Exception as exc:  # a failing baseline must not stop the sweep
                    row["dietgpu_error"] = repr(exc)
            rows.append(row)
            print(json.dumps(row), flush=True)
            (out / "calls.json").write_text(
                json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1)
            )
            del x
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
