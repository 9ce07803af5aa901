"""Where one compress call's device time goes: a timeline of its three kernels.

    python benchmarks/investigations/timeline.py [--sizes 1,16]
        [--dtypes bfloat16,float8_e4m3fn] [--flush] [--out OUT]

A copy of csrc/ gets globaltimer stamps at named points of the table, encode and finish kernels
(STAMPS: the source line each follows or precedes; the copy is refused if one is missing, so the
probe cannot drift from the kernels unnoticed -- tests/test_timeline_benchmark.py checks them on
CPU). zipccl then runs on that build: after warm-up calls, each of 15 calls of
``zipccl.compress(x)`` on an idle device records, per point, the earliest (``min``) or latest
(``max``) time any CTA's thread 0 passed it, and the medians, in µs after the table kernel's first
CTA started (FP8: after the encode kernel's first CTA, its table kernel has no stamp), go to
stdout and OUT/timeline.json. The kernels' launches overlap (programmatic dependent launch), so
these are the times the user's stream sees; the stamps themselves cost well under a microsecond.
``--flush`` writes 256 MiB before each call, so that the call finds none of its tensor in L2 (as
a call on data another kernel just evicted does); without it, the previous call left it there.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import shutil
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

CSRC = Path(__file__).resolve().parents[2] / "sw" / "zipccl" / "csrc"
SLOTS = 32
S, E = "sample.cuh", "encode.cuh"


@dataclass(frozen=True)
class Stamp:
    """One timeline point: in `file`, ``STAMP_<kind>(slot)`` on a line of its own before the line
    where `anchor` starts, or after the line where it ends."""

    slot: int
    name: str
    file: str
    anchor: str
    after: bool = True
    kind: str = "MAX"  # MIN: the first CTA to pass; MAX: the last
    header_cta: bool = False  # only finish_kernel's header CTA stamps it


# (slot, name, file, anchor, after, kind, header CTA only)
STAMPS = [
    Stamp(
        0,
        "table: first CTA in",
        S,
        "  zero_counts(counts, count_words);\n  const Sums",
        False,
        "MIN",
    ),
    Stamp(
        1, "table: last CTA sampled", S, "const Sums mine = cta_slot_sums<F>(in, stride, count);"
    ),
    Stamp(2, "table: last CTA takes its ticket", S, "the other CTAs' sums are visible"),
    Stamp(3, "table: sums added", S, "  const bool spread = sigma > 0.0", False),
    Stamp(4, "table: top 7 bins", S, "theory_top(p, s_tb + 10);"),
    Stamp(
        5,
        "table: published (end)",
        S,
        "}\n\n// ------------------------------------------------",
        False,
    ),
    Stamp(
        6, "encode: first CTA in", E, "wait_for_predecessor();  // the table kernel's", False, "MIN"
    ),
    Stamp(7, "encode: last CTA past its wait", E, "wait_for_predecessor();  // the table kernel's"),
    Stamp(8, "encode: header stage sealed", E, "seal_stage(head_to_hash, s_lut, !F::BYTE_CODED);"),
    Stamp(
        9, "encode: last warp's rounds done", E, "const uint32_t nbytes = (bits + 7u) >> 3;", False
    ),
    Stamp(10, "encode: last CTA end", E, "  sum.commit(work.sum);\n}", False),
    Stamp(
        11, "finish: first CTA past its wait", E, "// the encoder's sums, counts and", True, "MIN"
    ),
    Stamp(
        12,
        "finish: payload size summed",
        E,
        "  cta_scan(all, all);\n  const bool raw",
        True,
        "MAX",
        True,
    ),
    Stamp(13, "finish: header written", E, "if (head) write_header(out, L, split_bytes, all,"),
    Stamp(14, "finish: last CTA end", E, "}\n\n// A tensor too small", False),
]

PRELUDE = r"""
#include <cstdint>
#include <cuda_runtime.h>
__device__ unsigned long long g_stamp[@SLOTS@];
__device__ __forceinline__ unsigned long long zipccl_now() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
#define STAMP_MAX(k) do { if (threadIdx.x == 0) atomicMax(&g_stamp[k], zipccl_now()); } while (0)
#define STAMP_MIN(k) do { if (threadIdx.x == 0) atomicMin(&g_stamp[k], zipccl_now()); } while (0)
extern "C" int timeline_reset(const unsigned long long* init) {
  return cudaMemcpyToSymbol(g_stamp, init, sizeof g_stamp);
}
extern "C" int timeline_read(unsigned long long* out) {
  return cudaMemcpyFromSymbol(out, g_stamp, sizeof g_stamp);
}
""".replace("@SLOTS@", str(SLOTS))


def patch(src: Path, dst: Path) -> Path:
    """Copy of the csrc/ folder ``src`` at ``dst`` with the stamps; returns its codec.cu.
    ValueError naming the anchor where one is not found exactly once."""
    shutil.copytree(src, dst)
    for stamp in STAMPS:
        path = dst / stamp.file
        text = path.read_text()
        if text.count(stamp.anchor) != 1:
            raise ValueError(f"{stamp.file}: anchor of {stamp.name!r} not found exactly once")
        guard = "if (blockIdx.x == gridDim.x - 1) " if stamp.header_cta else ""
        mark = f"  {guard}STAMP_{stamp.kind}({stamp.slot});\n"
        at = text.index(stamp.anchor)
        if stamp.after:
            end = at + len(stamp.anchor)
            cut = end if text[end - 1] == "\n" else text.index("\n", end) + 1
        else:
            cut = text.rindex("\n", 0, at) + 1 if at else 0
        text = text[:cut] + mark + text[cut:]
        path.write_text(text)
    codec = dst / "codec.cu"
    codec.write_text(PRELUDE + codec.read_text())
    return codec


def timeline(lib: ctypes.CDLL, call, calls: int = 15) -> dict[str, float]:
    """Median µs of each stamped point over ``calls`` isolated calls of ``call``."""
    init = (ctypes.c_ulonglong * SLOTS)(
        *[(1 << 64) - 1 if s < len(STAMPS) and STAMPS[s].kind == "MIN" else 0 for s in range(SLOTS)]
    )
    seen: dict[int, list[float]] = {s.slot: [] for s in STAMPS}
    for _ in range(calls):
        torch.cuda.synchronize()
        lib.timeline_reset(init)
        torch.cuda.synchronize()
        call()
        torch.cuda.synchronize()
        got = (ctypes.c_ulonglong * SLOTS)()
        lib.timeline_read(got)
        start = got[0] if got[0] != (1 << 64) - 1 else got[6]
        for s in STAMPS:
            if got[s.slot] not in (0, (1 << 64) - 1):
                seen[s.slot].append((got[s.slot] - start) / 1e3)
    rows = {s.name: statistics.median(seen[s.slot]) for s in STAMPS if seen[s.slot]}
    return dict(sorted(rows.items(), key=lambda kv: kv[1]))


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python benchmarks/investigations/timeline.py", description=__doc__
    )
    parser.add_argument("--sizes", default="1,16", help="MiB, comma-separated")
    parser.add_argument("--dtypes", default="bfloat16,float8_e4m3fn")
    parser.add_argument("--flush", action="store_true", help="evict L2 before each call")
    parser.add_argument("--out", type=Path, help="folder for timeline.json")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: calls, timing
    import zipccl
    from calls import make
    from timing import MIB
    from zipccl import _cuda

    work = Path(tempfile.mkdtemp(prefix="zipccl-timeline-"))
    _cuda.SOURCE = patch(CSRC, work / "csrc")
    _cuda.CSRC = _cuda.SOURCE.parent
    lib = _cuda._lib()
    if lib is None:
        sys.exit("the patched kernels did not build")
    lib.timeline_reset.argtypes = lib.timeline_read.argtypes = [ctypes.c_void_p]
    scrub = torch.empty(256 * MIB, dtype=torch.uint8, device="cuda") if args.flush else None
    results = []
    for dtype_name in args.dtypes.split(","):
        for mib in map(float, args.sizes.split(",")):
            x = make(getattr(torch, dtype_name), int(mib * MIB))
            for _ in range(10):
                zipccl.compress(x)

            def call(x: torch.Tensor = x) -> None:
                if scrub is not None:
                    scrub.zero_()
                zipccl.compress(x)

            rows = timeline(lib, call)
            results.append({"dtype": dtype_name, "MiB": mib, "us": rows})
            print(f"{dtype_name} {mib:g} MiB")
            for name, at in rows.items():
                print(f"    {name:34s} {at:7.2f}")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        doc = {"device": torch.cuda.get_device_name(), "flush": args.flush, "rows": results}
        (args.out / "timeline.json").write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
