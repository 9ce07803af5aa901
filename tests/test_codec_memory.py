"""The CPU codec codes in bounded memory (issue 37 item 6: compress and decompress each took
~80x the tensor's size): peak extra resident memory <= 4x the tensor's bytes + 48 MiB.

Measured in a fresh process whose glibc returns every block of 128 KiB or more to the system when
freed (``MALLOC_MMAP_THRESHOLD_``), so the resident high-water mark (reset through
``/proc/self/clear_refs``) sees each call's own peak. No timing is asserted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

MIB = 1 << 20
TENSOR_BYTES = 2_000_000
FIXED = 48 * MIB

_SCRIPT = """
import json, sys
from pathlib import Path
import torch, zipccl

def rss(field):
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024

def peak(fn):
    Path("/proc/self/clear_refs").write_text("5")
    before = rss("VmRSS")
    kept = fn()
    return rss("VmHWM") - before

torch.set_num_threads(1)
found = {}
for name in ("bfloat16", "float8_e4m3fn", "float32"):
    dtype = getattr(torch, name)
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(int(sys.argv[1]) // dtype.itemsize, generator=gen) * 3).to(dtype)
    c = zipccl.compress(x)
    back = zipccl.decompress(c)
    assert c.layout == "split" and torch.equal(back.view(torch.uint8), x.view(torch.uint8))
    found[name] = [peak(lambda: zipccl.compress(x)), peak(lambda: zipccl.decompress(c))]
print(json.dumps(found))
"""


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc")
def test_cpu_compress_and_decompress_peak_memory_is_bounded() -> None:
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072"}
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT, str(TENSOR_BYTES)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    found = json.loads(done.stdout.strip().splitlines()[-1])
    for name, (compress, decompress) in found.items():
        for what, extra in (("compress", compress), ("decompress", decompress)):
            assert extra <= 4 * TENSOR_BYTES + FIXED, f"{name} {what}: +{extra / MIB:.0f} MiB"


def test_cpu_codec_benchmark_smoke(tmp_path: Path) -> None:
    """benchmarks/cpu_codec.py on a tiny tensor writes its rows (throughput and memory)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import cpu_codec
    import torch

    threads = torch.get_num_threads()
    try:
        assert cpu_codec.main(["--sizes", "0.05", "--reps", "1", "--out", str(tmp_path / "o")]) == 0
    finally:
        torch.set_num_threads(threads)
        sys.path.pop(0)
    found = json.loads((tmp_path / "o").read_text())
    assert [row["dtype"] for row in found["rows"]] == ["bfloat16", "float8_e4m3fn"]
    for row in found["rows"]:
        assert row["compress_mb_s"] > 0 and row["decompress_cpu_mb_s"] > 0 and row["ratio"] < 1
