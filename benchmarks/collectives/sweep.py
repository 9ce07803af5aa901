"""The sweep (every op, size, data set and mode against native) and the codec's fixed costs
(the ``sweep`` and ``probe`` subcommands)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.distributed as dist
import zipccl
from zipccl.collectives import STATS

from benchmarks.collectives.common import (
    MODES,
    OPS,
    make_data,
    native_wire,
    op_call,
    reference,
    set_mode,
    sync,
    timed,
    timed_together,
)
from benchmarks.timing import MIB


def probe(rank: int, kib: int = 32 << 10) -> dict[str, float]:
    """Fixed costs behind the protocols: the descriptor exchange and the codec's calls (default
    32 MiB), median seconds."""
    from zipccl import codec
    from zipccl.collectives import _exchange, _transport

    g = _transport.resolve(None)
    x = make_data("normal", kib << 10, rank, Path())
    table = codec.default_table(x)
    c = codec.compress(x, table)
    out = torch.empty_like(x)
    cases = {
        "exchange": lambda: _exchange.exchange(g, [1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0], "probe"),
        "default_table": lambda: codec.default_table(x),
        "compress_given_table": lambda: codec.compress(x, table),
        "compress_default_table": lambda: codec.compress(x),
        "decompress": lambda: codec.decompress(c, out=out),
    }
    return {k: timed(fn, 10) for k, fn in cases.items()}


def sweep(args: argparse.Namespace, rank: int, world: int) -> list[dict]:
    rows = []
    for kind in args.data:
        for mib in args.sizes:
            x = make_data(kind, mib * MIB, rank, args.minilm)
            for op in OPS:
                want = reference(op, x, world, rank)
                row = {"transport": args.transport, "data": kind, "op": op, "mib": mib}
                calls = {}
                for mode in MODES:
                    set_mode(mode)
                    fn, out = op_call(op, x, world, zipccl if mode != "native" else dist)
                    STATS.reset()
                    fn()
                    sync()
                    sent, strategy = STATS.sent, STATS.strategy
                    row[f"{mode}_ok"] = torch.equal(out.view(torch.int16), want.view(torch.int16))
                    if mode == "native" or strategy == "native":
                        sent = native_wire(op, mib * MIB, world, rank)
                    row[f"{mode}_wire"] = sent
                    row[f"{mode}_strategy"] = strategy or "native"
                    calls[mode] = fn
                reps = 3 if mib >= 256 else 15
                for mode, seconds in timed_together(calls, reps, set_mode).items():
                    row[f"{mode}_s"] = seconds
                del calls
                rows.append(row)
                if rank == 0:
                    print(json.dumps(row), flush=True)
            del x
    return rows
