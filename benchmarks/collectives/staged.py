"""Compressed collectives over a host-staged transport: CUDA tensors on a gloo group, several
ranks sharing one GPU (each rank ``torch.cuda.set_device(0)``; NCCL refuses two ranks on one GPU).

Run from the repository root on a GPU machine::

    torchrun --nproc-per-node 2 -m benchmarks.collectives.staged --out OUT
    torchrun --nproc-per-node 4 -m benchmarks.collectives.staged --out OUT --sizes 16 64

For every op, per-rank size and data (BF16 N(0,1); real MiniLM BF16 weights from
``--minilm``, tiled to size and rotated per rank) the same processes time, in interleaved rounds
(median wall time between barriers and device syncs):

* ``native``: torch.distributed on the gloo group with the CUDA tensors (gloo's own staging);
* ``staged_raw``: zipccl's protocol with every piece sent raw -- its own pipelined staging
  through pinned memory, no compression (what compression itself adds is ``always`` over this);
* ``auto``: zipccl's switch (profiles this transport on first use);
* ``always``: zipccl compressing every call;
* ``always_Nmib`` (``--chunk-mib N ...``): ``always`` in chunks of N MiB per rank
  (``ZIPCCL_CHUNK_BYTES``), beside ``auto``'s own chunks in the same rounds.

Every zipccl result is checked against native first, on a call's second run (the path a
repeated call takes; bit for bit for data moves; reductions against the fp32 rank-order
reference). Host time per call: the calling thread's CPU time
(``time.thread_time``), beside the wall time. ``--probe`` first times gloo's own primitives on
pinned host memory (what the staged transport can reach). Each row also holds the switch's
predicted seconds per strategy (``model_s``); the document, the profile they come from. Rows go to
``OUT/staged-wW.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
import torch.distributed as dist
import zipccl
from zipccl import switch
from zipccl.collectives import STATS, _agree, _slots, _transport

from benchmarks.collectives import common

MIB = 1 << 20
MODES = ("native", "staged_raw", "auto", "always")


#  ZIPCCL_PLAN_CALLS of staged_raw's calls: a value no other mode uses. A plan's key holds the
#  raw ZIPCCL_* settings, so the raw calls keep plans of their own, and ``always`` (otherwise the
#  same settings) never reuses a raw call's plan, whose pieces went raw. Forgetting the plans
#  around each raw call instead made every timed call of every mode a key's first (no plan: a
#  sample summary, rooms predicted from it), where a repeated call runs on its plan.
RAW_PLAN_CALLS = "63"


@contextlib.contextmanager
def env_set(name: str, value: str) -> Iterator[None]:
    """The environment variable ``name`` at ``value`` inside the block, as it was after."""
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            del os.environ[name]
        else:
            os.environ[name] = before


@contextlib.contextmanager
def raw_slots() -> Iterator[None]:
    """zipccl's protocol with every piece raw: its staging and pipelining without the codec,
    on plans of its own (RAW_PLAN_CALLS)."""
    real = _slots.Agreed.seg

    def raw(self: _slots.Agreed, key: object, dtype: torch.dtype, numel: int, rank: int):
        return _slots.make_seg(dtype, numel, None)

    _slots.Agreed.seg = raw  # type: ignore[method-assign]
    try:
        with env_set("ZIPCCL_PLAN_CALLS", RAW_PLAN_CALLS):
            yield
    finally:
        _slots.Agreed.seg = real  # type: ignore[method-assign]


def chunk_mode(mib: int) -> str:
    """The mode ``always`` in chunks of ``mib`` MiB per rank (``--chunk-mib``)."""
    return f"always_{mib}mib"


def run_mode(mode: str, fn: Callable[[], object]) -> Callable[[], object]:
    """``fn`` under ``mode``'s settings (zipccl's calls read them at every call; a plan's key
    holds them, so each chunk size has its own plans)."""
    env = "never" if mode == "native" else "always" if mode == "staged_raw" else mode
    chunk_mib = None
    if mode.startswith("always_"):
        env, chunk_mib = "always", int(mode.removeprefix("always_").removesuffix("mib"))

    def call() -> object:
        os.environ["ZIPCCL_MODE"] = env
        if mode == "staged_raw":
            with raw_slots():
                return fn()
        if chunk_mib is None:
            return fn()
        with env_set("ZIPCCL_CHUNK_BYTES", str(chunk_mib * MIB)):
            return fn()

    return call


def timed_rounds(calls: dict[str, Callable[[], object]], reps: int) -> dict[str, dict]:
    """Median wall and host (thread CPU) seconds of each call, in interleaved rounds."""
    wall: dict[str, list[float]] = {m: [] for m in calls}
    host: dict[str, list[float]] = {m: [] for m in calls}
    for _ in range(reps):
        for mode, fn in calls.items():
            dist.barrier()
            torch.cuda.synchronize()
            t0, c0 = time.perf_counter(), time.thread_time()
            fn()
            torch.cuda.synchronize()
            wall[mode].append(time.perf_counter() - t0)
            host[mode].append(time.thread_time() - c0)
    return {
        m: {"s": statistics.median(wall[m]), "host_s": statistics.median(host[m])} for m in calls
    }


def probe_calls(n: int, world: int) -> dict[str, Callable[[], object]]:
    """gloo's primitives on ``n`` bytes of pinned host memory per rank."""
    x = torch.randint(0, 255, (n,), dtype=torch.uint8).pin_memory()
    out = torch.empty(n, dtype=torch.uint8).pin_memory()
    big = torch.empty(world * n, dtype=torch.uint8).pin_memory()
    rep = x.repeat(world).pin_memory()
    f32 = torch.zeros(n // 4).pin_memory()

    def in_flight(k: int) -> Callable[[], object]:
        parts, outs = x.chunk(k), out.chunk(k)

        def run() -> None:
            works = [
                dist.all_to_all_single(o, p, async_op=True)
                for o, p in zip(outs, parts, strict=True)
            ]
            for w in works:
                w.wait()

        return run

    return {
        "all_gather": lambda: dist.all_gather_into_tensor(big, x),
        "all_to_all": lambda: dist.all_to_all_single(out, x),
        "all_to_all_repeated": lambda: dist.all_to_all_single(big, rep),
        "broadcast": lambda: dist.broadcast(x, 0),
        "all_reduce_f32": lambda: dist.all_reduce(f32),
        "all_to_all_4_in_flight": in_flight(4),
        "all_to_all_16_in_flight": in_flight(16),
    }


def probe(rank: int, world: int, sizes: list[int]) -> list[dict]:
    """gloo's primitives on pinned host memory, and all-to-all with chunks in flight at once:
    what the staged transport's wire can reach."""
    rows = []
    for mib in sizes:
        calls = probe_calls(mib * MIB, world)
        for fn in calls.values():
            fn()
        row = {"mib": mib, **{k: v["s"] for k, v in timed_rounds(calls, 3).items()}}
        rows.append(row)
        if rank == 0:
            print(json.dumps({"probe": row}), flush=True)
    return rows


def sweep(args: argparse.Namespace, rank: int, world: int) -> list[dict]:
    rows = []
    modes = MODES + tuple(chunk_mode(mib) for mib in args.chunk_mib)
    for kind in args.data:
        for mib in args.sizes:
            x = common.make_data(kind, mib * MIB, rank, args.minilm)
            for op in args.ops:
                want = common.reference(op, x, world, rank)
                calls = {}
                row: dict[str, object] = {"op": op, "mib": mib, "data": kind, "world": world}
                for mode in modes:
                    fn, out = common.op_call(op, x, world, zipccl if mode != "native" else dist)
                    call = run_mode(mode, fn)
                    call()  # checked on its second run: the path a repeated call takes
                    STATS.reset()
                    call()
                    torch.cuda.synchronize()
                    row[f"{mode}_ok"] = torch.equal(out.view(torch.int16), want.view(torch.int16))
                    row[f"{mode}_strategy"] = STATS.strategy or "native"
                    row[f"{mode}_sent"] = STATS.sent
                    calls[mode] = call
                reps = 3 if mib >= 256 else 5
                for mode, t in timed_rounds(calls, reps).items():
                    row[f"{mode}_s"], row[f"{mode}_host_s"] = t["s"], t["host_s"]
                for mode in modes[1:]:
                    row[f"{mode}_x"] = row["native_s"] / row[f"{mode}_s"]  # type: ignore[operator]
                row["compression_x"] = row["staged_raw_s"] / row["always_s"]  # type: ignore[operator]
                row["model_s"] = model_view(op, x)
                rows.append(row)
                if rank == 0:
                    print(json.dumps(row), flush=True)
                del calls
            del x
    return rows


def staged_profile() -> switch.Profile | None:
    """The switch's profile of the default group's staged transport, once ``auto`` measured it."""
    return switch.PROFILES.get(switch.profile_key(None, staged=True))


def model_view(op: str, x: torch.Tensor) -> dict[str, float]:
    """The cost model's predicted seconds per strategy for this call, put to it as ``auto``
    puts it (_agree.model_call): beside the measured times, where it errs."""
    profile = staged_profile()
    if profile is None:
        return {}
    g, nbytes = _transport.resolve(None, x), x.numel() * x.element_size()
    call = _agree.model_call(g, op, x.dtype, nbytes, profile)
    return {"chunks": call.chunks, **switch.predict(profile, call)}


def table(rows: list[dict]) -> str:
    """A markdown table of speed-ups over native gloo. *exact*: zipccl's results (raw, auto,
    always) equal the reference; *gloo exact*: gloo's own does (its reductions of more than two
    ranks need not: they sum in another order)."""
    lines = [
        "| op | MiB/rank | data | native ms | staged raw | auto | always | always/raw | exact "
        "| gloo exact |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | --- | --- |",
    ]
    for r in rows:
        ok = all(r[f"{m}_ok"] for m in MODES if m != "native")
        lines.append(
            f"| {r['op']} | {r['mib']} | {r['data']} | {1e3 * r['native_s']:.1f} | "
            f"{r['staged_raw_x']:.2f}x | {r['auto_x']:.2f}x ({r['auto_strategy']}) | "
            f"{r['always_x']:.2f}x | {r['compression_x']:.2f}x | {'yes' if ok else 'NO'} | "
            f"{'yes' if r['native_ok'] else 'no'} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(
        prog="torchrun --nproc-per-node W -m benchmarks.collectives.staged",
        description=__doc__.split("\n\n")[0],
    )
    ap.add_argument("--out", type=Path, required=True, help="folder for staged-wW.json")
    ap.add_argument("--sizes", type=int, nargs="+", default=[16, 64, 256], help="MiB per rank")
    ap.add_argument("--ops", nargs="+", default=list(common.OPS), choices=common.OPS)
    ap.add_argument("--data", nargs="+", default=["normal", "weights"])
    ap.add_argument("--minilm", type=Path, default=Path(".data/minilm.npz"))
    ap.add_argument("--probe", type=int, nargs="*", default=[], help="MiB sizes to probe first")
    ap.add_argument(
        "--chunk-mib",
        type=int,
        nargs="*",
        default=[],
        help="also time `always` in chunks of each of these MiB per rank (ZIPCCL_CHUNK_BYTES)",
    )
    args = ap.parse_args()
    if args.chunk_mib and "ZIPCCL_CHUNK_BYTES" in os.environ:
        ap.error("--chunk-mib sets ZIPCCL_CHUNK_BYTES per mode: unset it in the environment")
    if os.environ.get("ZIPCCL_PLAN_CALLS") == RAW_PLAN_CALLS:
        ap.error(f"ZIPCCL_PLAN_CALLS={RAW_PLAN_CALLS} is staged_raw's own: choose another value")
    if any(mib <= 0 for mib in args.chunk_mib):
        ap.error("--chunk-mib sizes must be positive")
    torch.cuda.set_device(0)  # every rank on the one GPU
    common.DEV = torch.device("cuda", 0)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    probed = probe(rank, world, args.probe) if args.probe else []
    rows = sweep(args, rank, world)
    if rank == 0:
        args.out.mkdir(parents=True, exist_ok=True)
        profile = staged_profile()
        doc = {
            "world": world,
            "torch": torch.__version__,
            "probe": probed,
            "rows": rows,
            "profile": None if profile is None else profile.vector(),
        }
        (args.out / f"staged-w{world}.json").write_text(json.dumps(doc, indent=1))
        print(table(rows), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
