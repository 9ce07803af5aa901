"""A mutation sweep: single-bit flips of compressed buffers, with and without ``checksum=True``.

    python benchmarks/integrity.py [--device cuda] [--flips 2000] [--out OUT]

Per dtype (N(0,1)·3, FP8 with its fitted table, 200,003 values): ``--flips`` seeded single-bit
flips of the body (every byte after the header, whose CRC-32 covers itself), each decoded by
``zipccl.decompress`` (``sync=True``) from the compressed object; counted as *rejected*
(ValueError), *silent* (decoded to other values, unnoticed) or *harmless* (decoded to the same
values). Prints a JSON row per dtype and writes ``integrity.json`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
import zipccl
from zipccl.golden.container import HEADER_BYTES

DTYPES = [torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn, torch.float8_e5m2]
SEED = 20261202


def sweep(c: zipccl.Compressed, x: torch.Tensor, flips: int) -> dict[str, int]:
    """Flip, decode, undo: what became of each flip."""
    rng = np.random.default_rng(SEED)
    where = rng.integers(HEADER_BYTES, c.nbytes, flips).tolist()
    bits = rng.integers(0, 8, flips).tolist()
    counts = {"rejected": 0, "silent": 0, "harmless": 0}
    want = x.reshape(-1).view(torch.uint8)
    for at, bit in zip(where, bits, strict=True):
        c._storage[at] ^= 1 << bit
        try:
            y = zipccl.decompress(c)
        except ValueError:
            counts["rejected"] += 1
        else:
            same = torch.equal(y.reshape(-1).view(torch.uint8), want)
            counts["harmless" if same else "silent"] += 1
        c._storage[at] ^= 1 << bit
    return counts


def main() -> None:
    ap = argparse.ArgumentParser(
        prog="python benchmarks/integrity.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--device", default="cuda", help="where to compress and decode (cuda, cpu)")
    ap.add_argument("--flips", type=int, default=2000, help="flips per dtype and mode")
    ap.add_argument("--out", default="benchmarks/results", help="folder for integrity.json")
    args = ap.parse_args()
    rows = []
    for dtype in DTYPES:
        gen = torch.Generator().manual_seed(SEED)
        x = (torch.randn(200_003, generator=gen) * 3.0).to(dtype).to(args.device)
        table = "histogram" if dtype.itemsize == 1 else None
        row: dict[str, object] = {"dtype": str(dtype).removeprefix("torch."), "flips": args.flips}
        for checksum in (False, True):
            c = zipccl.compress(x, table, checksum=checksum)
            row["checksum" if checksum else "plain"] = sweep(c, x, args.flips)
        rows.append(row)
        print(json.dumps(row), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "integrity.json").write_text(json.dumps({"device": args.device, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
