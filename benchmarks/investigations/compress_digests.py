"""An encoder change's A/B in two builds: the compressed bytes' digests and compress throughput.

    python benchmarks/investigations/compress_digests.py OUT.json   # on main, then on the change
    python benchmarks/investigations/compress_digests.py --compare A.json B.json

Every dtype at 1, 4097, 12305, 1 Mi and 24 Mi values (benchmarks/calls.py's tensors: N(0,1), FP8
absmax-scaled), with and without the values checksum: a change that claims the same bytes must
give the same SHA-256 for all 50. Then ``compress(x)`` of 256 MiB per dtype, GB/s of input
(calls.py's back-to-back loop). Give each build its own ``ZIPCCL_CACHE_DIR``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: calls, timing

import torch
import zipccl
from calls import make, per_call

DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn, torch.float8_e5m2)
COUNTS = (1, 4097, 12305, 1 << 20, 24 << 20)


def measure() -> dict:
    """Digests by case, compress GB/s by dtype, and the first call's time (the build)."""
    start = time.perf_counter()
    zipccl.compress(make(torch.bfloat16, 4096))
    torch.cuda.synchronize()
    doc: dict = {"first_call_s": time.perf_counter() - start, "digests": {}, "compress_GBps": {}}
    for dtype in DTYPES:
        for n in COUNTS:
            x = make(dtype, n * dtype.itemsize)
            for checksum in (False, True):
                blob = zipccl.compress(x, checksum=checksum).to_bytes()
                doc["digests"][f"{dtype}-{n}-{checksum}"] = hashlib.sha256(blob).hexdigest()
        x = make(dtype, 256 << 20)
        doc["compress_GBps"][str(dtype)] = x.nbytes / per_call(lambda x=x: zipccl.compress(x)) / 1e9
    return doc


def compare(a: dict, b: dict) -> str:
    """Which cases' bytes differ, and each dtype's throughput in both."""
    differ = [k for k in a["digests"] if a["digests"][k] != b["digests"].get(k)]
    lines = [f"bytes differ in {len(differ)} of {len(a['digests'])} cases: {differ or 'none'}"]
    speeds = b["compress_GBps"].items()
    lines += [f"{k}: {a['compress_GBps'][k]:.0f} -> {v:.0f} GB/s" for k, v in speeds]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", nargs="?", type=Path, help="write this build's figures here")
    ap.add_argument("--compare", nargs=2, type=Path, metavar=("A", "B"))
    args = ap.parse_args()
    if args.compare:
        print(compare(*(json.loads(p.read_text()) for p in args.compare)))
    elif args.out:
        args.out.write_text(json.dumps(measure(), indent=1))
    else:
        ap.error("give OUT.json or --compare A B")


if __name__ == "__main__":
    main()
