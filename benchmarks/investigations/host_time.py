"""Where the host time of a CUDA compress call goes, layer by layer (issue 14: at most 15 µs).

    python benchmarks/investigations/host_time.py --out OUT [--sizes 1,16] [--dtypes bfloat16]
        [--runs 2000]

Each figure is the median, over ``--runs`` calls in five rounds that take the layers in turn, of
one layer's own time on the host from entry to return, with the device idle before each call
(``torch.cuda.synchronize`` outside the timing):

- ``compress``: ``zipccl.compress(x)``, the public call;
- ``compress_into``: ``zipccl.compress_into(x, out)`` (no buffer allocation);
- ``backend``: ``zipccl._cuda.compress``, the layer under codec.py (its Python and the launcher);
- ``launcher``: the launcher's ctypes call with an unknown kernel kind, which returns before any
  CUDA call: what entering the library costs;
- ``empty``: the ``torch.empty`` of compress's buffer;
- ``torch_op``: a one-kernel torch op (``y.zero_()``), the host's launch cost as torch pays it;
- ``decompress``: ``zipccl.decompress(c, out=y, sync=False)``, for reference.

``pyloop_s`` (seconds of a 2M-add Python loop) says how fast the host is: the lent machines
differ by up to 4x, so compare layers within one run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: calls, timing, codec

import torch
import zipccl
from calls import make
from timing import MIB
from zipccl import _cuda, codec


def host_medians(calls: dict[str, Callable[[], object]], runs: int, rounds: int = 5) -> dict:
    """Median microseconds from entry to return of each call with an idle device, taken in
    ``rounds`` interleaved rounds, so that a drift in the host's speed touches every layer alike."""
    times: dict[str, list[float]] = {name: [] for name in calls}
    for fn in calls.values():
        for _ in range(20):
            fn()
    for _ in range(rounds):
        for name, fn in calls.items():
            for _ in range(runs // rounds):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
    return {f"{name}_host_us": statistics.median(t) * 1e6 for name, t in times.items()}


def python_loop_seconds() -> float:
    t0 = time.perf_counter()
    total = 0
    for i in range(2_000_000):
        total += i
    return time.perf_counter() - t0


def layers(x: torch.Tensor, runs: int) -> dict[str, float]:
    """The host time of each layer of a default-table compress of ``x`` (and a decompress)."""
    device = x.device
    plan = _cuda.plan(codec._fmt(x.dtype), x.shape, codec.DEFAULT_BLOCK, device)
    out = torch.empty(plan.meta_at + _cuda.META_BYTES, dtype=torch.uint8, device=device)
    meta = out.data_ptr() + plan.meta_at
    lib = _cuda._LIB
    assert lib is not None
    stream = _cuda._stream(device)
    scratch = _cuda._scratch(device.index, stream, plan)

    def launcher() -> None:
        rc = lib.zipccl_compress(
            plan.args_ref, -1, x.data_ptr(), out.data_ptr(), meta, scratch, 0, None, None, stream
        )
        assert rc != 0  # the unknown kind: nothing was launched

    c = zipccl.compress(x)
    y = torch.empty_like(x)
    calls: dict[str, Callable[[], object]] = {
        "compress": lambda: zipccl.compress(x),
        "compress_into": lambda: zipccl.compress_into(x, out),
        "backend": lambda: _cuda.compress(x, plan, None, None, out, meta, device),
        "launcher": launcher,
        "empty": lambda: torch.empty(out.numel(), dtype=torch.uint8, device=device),
        "torch_op": lambda: y.zero_(),
        "decompress": lambda: zipccl.decompress(c, out=y, sync=False),
    }
    row = host_medians(calls, runs)
    zipccl.decompress(zipccl.compress(x), out=y)
    assert torch.equal(y.view(torch.uint8), x.view(torch.uint8)), "round trip"
    return row


def main() -> None:
    ap = argparse.ArgumentParser(
        prog="python benchmarks/investigations/host_time.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--sizes", default="1,16", help="MiB, comma separated")
    ap.add_argument("--dtypes", default="bfloat16,float8_e4m3fn")
    ap.add_argument("--runs", type=int, default=2000)
    ap.add_argument("--out", default="benchmarks/investigations/results")
    args = ap.parse_args()
    rows = []
    for dtype_name in args.dtypes.split(","):
        for mib in (float(s) for s in args.sizes.split(",")):
            x = make(getattr(torch, dtype_name), int(mib * MIB))
            row = {"dtype": dtype_name, "MiB": mib, "pyloop_s": python_loop_seconds()}
            row |= layers(x, args.runs)
            print(json.dumps(row), flush=True)
            rows.append(row)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "host_time.json").write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
