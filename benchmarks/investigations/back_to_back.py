"""Back-to-back compress calls: what a loop of them sustains, and where the time between calls goes.

    python benchmarks/investigations/back_to_back.py --out OUT
        [--cases bfloat16:1,bfloat16:16,float8_e4m3fn:16] [--trace]

Per case (dtype:MiB, N(0,1), FP8 absmax-scaled as in calls.py), the time per call of 20
back-to-back ``zipccl.compress(x)`` (calls.py's per_call) three ways: results kept alive (20
buffers at fresh addresses: ``keep_us``), each dropped before the next call (the caching
allocator hands the same buffer back: ``drop_us``), and ``compress_into`` one preallocated buffer
(``into_us``); and the host's own time to issue one call inside such a loop (``issue_us``: when it
is close to the time per call, the host is the bound). ``--trace`` records the kept-alive loop with
torch.profiler (CUPTI sees the kernels a CUDA graph launches) and reports, per call, the span
from the table kernel's start to the finish kernel's end (``span_us``, the device chain as the loop
runs it), the idle time between one call's finish kernel and the next call's table kernel
(``gap_us``; both medians over the calls after the first, whose table kernel follows the warm-up
rather than a call of the loop), and the median host time of each CUDA API call the loop made.
Output: stdout and OUT/back_to_back.json (and the traces, OUT/trace_*.json).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: calls, timing, codec

import torch
import zipccl
from calls import BATCH, make, per_call
from timing import MIB


def issue_time(fn, runs: int = 15) -> float:
    """Median host seconds per call to issue BATCH calls of ``fn`` back to back."""
    times = []
    for _ in range(runs):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        kept = [fn() for _ in range(BATCH)]
        times.append((time.perf_counter() - t0) / BATCH)
        del kept
    return statistics.median(times)


def traced(fn, path: Path) -> dict:
    """Per-call device spans, gaps and API host times of BATCH kept-alive calls of ``fn``."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        kept = [fn() for _ in range(BATCH)]
        torch.cuda.synchronize()
    del kept
    prof.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    kernels = sorted((e for e in events if e.get("cat") == "kernel"), key=lambda e: e["ts"])
    firsts = [e for e in kernels if "theory_kernel" in e["name"] or "staircase_kernel" in e["name"]]
    lasts = [e for e in kernels if "finish_kernel" in e["name"]]
    spans = [b["ts"] + b["dur"] - a["ts"] for a, b in zip(firsts, lasts, strict=False)]
    gaps = [b["ts"] - (a["ts"] + a["dur"]) for a, b in zip(lasts, firsts[1:], strict=False)]
    api: dict[str, list[float]] = {}
    for e in events:
        if e.get("cat") in ("cuda_runtime", "cuda_driver"):
            api.setdefault(e["name"], []).append(e["dur"])

    def median(values: list[float]) -> float | None:
        return round(statistics.median(values[1:]), 2) if len(values) > 1 else None

    return {
        "span_us": median(spans),
        "gap_us": median(gaps),
        "spans_us": [round(s, 2) for s in spans],
        "api_us": {name: (len(t), round(statistics.median(t), 2)) for name, t in api.items()},
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        prog="python benchmarks/investigations/back_to_back.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--cases", default="bfloat16:1,bfloat16:16,float8_e4m3fn:16")
    ap.add_argument("--trace", action="store_true", help="torch.profiler trace of one loop")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/investigations/results"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for case in args.cases.split(","):
        dtype_name, mib = case.split(":")
        x = make(getattr(torch, dtype_name), int(float(mib) * MIB))
        out = torch.empty(
            zipccl.max_compressed_bytes(x.dtype, x.numel()), dtype=torch.uint8, device=x.device
        )
        row: dict[str, object] = {"dtype": dtype_name, "MiB": float(mib)}
        row["keep_us"] = per_call(lambda x=x: zipccl.compress(x), keep=True) * 1e6
        row["drop_us"] = per_call(lambda x=x: zipccl.compress(x)) * 1e6
        row["into_us"] = per_call(lambda x=x, out=out: zipccl.compress_into(x, out)) * 1e6
        row["issue_us"] = issue_time(lambda x=x: zipccl.compress(x)) * 1e6
        if args.trace:
            trace = args.out / f"trace_{dtype_name}_{mib}.json"
            row |= traced(lambda x=x: zipccl.compress(x), trace)
        rows.append(row)
        print(json.dumps(row), flush=True)
    doc = {"device": torch.cuda.get_device_name(), "rows": rows}
    (args.out / "back_to_back.json").write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
