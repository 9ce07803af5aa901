"""The command line: ``python -m benchmarks.collectives WHAT ...`` (see the package's docstring)."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist

import benchmarks.collectives
from benchmarks.collectives import common
from benchmarks.collectives.common import OPS
from benchmarks.collectives.model import train
from benchmarks.collectives.overhead import overhead, overhead_table
from benchmarks.collectives.phases import phases, phases_table, trace
from benchmarks.collectives.report import table
from benchmarks.collectives.sweep import probe, sweep


def main() -> None:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.collectives",
        description=benchmarks.collectives.__doc__.split("\n")[0],
    )
    ap.add_argument("what", choices=["sweep", "table", "overhead", "probe"])
    ap.add_argument("--kib", type=int, nargs="+", default=[4, 64, 1024])
    ap.add_argument("--calls", type=int, default=400)
    ap.add_argument(
        "--native-profile",
        action="store_true",
        help="overhead: a synthetic profile under which auto keeps every call native",
    )
    ap.add_argument(
        "--stub-codec",
        action="store_true",
        help="overhead: the CPU codec's kernels as no-ops (protocol cost only)",
    )
    ap.add_argument("out", nargs="?", type=Path)
    ap.add_argument("--out", dest="out_dir", type=Path)
    ap.add_argument("--transport", default="nvlink")
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 16, 64, 256, 512])
    ap.add_argument("--data", nargs="+", default=["normal", "weights"])
    ap.add_argument("--minilm", type=Path, default=Path(".data/minilm.npz"))
    ap.add_argument("--train", action="store_true")
    ap.add_argument(
        "--trace",
        type=int,
        default=0,
        help="timeline of one compressed call of each --trace-ops at this many MiB",
    )
    ap.add_argument("--trace-ops", nargs="+", default=["all_gather"], choices=OPS)
    ap.add_argument(
        "--phases",
        type=int,
        nargs="*",
        default=[],
        help="CUDA-event phases of a compressed call of each --phase-ops at these MiB",
    )
    ap.add_argument(
        "--phase-ops",
        nargs="+",
        default=["all_gather", "all_to_all", "broadcast"],
        choices=["all_gather", "all_to_all", "broadcast"],
    )
    ap.add_argument("--skip-sweep", action="store_true")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--d-model", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--bucket-mb", type=float, default=25.0)
    ap.add_argument("--train-mode", default="auto", choices=["auto", "always", "never"])
    ap.add_argument(
        "--hook",
        default="zipccl",
        choices=["zipccl", "torch"],
        help="the hooked runs' hook: zipccl.ddp_hook, or torch's own Python "
        "allreduce_hook (what any Python comm hook costs against DDP's built-in)",
    )
    ap.add_argument("--cpu", action="store_true", help="gloo on CPU: a smoke test of the script")
    args = ap.parse_args()
    if args.what == "table":
        print(table(args.out or args.out_dir))
        return
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if args.cpu or args.what in ("overhead", "probe"):
        common.DEV = torch.device("cpu")
        dist.init_process_group("gloo")
    else:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        common.DEV = torch.device("cuda", torch.cuda.current_device())
        dist.init_process_group("nccl", device_id=common.DEV)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    if args.what == "overhead":
        rows = overhead(args, rank, world)
        if rank == 0:
            (args.out_dir / "overhead-cpu.json").write_text(
                json.dumps({"rows": rows, "world": world, "torch": torch.__version__}, indent=1)
            )
            print(overhead_table(rows), flush=True)
        dist.destroy_process_group()
        return
    if args.what == "probe":  # the codec's fixed costs at each --kib on this device
        probed = {kib: probe(rank, kib) for kib in args.kib}
        if rank == 0:
            print(
                json.dumps(
                    {kib: {k: round(1e6 * v, 1) for k, v in p.items()} for kib, p in probed.items()}
                ),
                flush=True,
            )
        dist.destroy_process_group()
        return
    for op in args.trace_ops if args.trace else ():
        text = trace(rank, world, args.trace, op, args.out_dir)
        if rank == 0:
            print(f"trace {op} {args.trace} MiB\n{text}", flush=True)
    if args.phases:
        if common.DEV.type != "cuda":
            raise SystemExit("--phases times CUDA events: it needs the GPUs")
        found = [phases(rank, world, mib, op) for mib in args.phases for op in args.phase_ops]
        if rank == 0:
            (args.out_dir / f"phases-{args.transport}.json").write_text(
                json.dumps({"rows": found, "transport": args.transport}, indent=1)
            )
            print(phases_table(found), flush=True)
    if not args.skip_sweep:
        probed = probe(rank) if common.DEV.type == "cuda" else {}
        rows = sweep(args, rank, world)
        if rank == 0:
            print("probe", json.dumps(probed), flush=True)
            (args.out_dir / f"sweep-{args.transport}.json").write_text(
                json.dumps(
                    {"rows": rows, "world": world, "probe": probed, "device": str(common.DEV)},
                    indent=1,
                )
            )
    if args.train:
        os.environ["ZIPCCL_MODE"] = args.train_mode
        runs = [train(args, rank, hooked) for hooked in (False, True, True)]
        if rank == 0:
            (args.out_dir / f"train-{args.transport}.json").write_text(
                json.dumps(
                    {
                        "runs": runs,
                        "hook": args.hook,
                        "config": f"ZIPCCL_MODE={args.train_mode}, "
                        f"bucket_cap_mb={args.bucket_mb}, hook={args.hook}",
                    },
                    indent=1,
                )
            )
            for r in runs:
                print("train", r["hooked"], r["step_s"], r["losses"][-1], flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
