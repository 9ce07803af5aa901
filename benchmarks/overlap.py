"""The codec beside a compute-bound GEMM on another stream: does the pair take less time than the
two run one after the other?

    python benchmarks/overlap.py --out OUT [--dtypes bfloat16,float8_e4m3fn,float8_e5m2,...]
                                 [--mib 128] [--gemms 8] [--calls 10] [--runs 10]

Per dtype: ``--gemms`` BF16 8192 x 8192 matmuls on one stream, and on another ``--calls``
back-to-back ``zipccl.compress(x)`` of ``--mib`` MiB (N(0,1); FP8 absmax-scaled, as
benchmarks/calls.py makes them), then the same with ``decompress(c, out=y, sync=False)``: each
alone, then both started together, the three interleaved in every run so that a drift of the
GPU's clocks over the run (a GEMM this size runs near the card's power limit) reaches all three
alike. ``sequential_ms`` is the sum of the two alone; ``overlap`` the share of the shorter one
hidden behind the other (1: fully hidden, 0: none, below 0: the pair is slower than running them
one after the other), the median of the runs' own overlaps. Times: medians of ``--runs``, CUDA
events on the current stream, which both streams wait on and then join. Writes OUT/overlap.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable
from pathlib import Path

import torch
import zipccl
from calls import make
from timing import MIB, recorded

GEMM_N = 8192
WARMUP = 2
Job = tuple[torch.cuda.Stream, Callable[[], object]]


def once(jobs: list[Job]) -> float:
    """Seconds from a common start until every job (a function queued on its own stream) has
    ended."""
    main = torch.cuda.current_stream()
    start = recorded()
    for stream, _ in jobs:
        stream.wait_stream(main)
    for stream, fn in jobs:
        with torch.cuda.stream(stream):
            fn()
    for stream, _ in jobs:
        main.wait_stream(stream)
    end = recorded()
    end.synchronize()
    return start.elapsed_time(end) / 1e3


def pair_row(gemm: Job, codec: Job, runs: int) -> dict[str, float]:
    """The GEMMs alone, the codec alone and both together, interleaved run by run, in ms (medians),
    and the runs' overlaps: median, least and most."""
    cases = ([gemm], [codec], [gemm, codec])
    for _ in range(WARMUP):
        for jobs in cases:
            once(jobs)
    runs_s = [[once(jobs) for jobs in cases] for _ in range(runs)]  # per run: gemm, codec, both
    overlaps = [(g + c - b) / min(g, c) for g, c, b in runs_s]
    gemm_s, codec_s, both_s = (statistics.median(col) for col in zip(*runs_s, strict=True))
    return {
        "gemm_ms": gemm_s * 1e3,
        "alone_ms": codec_s * 1e3,
        "with_gemm_ms": both_s * 1e3,
        "sequential_ms": (gemm_s + codec_s) * 1e3,
        "overlap": statistics.median(overlaps),
        "overlap_min": min(overlaps),
        "overlap_max": max(overlaps),
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        prog="python benchmarks/overlap.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--dtypes", default="bfloat16,float8_e4m3fn,float8_e5m2,float16,float32")
    ap.add_argument("--mib", type=float, default=128.0, help="the codec's tensor, MiB")
    ap.add_argument("--gemms", type=int, default=8, help="BF16 8192^3 matmuls on the GEMM stream")
    ap.add_argument("--calls", type=int, default=10, help="codec calls on the codec stream")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--out", default="benchmarks/results/codec")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    a = torch.randn(GEMM_N, GEMM_N, device="cuda", dtype=torch.bfloat16)
    b = torch.randn_like(a)
    product = torch.empty_like(a)

    def gemms() -> None:
        for _ in range(args.gemms):
            torch.matmul(a, b, out=product)

    gemm: Job = (torch.cuda.Stream(), gemms)
    codec_stream = torch.cuda.Stream()
    rows = []
    for name in args.dtypes.split(","):
        x = make(getattr(torch, name), int(args.mib * MIB))
        c = zipccl.compress(x)
        y = torch.empty_like(x)

        def compress(x: torch.Tensor = x) -> None:
            for _ in range(args.calls):
                zipccl.compress(x)

        def decompress(c: zipccl.Compressed = c, y: torch.Tensor = y) -> None:
            for _ in range(args.calls):
                zipccl.decompress(c, out=y, sync=False)

        row: dict[str, object] = {"dtype": name, "MiB": args.mib, "calls": args.calls}
        row["compress"] = pair_row(gemm, (codec_stream, compress), args.runs)
        row["decompress"] = pair_row(gemm, (codec_stream, decompress), args.runs)
        zipccl.check_errors()
        torch.cuda.synchronize()
        row["roundtrip_ok"] = torch.equal(y.view(torch.uint8), x.view(torch.uint8))
        rows.append(row)
        print(json.dumps(row), flush=True)
        (out / "overlap.json").write_text(
            json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1)
        )
        del x, c, y
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
