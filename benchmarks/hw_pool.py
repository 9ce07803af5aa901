"""Symbols per clock of the decoder pool (hw/pool.py) on streams of many packets.

    python benchmarks/hw_pool.py [--engines 4] [--packet 1024] [--counts 8,24] [--lengths 3,11]
                                 [--data fp8_ffn1] [--out OUT]

A pool decodes E packets at once, but the first packet of a stream leaves at one symbol per
clock (nothing is ahead of it to overlap with), so a run's average depends on how many packets
it holds. This script runs the same packets twice, ``counts`` packets each, in Amaranth's
simulator (cycle-accurate, no back-pressure, every symbol checked against golden/) and reports
both averages and the *sustained* rate, the difference of symbols over the difference of clocks:
what a long stream of such packets gets. ``--engines 1`` runs the single-lane decoder on the
same packets, for the ratio. ``--lengths``: packets of codes of one length each
(sim.cases.length_set); ``--data``: the MiniLM tensor of that name under its builder's table
instead (4096-symbol packets are the container's blocks).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
from zipccl.hw.decoder import QLCDecoder
from zipccl.hw.pool import QLCDecoderPool
from zipccl.sim.amaranth_port import run_amaranth
from zipccl.sim.bench import SINGLE, Bench, Shape, Stats, decode_packets
from zipccl.sim.cases import builder_sets, length_set, load_data
from zipccl.sim.suite import DEC_IN, packets_of


def run(engines: int, book, symbols: np.ndarray, packet: int) -> Stats:
    """``engines`` = 1: the single-lane decoder on the same packets, for the ratio."""
    if engines == 1:
        block, shape = QLCDecoder(), SINGLE
    else:
        block = QLCDecoderPool(engines)
        shape = Shape.pool(engines)

    async def body(port) -> Stats:
        bench = Bench.make(port, DEC_IN, 0, 1.0, 1.0, shape)
        return await decode_packets(bench, book, packets_of(symbols, packet))

    return run_amaranth(block, body)


def sustained(engines: int, book, symbols: np.ndarray, packet: int, counts: list[int]) -> dict:
    runs = []
    for count in counts:
        start = time.monotonic()
        st = run(engines, book, symbols[: count * packet], packet)
        runs.append({"packets": count, "symbols": st.symbols, "cycles": st.cycles})
        print(
            f"  {count} packets: {st.symbols / st.cycles:.3f} symbols/clock "
            f"({time.monotonic() - start:.0f} s)",
            flush=True,
        )
    a, b = runs[0], runs[-1]
    rate = (b["symbols"] - a["symbols"]) / (b["cycles"] - a["cycles"])
    return {"runs": runs, "sustained": rate}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engines", type=int, default=4, help="1: the single-lane decoder")
    ap.add_argument("--packet", type=int, default=1024, help="symbols per packet")
    ap.add_argument("--counts", default="8,24", help="packets per run, two runs")
    ap.add_argument("--lengths", default="3,11", help="code lengths, a stream each")
    ap.add_argument("--data", help="a MiniLM tensor (sim/data) instead of --lengths")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    counts = [int(c) for c in args.counts.split(",")]
    if len(counts) != 2 or counts[0] >= counts[1]:
        ap.error("--counts takes two packet counts, the smaller first")
    cases = []
    if args.data:
        ds = next((d for d in builder_sets(load_data()) if d.name.startswith(args.data)), None)
        if ds is None:
            ap.error(f"no data set named {args.data}")
        cases.append((ds.name, ds.book, ds.symbols))
    else:
        for length in (int(x) for x in args.lengths.split(",")):
            ds = length_set(length, counts[1] * args.packet)
            cases.append((f"{length}-bit codes", ds.book, ds.symbols))
    results = []
    for name, book, symbols in cases:
        if len(symbols) < counts[1] * args.packet:
            ap.error(f"{name} has {len(symbols)} symbols, fewer than {counts[1]} packets")
        print(f"{name}, {args.engines} engines, {args.packet}-symbol packets", flush=True)
        r = sustained(args.engines, book, symbols, args.packet, counts)
        print(f"  sustained: {r['sustained']:.3f} symbols/clock", flush=True)
        results.append({"case": name, "engines": args.engines, "packet": args.packet, **r})
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "hw_pool.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
