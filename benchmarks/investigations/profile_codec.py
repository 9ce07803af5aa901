"""Where a public call's GPU time goes, kernel by kernel, and single calls for ncu to attach to.

    # torch.profiler: mean µs per call and kernel
    python benchmarks/investigations/profile_codec.py --mib 1
    ncu --clock-control none -k regex:'theory|staircase|encode|finish|decode' \
        python benchmarks/investigations/profile_codec.py --mib 256 --once

Cases: benchmarks/calls.py's tensors (N(0,1); FP8 absmax-scaled), BF16 and FP8 e4m3 unless
``--dtypes`` names others, ``compress(x)`` with its default table (built on the device) and
``decompress(c, out=y, sync=False)``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: calls, timing, codec

import torch
import zipccl
from calls import make
from timing import MIB

DTYPES = "bfloat16,float8_e4m3fn"


def round_trip(x: torch.Tensor, y: torch.Tensor) -> None:
    zipccl.decompress(zipccl.compress(x), out=y, sync=False)


def kernel_times(x: torch.Tensor, calls: int) -> dict[str, float]:
    """Mean device µs per round trip of each kernel (and memset) the calls launch."""
    y = torch.empty_like(x)
    round_trip(x, y)  # build the kernels and the plan outside the trace
    torch.cuda.synchronize()
    activities = [torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(calls):
            round_trip(x, y)
        torch.cuda.synchronize()
    zipccl.check_errors()
    times = {}
    for event in prof.key_averages():
        total = getattr(event, "device_time_total", 0) or getattr(event, "cuda_time_total", 0)
        if total > 0 and event.count >= calls:
            times[event.key] = total / calls
    return times


def main() -> None:
    ap = argparse.ArgumentParser(
        prog="python benchmarks/investigations/profile_codec.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--mib", type=float, default=1.0, help="tensor size in MiB")
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--once", action="store_true", help="one round trip per case (for ncu)")
    ap.add_argument("--dtypes", default=DTYPES, help=f"torch dtype names (default {DTYPES})")
    args = ap.parse_args()
    for dtype in (getattr(torch, name) for name in args.dtypes.split(",")):
        x = make(dtype, int(args.mib * MIB))
        if args.once:
            y = torch.empty_like(x)
            round_trip(x, y)
            torch.cuda.synchronize()
            assert torch.equal(y.view(torch.uint8), x.view(torch.uint8))
            continue
        times = kernel_times(x, args.calls)
        print(f"{dtype} {args.mib} MiB: {sum(times.values()):.1f} µs of device time per round trip")
        for name, us in sorted(times.items(), key=lambda kv: -kv[1]):
            print(f"  {us:8.2f} µs  {name[:110]}")


if __name__ == "__main__":
    main()
