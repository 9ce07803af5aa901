"""``python -m zipccl.sim`` (``nox -s sim``): the cocotb suite on the generated Verilog of the
encoder, the decoder and the encoder->decoder loopback, over the built-in MiniLM data set.

Also the multi-lane blocks (encoder x2/x4/x8/x32, decoder and loopback x2/x4/x8). Prints
symbols checked, cycles (or symbols) per clock per code length and on the data set, compression
ratios and PASS/FAIL; exits 1 on any mismatch against golden/, 2 when Icarus is missing.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from zipccl.sim.runner import INSTALL_HINT, SimFailure, have_icarus, run_cocotb
from zipccl.sim.suite import LEVELS, TOPS, summary_lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m zipccl.sim", description=__doc__.splitlines()[0])
    ap.add_argument(
        "--level",
        choices=["auto", *LEVELS],
        default="auto",
        help="auto: full, but quick for the 2- and 4-lane decoders, smoke for the 8-lane decoder "
        "and the multi-lane loopbacks",
    )
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--tops", nargs="+", choices=list(TOPS), default=list(TOPS))
    ap.add_argument("--build", type=Path, default=Path("build/sim"))
    args = ap.parse_args(argv)
    if not have_icarus():
        print(INSTALL_HINT, file=sys.stderr)
        return 2
    reports, failures = [], []
    start = time.monotonic()
    print(
        f"zipccl RTL simulation: {len(args.tops)} blocks, cocotb + Icarus Verilog against "
        f"golden/, seed {args.seed}; simulator logs in {args.build}/<block>/cocotb.log",
        flush=True,
    )
    for k, top in enumerate(args.tops, 1):
        level = args.level
        if level == "auto":
            level = TOPS[top].auto
        began = time.monotonic()
        print(f"[{k}/{len(args.tops)}] {top} ({level}) ...", end=" ", flush=True)
        try:
            reports.append(run_cocotb(top, level, args.seed, args.build, quiet=True))
            print(
                f"PASS, {reports[-1]['symbols']} symbols, {time.monotonic() - began:.0f} s",
                flush=True,
            )
        except SimFailure as exc:
            failures.append(str(exc))
            print("FAIL", flush=True)
    print("\n==== zipccl RTL simulation (cocotb + Icarus Verilog vs golden/) ====")
    print(
        f"level {args.level}, seed {args.seed}, {time.monotonic() - start:.0f} s; "
        "ratio = stream bits / (8 x symbols)"
    )
    print("\n".join(summary_lines(reports)))
    total = sum(r["symbols"] for r in reports)
    for f in failures:
        print(f"FAIL: {f}")
    print(f"{'PASS' if not failures else 'FAIL'}: {total} symbols checked bit for bit")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
