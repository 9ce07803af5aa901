"""``python -m zipccl.sim`` (``nox -s sim``): the cocotb suite on the generated Verilog of every
QLC block, under Icarus Verilog, checked bit for bit against golden/.

The blocks (the Verilog module names of ``python -m zipccl.hw.generate``): the encoder, the
decoder and the encoder->decoder loopback; the N-lane encoders (x2, x4, x8, x16, x32), decoders
and loopbacks (x2, x4, x8); the decoder pools (x2, x4, x8, x12, x13); the 16-lane encoder into the
13-engine pool (qlc_loopback_pool). Each block runs every stage of
sim/suite.py (each code length, the built-in MiniLM data set under every builder's table,
back-pressure with table reloads and random codebooks, tiny packets, reset mid-packet, and for
decoders illegal codewords and bad padding); the level sets how many symbols each stage takes.
Prints a line per block as it finishes (name, level, symbols, seconds), then cycles (or symbols)
per clock per code length, compression ratios and PASS/FAIL. Exits 1 on any mismatch against
golden/, 2 when Icarus is missing.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from pathlib import Path

from zipccl.sim.runner import INSTALL_HINT, SimFailure, have_icarus, run_cocotb
from zipccl.sim.suite import LEVELS, TOPS, capped, summary_lines

LEVEL_HELP = (
    "symbols per stage: smoke (the default: every block in a few minutes), quick, or full (what "
    "CI runs). A run of every block holds the blocks slowest under Icarus at a lower level: "
    + "; ".join(
        f"{cap} at most for {', '.join(t for t in TOPS if TOPS[t].cap == cap)}"
        for cap in LEVELS
        if cap != "full"
    )
    + ". Blocks named with --tops run at the level asked."
)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m zipccl.sim",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--level", choices=list(LEVELS), default="smoke", help=LEVEL_HELP)
    ap.add_argument(
        "--seed",
        type=int,
        default=1,
        help="seed of the random codebooks, back-pressure and packets (default 1)",
    )
    ap.add_argument(
        "--tops",
        nargs="+",
        choices=list(TOPS),
        metavar="BLOCK",
        help=f"the blocks to run (default: all {len(TOPS)}): {', '.join(TOPS)}",
    )
    ap.add_argument(
        "--build",
        type=Path,
        default=Path("out/sim"),
        help="work folder: each block's Verilog, Icarus build and cocotb.log in BUILD/<block> "
        "(default out/sim)",
    )
    ap.add_argument(
        "--jobs",
        type=int,
        default=os.cpu_count() or 1,
        help="blocks simulated at a time (default: one per core)",
    )
    return ap


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if not have_icarus():
        print(INSTALL_HINT, file=sys.stderr)
        return 2
    tops = args.tops or list(TOPS)
    levels = {t: args.level if args.tops else capped(args.level, t) for t in tops}
    start = time.monotonic()
    print(
        f"zipccl RTL simulation: {len(tops)} blocks at level {args.level}, {args.jobs} at a time, "
        f"cocotb + Icarus Verilog against golden/, seed {args.seed}; simulator logs in "
        f"{args.build}/<block>/cocotb.log",
        flush=True,
    )
    reports: dict[str, dict] = {}
    failures: list[str] = []
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        # the widest blocks, listed last and slowest under Icarus, first: the cores finish together
        runs: dict[Future, str] = {
            pool.submit(run_cocotb, top, levels[top], args.seed, args.build, True): top
            for top in reversed(tops)
        }
        for k, run in enumerate(as_completed(runs), 1):
            top = runs[run]
            head = f"[{k}/{len(tops)}] {top} ({levels[top]})"
            try:
                report = reports[top] = run.result()
                print(
                    f"{head}: PASS, {report['symbols']} symbols, {report['seconds']:.0f} s",
                    flush=True,
                )
            except SimFailure as exc:
                failures.append(str(exc))
                print(f"{head}: FAIL", flush=True)
    print("\n==== zipccl RTL simulation (cocotb + Icarus Verilog vs golden/) ====")
    print(
        f"level {args.level}, seed {args.seed}, {time.monotonic() - start:.0f} s; "
        "ratio = stream bits / (8 x symbols)"
    )
    print("\n".join(summary_lines([reports[t] for t in tops if t in reports])))
    for f in failures:
        print(f"FAIL: {f}")
    total = sum(r["symbols"] for r in reports.values())
    print(f"{'PASS' if not failures else 'FAIL'}: {total} symbols checked bit for bit")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
