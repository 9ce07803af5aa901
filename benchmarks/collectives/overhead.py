"""Host overhead of small collectives on CPU/gloo: torch direct against zipccl's native path --
agreed (the default on gloo: the descriptor exchange, then torch's call) and unverified
(``ZIPCCL_VERIFY=0``: torch's call alone) -- and its compressed protocol (the ``overhead``
subcommand)."""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
import timeit
from collections.abc import Callable
from pathlib import Path

import torch.distributed as dist
import zipccl
from zipccl.collectives import STATS, _transport

from benchmarks.collectives.common import OPS, make_data, op_call

OVERHEAD_MODES = {
    "native": {"ZIPCCL_MODE": "never"},
    "auto": {"ZIPCCL_MODE": "auto"},  # the default: on gloo every call agreed
    "auto_unverified": {"ZIPCCL_MODE": "auto", "ZIPCCL_VERIFY": "0"},
    "auto_verify": {"ZIPCCL_MODE": "auto", "ZIPCCL_VERIFY": "1"},
    "always": {"ZIPCCL_MODE": "always"},  # the whole compressed protocol
    "native_again": {"ZIPCCL_MODE": "never"},
}  # control: the noise floor


def stub_codec() -> None:
    """The torch backend's kernels replaced by no-ops that claim a 2 % payload: ``always`` then
    times what zipccl adds around the codec (table, buffers, copies, headers, both phases,
    syncs), not the CPU codec's own compute, which dwarfs it. Results are garbage: timing only."""
    from zipccl import _torch

    _torch.encode_into = lambda x, fmt, table, block, out: x.numel() // 50
    _torch.decode_into = lambda *args: None


def overhead(args: argparse.Namespace, rank: int, world: int) -> list[dict]:
    """Per-call host time of small collectives: torch direct vs zipccl auto (the default, agreed;
    unverified; ZIPCCL_VERIFY=1) and always.

    The modes are interleaved call by call in an order shuffled per round (the same on every rank),
    so drift on a shared machine and the position after another mode hit them alike; native is
    timed twice (the noise floor).
    """
    from zipccl import switch

    if args.stub_codec:
        stub_codec()
    if args.native_profile:  # instant links, slow codec: auto keeps every call native
        fast, slow = switch.Line(1e-6, 1e15), switch.Line(1e-3, 1e9)
        switch.set_profile(
            None,
            switch.Profile(
                {op: fast for op in switch.OPS}, slow, slow, slow, slow, {"bfloat16": 0.7}
            ),
        )
    rows = []
    for kib in args.kib:
        x = make_data("normal", kib << 10, rank, Path())
        for op in (*OPS, "all_to_all_splits"):
            fns = {
                m: op_call(op, x, world, dist if "native" in m else zipccl, fresh=False)[0]
                for m in OVERHEAD_MODES
            }
            times: dict[str, list[float]] = {m: [] for m in OVERHEAD_MODES}
            strategy = {}
            for m, env in OVERHEAD_MODES.items():
                os.environ.pop("ZIPCCL_VERIFY", None)
                os.environ.update(env)
                STATS.reset()
                fns[m]()  # warm-up; loads the profile on the first auto call
                strategy[m] = STATS.strategy or "native"
            order, shuffle = list(OVERHEAD_MODES.items()), random.Random(kib).shuffle
            for i in range(args.calls + 20):
                shuffle(order)
                for m, env in order:
                    os.environ.pop("ZIPCCL_VERIFY", None)
                    os.environ.update(env)
                    t0 = time.perf_counter()
                    fns[m]()
                    if i >= 20:
                        times[m].append(time.perf_counter() - t0)
            os.environ.update(OVERHEAD_MODES["auto_unverified"])  # host_cost's zipccl closure
            host_us = host_cost(op, fns["auto_unverified"], fns["native"])
            os.environ.pop("ZIPCCL_VERIFY", None)
            row = {
                "op": op,
                "kib": kib,
                "strategy": strategy["auto"],
                "verify_strategy": strategy["auto_verify"],
                "host_us": host_us,
            }
            row.update({f"{m}_us": 1e6 * statistics.median(t) for m, t in times.items()})
            rows.append(row)
            if rank == 0:
                print(json.dumps(row), flush=True)
    return rows


TORCH_NAMES = {  # the torch.distributed functions the two paths call (current, old names)
    "all_gather": {_transport.ALL_GATHER, "all_gather_into_tensor"},
    "all_to_all": {"all_to_all_single"},
    "all_to_all_splits": {"all_to_all_single"},
    "reduce_scatter": {_transport.REDUCE_SCATTER, "reduce_scatter_tensor"},
    "all_reduce": {"all_reduce"},
    "broadcast": {"broadcast"},
}


def host_cost(
    op: str, zipped: Callable[[], object], native: Callable[[], object], calls: int = 20000
) -> float:
    """Microseconds zipccl adds to a call on its unverified native path, free of transport
    noise: both closures timed with the torch.distributed op replaced by a no-op (local, no
    communication)."""
    real = {name: getattr(dist, name) for name in TORCH_NAMES[op]}
    for name in real:
        setattr(dist, name, lambda *args, **kwargs: None)
    try:
        t = [
            statistics.median(timeit.repeat(fn, number=calls // 5, repeat=5)) / (calls // 5)
            for fn in (zipped, native)
        ]
    finally:
        for name, fn in real.items():
            setattr(dist, name, fn)
    return 1e6 * (t[0] - t[1])


def overhead_table(rows: list[dict]) -> str:
    lines = [
        "| op | KiB/rank | native us | native again / native | auto us | auto / native |"
        " auto path | VERIFY=0 / native | VERIFY=0 host us | auto, VERIFY=1 us |"
        " VERIFY=1 / native | always us | always / native |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        n = r["native_us"]
        host = f"{r['host_us']:.2f}" if r["strategy"] == "native" else "-"  # stub: native only
        lines.append(
            f"| {r['op']} | {r['kib']} | {n:.1f} | {r['native_again_us'] / n:.2f} | "
            f"{r['auto_us']:.1f} | {r['auto_us'] / n:.2f} | {r['strategy']} | "
            f"{r['auto_unverified_us'] / n:.2f} | {host} | {r['auto_verify_us']:.1f} | "
            f"{r['auto_verify_us'] / n:.2f} | {r['always_us']:.1f} | "
            f"{r['always_us'] / n:.2f} |"
        )
    return "\n".join(lines)
