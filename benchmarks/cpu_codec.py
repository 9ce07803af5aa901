"""CPU codec benchmark: compress / decompress throughput and peak extra memory on one core.

    python benchmarks/cpu_codec.py --out OUT.json                 # BF16 and e4m3 at 8-64 MB
    python benchmarks/cpu_codec.py --sizes 8 --dtypes bfloat16 --out OUT.json

The host path (zipccl._torch, what a CPU rank of a gloo job runs) on N(0, 1) values, one torch
thread. Throughput is the tensor's bytes / the fastest of ``--reps`` timed calls after one warm-up
(the default table, built from the sample, included), by the wall clock and by the process's
CPU time (steadier on a shared machine). Peak extra memory is the process's resident
high-water mark during one call less the resident size before it (Linux: ``/proc/self/clear_refs``
resets the mark), so it counts every allocation, torch's included, that the call touched; the
compressed buffer (of compress) and the output tensor (of decompress) are part of it. It is
measured in a child process with glibc's mmap threshold fixed at 128 KiB
(``MALLOC_MMAP_THRESHOLD_``), so that freed blocks leave the resident set instead of hiding the
next call's peak; the timings run in this process, with the usual allocator.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import zipccl

MB = 1_000_000
MIB = 1 << 20
DTYPES = {"bfloat16": torch.bfloat16, "float8_e4m3fn": torch.float8_e4m3fn}


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def peak_extra_bytes(fn: Callable[[], object]) -> int:
    """Resident high-water mark during ``fn()`` less the resident size before it (Linux)."""
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    before = _status_kib("VmRSS")
    result = fn()
    peak = _status_kib("VmHWM")
    del result
    return (peak - before) * 1024


def best_seconds(fn: Callable[[], object], reps: int) -> tuple[float, float]:
    """The fastest wall-clock and process-CPU seconds of ``reps`` calls after a warm-up (on a
    shared machine the CPU time is the steadier of the two)."""
    fn()
    wall = cpu = float("inf")
    for _ in range(reps):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall = min(wall, time.perf_counter() - t0)
        cpu = min(cpu, time.process_time() - c0)
    return wall, cpu


def calls(dtype: torch.dtype, nbytes: int) -> tuple[float, dict[str, Callable[[], object]]]:
    """The ratio, and compress / decompress of ``nbytes`` of N(0, 1) values (checked once)."""
    numel = nbytes // torch.tensor([], dtype=dtype).element_size()
    x = torch.randn(numel, generator=torch.Generator().manual_seed(nbytes)).to(dtype)
    c = zipccl.compress(x)
    assert torch.equal(zipccl.decompress(c).view(torch.uint8), x.view(torch.uint8))
    return c.ratio, {
        "compress": lambda: zipccl.compress(x),
        "decompress": lambda: zipccl.decompress(c),
    }


def measure(name: str, nbytes: int, reps: int) -> dict[str, object]:
    ratio, fns = calls(DTYPES[name], nbytes)
    row: dict[str, object] = {"dtype": name, "mb": nbytes / MB, "ratio": round(ratio, 4)}
    for what, fn in fns.items():
        wall, cpu = best_seconds(fn, reps)
        row[f"{what}_mb_s"] = round(nbytes / MB / wall, 1)
        row[f"{what}_cpu_mb_s"] = round(nbytes / MB / cpu, 1)
    peaks = _child_peaks(name, nbytes)
    for what, extra in peaks.items():
        row[f"{what}_peak_extra_mib"] = round(extra / MIB, 1)
        row[f"{what}_peak_extra_x"] = round(extra / nbytes, 2)
    return row


def _child_peaks(name: str, nbytes: int) -> dict[str, int]:
    """:func:`peak_extra_bytes` of each call, in a child process whose glibc returns every
    block of 128 KiB or more when freed (so that the resident mark sees each call's own peak;
    the timings run with the usual allocator, which that setting would slow down)."""
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072"}
    cmd = [sys.executable, __file__, "--peaks", name, str(nbytes)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def _print_peaks(name: str, nbytes: int) -> None:
    torch.set_num_threads(1)
    _, fns = calls(DTYPES[name], nbytes)
    print(json.dumps({what: peak_extra_bytes(fn) for what, fn in fns.items()}))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--sizes", type=float, nargs="+", default=[8, 16, 32, 64], help="MB (10^6 bytes)"
    )
    parser.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=list(DTYPES))
    parser.add_argument("--reps", type=int, default=3, help="timed calls per row (fastest kept)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default: one core)")
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = []
    for name in args.dtypes:
        for size in args.sizes:
            rows.append(measure(name, int(size * MB), args.reps))
            print(json.dumps(rows[-1]), flush=True)
    doc = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "threads": args.threads,
        "command": "python benchmarks/cpu_codec.py "
        + " ".join(sys.argv[1:] if argv is None else argv),
        "rows": rows,
    }
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--peaks"]:  # _child_peaks' child
        _print_peaks(sys.argv[2], int(sys.argv[3]))
        raise SystemExit(0)
    raise SystemExit(main())
