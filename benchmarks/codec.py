"""GPU codec benchmark: zipccl vs nvCOMP ANS on BF16 and FP8, N(0,1) and real MiniLM tensors.

    python benchmarks/codec.py --only zipccl --out OUT     # on a CUDA machine
    python benchmarks/codec.py --only nvcomp --out OUT     # nvCOMP ANS, same tensors, own process
    python benchmarks/codec.py --only report --out OUT     # merge -> OUT/codec.json + markdown

Throughput is uncompressed bytes / time; times are CUDA-event medians of many runs after warm-up.
``api`` times the public call (compress_into / decompress into preallocated buffers, table given),
which includes the one host sync each needs (payload size, error flag) and the header write;
``kernel`` times the backend's launch call (its Python wrapper and kernels, no sync); ``gpu``
replays that launch from a CUDA graph, so it is the GPU work alone. ``/ copy`` is the api
throughput over that of a plain device-to-device copy (measured, bytes read + written, / 2).
nvCOMP ANS runs on the same tensors (same sizes, seeds and files) in a second process of the same
run (wall clock around device syncs), so a failure of either library cannot take the other's rows.
The MiniLM file holds BF16/FP8 bit patterns exported by golden.data (tiled up to each size).
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
from pathlib import Path

import numpy as np
import torch
import zipccl
from timing import MIB, copy_bandwidth, event_median, graph_median, runs_for, wall_median
from zipccl import _cuda, codec
from zipccl.golden import container


def make(kind: str, dtype: torch.dtype, nbytes: int, minilm: dict[str, np.ndarray]) -> torch.Tensor:
    n = nbytes // torch.tensor([], dtype=dtype).element_size()
    if kind == "normal":  # seeded per size, so the nvCOMP process sees the same tensor
        gen = torch.Generator(device="cuda").manual_seed(nbytes)
        return torch.randn(n, device="cuda", generator=gen).to(dtype)
    arr = minilm[kind]
    src = torch.from_numpy(arr.view(np.int16) if arr.dtype == np.uint16 else arr).view(dtype).cuda()
    reps = -(-n // src.numel())
    return src.repeat(reps)[:n].contiguous()


def nvcomp_row(x: torch.Tensor, runs: int) -> dict[str, object]:
    """nvCOMP ANS on the same tensor; any failure of the third-party library is recorded."""
    try:
        return _nvcomp_row(x, runs)
    except Exception as exc:  # a missing or failing baseline must not stop the run
        return {"nvcomp_error": repr(exc)}


def _nvcomp_row(x: torch.Tensor, runs: int) -> dict[str, object]:
    from nvidia import nvcomp

    dtype = "<f2" if x.element_size() == 2 else "|u1"
    raw = x.view(torch.uint8 if x.element_size() == 1 else torch.float16)
    arr = nvcomp.as_array(raw)
    nv = nvcomp.Codec(algorithm="ANS", data_type=dtype)
    enc = nv.encode(arr)
    n = x.numel() * x.element_size()
    row: dict[str, object] = {
        "nvcomp_ratio": enc.buffer_size / n,
        "nvcomp_compress_GBps": n / wall_median(lambda: nv.encode(arr), runs) / 1e9,
        "nvcomp_decompress_GBps": n / wall_median(lambda: nv.decode(enc), runs) / 1e9,
    }
    if n <= 4 * MIB:  # round trip through host memory (no DLPack hand-off of nvCOMP's buffer)
        back = np.asarray(nv.decode(enc).cpu()).view(np.uint8).reshape(-1)
        row["nvcomp_roundtrip_ok"] = bool(np.array_equal(back, x.view(torch.uint8).cpu().numpy()))
    return row


def zipccl_row(x: torch.Tensor, runs: int, copy_bw: float) -> dict[str, object]:
    fmt = codec._fmt(x.dtype)
    n = x.numel() * x.element_size()
    t_table = wall_median(lambda: zipccl.default_table(x), 10)
    default = zipccl.default_table(x)
    # FP8: the preset fits absmax-scaled activations only; time the kernels with the fitted table
    table = zipccl.histogram_table(x) if fmt.byte_coded else default
    out = torch.empty(
        zipccl.max_compressed_bytes(x.dtype, x.numel()), dtype=torch.uint8, device="cuda"
    )
    c = zipccl.compress_into(x, out, table)
    y = torch.empty_like(x)
    zipccl.decompress(c, out=y)
    ok = torch.equal(y.view(torch.uint8), x.view(torch.uint8))
    flag = torch.zeros(1, dtype=torch.int32, device="cuda")
    row: dict[str, object] = {
        "ratio": c.ratio,
        "table": table.name,
        "ratio_default_table": zipccl.compress(x, default).ratio,
        "layout": c.layout,
        "roundtrip_ok": ok,
        "theory_table_ms": t_table * 1e3,
        "compress_api_GBps": n
        / event_median(lambda: zipccl.compress_into(x, out, table), runs)
        / 1e9,
        "compress_kernel_GBps": n
        / event_median(lambda: _cuda.launch_encode(x, fmt, table, c.block, out), runs)
        / 1e9,
        "decompress_api_GBps": n / event_median(lambda: zipccl.decompress(c, out=y), runs) / 1e9,
    }
    if c.layout == "split":
        row["decompress_kernel_GBps"] = (
            n
            / event_median(
                lambda: _cuda.launch_decode(
                    c.buffer, fmt, table, c.block, c.payload_bytes, y, flag
                ),
                runs,
            )
            / 1e9
        )
        assert int(flag.item()) == 0
        row["compress_gpu_GBps"] = (
            n / graph_median(lambda: _cuda.launch_encode(x, fmt, table, c.block, out), runs) / 1e9
        )
        row["decompress_gpu_GBps"] = (
            n
            / graph_median(
                lambda: _cuda.launch_decode(
                    c.buffer, fmt, table, c.block, c.payload_bytes, y, flag
                ),
                runs,
            )
            / 1e9
        )
        assert int(flag.item()) == 0
        if _cuda._kind(fmt, table, c.block) in _cuda.FAST.values():  # generic kernels, same data
            os.environ["ZIPCCL_FAST"] = "0"
            try:
                row["generic_compress_kernel_GBps"] = (
                    n
                    / event_median(lambda: _cuda.launch_encode(x, fmt, table, c.block, out), runs)
                    / 1e9
                )
                row["generic_decompress_kernel_GBps"] = (
                    n
                    / event_median(
                        lambda: _cuda.launch_decode(
                            c.buffer, fmt, table, c.block, c.payload_bytes, y, flag
                        ),
                        runs,
                    )
                    / 1e9
                )
            finally:
                del os.environ["ZIPCCL_FAST"]
    # Memory-bound floor: input read + container written (compress), the reverse (decompress).
    floor = (n + c.nbytes) / copy_bw
    row["compress_of_floor"] = n / float(row["compress_kernel_GBps"]) / 1e9 / floor
    row["decompress_api_of_copy"] = float(row["decompress_api_GBps"]) * 1e9 * 2 / copy_bw
    row["compress_api_of_copy"] = float(row["compress_api_GBps"]) * 1e9 * 2 / copy_bw
    return row


def golden_ratio_check(x: torch.Tensor) -> dict[str, float]:
    """Ratio on the first 1 Mi elements: GPU buffer length vs golden.container.encode on CPU."""
    head = x[: 1 << 20].cpu()
    c = zipccl.compress(x[: 1 << 20])
    fmt = codec._fmt(x.dtype)
    bits = head.view(torch.uint8 if fmt.bits == 8 else torch.int16).numpy().view(fmt.uint)
    gold = container.encode(bits, fmt, c.table or zipccl.default_table(head), c.block)
    same = bytes(c.buffer.cpu().numpy()) == gold
    return {
        "golden_ratio_1Mi": len(gold) / (head.numel() * head.element_size()),
        "golden_bytes_equal_1Mi": same,
    }


def table_costs(x: torch.Tensor) -> dict[str, float]:
    return {
        "theory_table_ms": wall_median(lambda: zipccl.default_table(x), 10) * 1e3,
        "histogram_table_ms": wall_median(lambda: zipccl.histogram_table(x), 10) * 1e3,
        "ratio_theory": zipccl.compress(x).ratio,
        "ratio_histogram": zipccl.compress(x, "histogram").ratio,
    }


def backend_row(x: torch.Tensor, backend: str) -> dict[str, object]:
    """Another backend on the same GPU tensor (ZIPCCL_BACKEND=torch|triton), api timings, checked
    byte-identical to the CUDA kernels' buffer; a failure is recorded, not raised."""
    n = x.numel() * x.element_size()
    table = zipccl.histogram_table(x) if codec._fmt(x.dtype).byte_coded else zipccl.default_table(x)
    want = zipccl.compress(x, table)
    os.environ["ZIPCCL_BACKEND"] = backend
    try:
        c = zipccl.compress(x, table)
        return {
            f"{backend}_same_bytes": bool(torch.equal(c.buffer, want.buffer)),
            f"{backend}_compress_GBps": n / wall_median(lambda: zipccl.compress(x, table), 5) / 1e9,
            f"{backend}_decompress_GBps": n / wall_median(lambda: zipccl.decompress(c), 5) / 1e9,
        }
    except Exception as exc:  # a backend that cannot run here must not stop the sweep
        return {f"{backend}_error": repr(exc)}
    finally:
        del os.environ["ZIPCCL_BACKEND"]


def sanitize_case() -> None:
    """Small compress/decompress of every dtype plus corrupt buffers, for compute-sanitizer."""
    for dtype in (
        torch.bfloat16,
        torch.float16,
        torch.float32,
        torch.float8_e4m3fn,
        torch.float8_e5m2,
    ):
        x = (torch.randn(10007, device="cuda") * 3).to(dtype)
        c = zipccl.compress(x, block=1024)
        assert torch.equal(zipccl.decompress(c).view(torch.uint8), x.view(torch.uint8))
        bad = c.buffer.clone()
        bad[-40:] = 0xFF
        bad[container.HEADER_BYTES + 7 :: 97] ^= 0x5A
        try:
            zipccl.decompress(
                zipccl.Compressed._of(
                    bad, container.Header.unpack(bytes(bad[: container.HEADER_BYTES].cpu().numpy()))
                )
            )
        except ValueError as exc:
            print("rejected as expected:", exc)
    torch.cuda.synchronize()
    print("sanitize case done")


CASES = [
    (torch.bfloat16, "normal"),
    (torch.bfloat16, "bf16_weights"),
    (torch.float8_e4m3fn, "normal"),
    (torch.float8_e4m3fn, "fp8_activations"),
]


def load_minilm(path: str) -> dict[str, np.ndarray]:
    minilm = dict(np.load(path)) if Path(path).exists() else {}
    if minilm:
        classes = ("bf16_weights", "bf16_activations", "bf16_gradients")
        minilm["bf16_minilm"] = np.concatenate([minilm[k] for k in classes])
    return minilm


def sweep(args: argparse.Namespace, out: Path, minilm: dict[str, np.ndarray]) -> None:
    """One process per library (``--only``), so a crash in one cannot take the other's rows."""
    copy_bw = copy_bandwidth()
    print(f"device {torch.cuda.get_device_name()}  D2D copy {copy_bw / 1e12:.2f} TB/s", flush=True)
    results: dict[str, object] = {
        "device": torch.cuda.get_device_name(),
        "copy_TBps": copy_bw / 1e12,
        "rows": [],
        "extra": {},
    }
    path = out / f"codec_{args.only}.json"
    for dtype, kind in CASES:
        if (kind != "normal" and not minilm) or str(dtype)[6:] not in args.dtypes.split(","):
            continue
        for mib in (int(s) for s in args.sizes.split(",")):
            x = make(kind, dtype, mib * MIB, minilm)
            runs = runs_for(mib * MIB)
            row = {"dtype": str(dtype).removeprefix("torch."), "data": kind, "MiB": mib}
            if args.only == "nvcomp":
                row |= nvcomp_row(x, max(5, runs // 4))
            else:
                row |= zipccl_row(x, runs, copy_bw)
                if mib == 1:
                    row |= golden_ratio_check(x)
                if mib == 256:
                    results["extra"][f"{row['dtype']}-{kind}-256MiB-tables"] = table_costs(x)
                if mib == 64:
                    for backend in ("torch", "triton"):
                        key = f"{row['dtype']}-{kind}-64MiB-{backend}"
                        results["extra"][key] = backend_row(x, backend)
            results["rows"].append(row)
            print(json.dumps(row), flush=True)
            path.write_text(json.dumps(results, indent=1, default=str))
            del x
            torch.cuda.empty_cache()
    if args.only == "zipccl":
        for cls in ("bf16_weights", "bf16_activations", "bf16_gradients"):
            if minilm:
                x = make(cls, torch.bfloat16, 256 * MIB, minilm)
                results["extra"][f"{cls}-256MiB"] = table_costs(x)
        path.write_text(json.dumps(results, indent=1, default=str))
        print(json.dumps(results["extra"], indent=1, default=str))


def report(out: Path) -> None:
    """Merge the two sweeps into codec.json and print the markdown table."""
    results = json.loads((out / "codec_zipccl.json").read_text())
    nv_path = out / "codec_nvcomp.json"
    nv = json.loads(nv_path.read_text())["rows"] if nv_path.exists() else []
    by_key = {(r["dtype"], r["data"], r["MiB"]): r for r in nv}
    for r in results["rows"]:
        r |= {
            k: v
            for k, v in by_key.get((r["dtype"], r["data"], r["MiB"]), {}).items()
            if k.startswith("nvcomp")
        }
    (out / "codec.json").write_text(json.dumps(results, indent=1, default=str))
    print(markdown(results))


def main() -> None:
    faulthandler.enable()
    ap = argparse.ArgumentParser(
        prog="python benchmarks/codec.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--sizes", default="1,4,16,64,256,1024", help="MiB, comma separated")
    ap.add_argument("--minilm", default=".data/minilm.npz")
    ap.add_argument("--out", default="benchmarks/results/codec")
    ap.add_argument("--only", choices=("zipccl", "nvcomp", "report"), default="zipccl")
    ap.add_argument("--dtypes", default="bfloat16,float8_e4m3fn", help="comma separated")
    ap.add_argument("--sanitize", action="store_true", help="small case for compute-sanitizer")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.sanitize:
        sanitize_case()
    elif args.only == "report":
        report(out)
    else:
        sweep(args, out, load_minilm(args.minilm))


def markdown(results: dict) -> str:
    cols = [
        ("ratio", ".4f"),
        ("compress_api_GBps", ".0f"),
        ("compress_kernel_GBps", ".0f"),
        ("compress_gpu_GBps", ".0f"),
        ("decompress_api_GBps", ".0f"),
        ("decompress_kernel_GBps", ".0f"),
        ("decompress_gpu_GBps", ".0f"),
        ("compress_api_of_copy", ".2f"),
        ("decompress_api_of_copy", ".2f"),
        ("nvcomp_ratio", ".4f"),
        ("nvcomp_compress_GBps", ".0f"),
        ("nvcomp_decompress_GBps", ".0f"),
    ]
    head = [
        "dtype",
        "data",
        "MiB",
        "ratio",
        "compress GB/s api",
        "compress GB/s kernel",
        "compress GB/s gpu",
        "decompress GB/s api",
        "decompress GB/s kernel",
        "decompress GB/s gpu",
        "compress / copy",
        "decompress / copy",
        "nvCOMP ANS ratio",
        "nvCOMP compress GB/s",
        "nvCOMP decompress GB/s",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in results["rows"]:
        cells = [r["dtype"], r["data"], str(r["MiB"])]
        cells += [format(r[k], f) if isinstance(r.get(k), float) else "-" for k, f in cols]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
