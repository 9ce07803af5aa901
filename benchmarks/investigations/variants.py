"""Kernel experiments: time edited copies of csrc/codec.cu against the current one, same process.

    python benchmarks/investigations/variants.py VARIANT.cu [VARIANT.cu ...] [--mib 256] [--out OUT]

Each source (the current codec.cu first) is built with nvcc like zipccl/_cuda.py builds its own,
then BF16 N(0,1) and FP8 (histogram table) tensors are compressed and decompressed with it: GPU
time of the encode and decode launches alone (CUDA-graph replay, as benchmarks/codec.py's ``gpu``
column), the public decompress call, ptxas's registers per kernel, and whether every buffer and
every decoded tensor is byte-identical to the current kernels' (a variant that changes the format
is an error, not a result). Results go to stdout and OUT/variants.json.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import torch
import zipccl
from zipccl import _cuda, codec

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: codec
from codec import MIB, event_median, graph_median, make


def ptxas(source: Path, arch: str) -> subprocess.Popen:
    """Start a compile of ``source`` that reports registers (they run while others measure)."""
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    gencode = f"-gencode=arch=compute_{arch},code=sm_{arch}"
    return subprocess.Popen(
        [nvcc, "-O3", "-std=c++17", gencode, "-Xptxas", "-v", "-c", str(source), "-o", "/dev/null"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def registers(proc: subprocess.Popen) -> dict[str, int]:
    """ptxas's register count per kernel (demangled name prefix -> registers)."""
    log = proc.communicate()[1]
    names = re.findall(r"Compiling entry function '(\w+)'", log)
    regs = [int(r) for r in re.findall(r"Used (\d+) registers", log)]
    demangled = subprocess.run(
        ["c++filt"], input="\n".join(names), capture_output=True, text=True
    ).stdout.split("\n")
    short = [re.sub(r"\(anonymous namespace\)::|\(.*$", "", d) for d in demangled]
    return dict(zip(short, regs, strict=False))


def measure(x: torch.Tensor, table: object) -> tuple[dict[str, float], torch.Tensor, torch.Tensor]:
    """GB/s of each column, the compressed buffer and the decoded tensor."""
    fmt = codec._fmt(x.dtype)
    n = x.numel() * x.element_size()
    out = torch.empty(
        zipccl.max_compressed_bytes(x.dtype, x.numel()), dtype=torch.uint8, device="cuda"
    )
    c = zipccl.compress_into(x, out, table)
    y = torch.empty_like(x)
    flag = torch.zeros(1, dtype=torch.int32, device="cuda")
    runs = 50
    row = {
        "compress_gpu_GBps": n
        / graph_median(lambda: _cuda.launch_encode(x, fmt, table, c.block, out), runs)
        / 1e9,
        "decompress_gpu_GBps": n
        / graph_median(
            lambda: _cuda.launch_decode(c.buffer, fmt, table, c.block, c.payload_bytes, y, flag),
            runs,
        )
        / 1e9,
        "decompress_api_GBps": n / event_median(lambda: zipccl.decompress(c, out=y), runs) / 1e9,
        "compress_api_GBps": n
        / event_median(lambda: zipccl.compress_into(x, out, table), runs)
        / 1e9,
    }
    zipccl.decompress(zipccl.compress_into(x, out, table), out=y)
    return row, c.buffer.clone(), y.clone()


def main() -> None:
    ap = argparse.ArgumentParser(
        prog="python benchmarks/investigations/variants.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("variants", nargs="*", type=Path)
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--out", type=Path, default=Path("."))
    args = ap.parse_args()
    major, minor = torch.cuda.get_device_capability()
    arch = f"{major}{minor}"
    cases = {}
    for dtype in (torch.bfloat16, torch.float8_e4m3fn):
        x = make("normal", dtype, args.mib * MIB, {})
        table = zipccl.histogram_table(x) if dtype != torch.bfloat16 else zipccl.default_table(x)
        cases[str(dtype).removeprefix("torch.")] = (x, table)
    results, want = [], {}
    sources = [_cuda.SOURCE, *args.variants]
    compiles = [ptxas(s, arch) for s in sources]
    for source, compiling in zip(sources, compiles, strict=True):
        _cuda.SOURCE = source.resolve()
        _cuda._lib.cache_clear()
        row: dict[str, object] = {"source": source.name, "registers": registers(compiling)}
        for name, (x, table) in cases.items():
            got, buf, y = measure(x, table)
            exact = torch.equal(y.view(torch.uint8), x.view(torch.uint8))
            if name in want:
                exact = exact and torch.equal(buf, want[name])
            want.setdefault(name, buf)
            row[name] = {**{k: round(v, 1) for k, v in got.items()}, "exact": exact}
        results.append(row)
        print(json.dumps(row), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "variants.json").write_text(
        json.dumps(
            {"device": torch.cuda.get_device_name(), "mib": args.mib, "results": results}, indent=1
        )
    )


if __name__ == "__main__":
    main()
