"""Smoke test of benchmarks/moe.py on 2 gloo processes (CPU, tiny sizes, ZIPCCL_MODE=always):
the benchmark's own bit-exactness check of zipccl against native passes, the FP8 dispatch goes
through the compressed protocol and its tokens compress, and moe.json carries its fields."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests._collectives_cluster import Cluster

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
ARGS = [
    "--device",
    "cpu",
    "--tokens",
    "256",
    "--hidden",
    "64",
    "--experts",
    "8",
    "--topk",
    "2",
    "--iters",
    "2",
    "--warmup",
    "1",
]


def sc_moe(rank: int, world: int, out: str) -> dict:
    """The benchmark's entry on an initialised group (it raises if the variants differ)."""
    if str(BENCHMARKS) not in sys.path:  # the benchmarks import each other as scripts do
        sys.path.insert(0, str(BENCHMARKS))
    import moe

    return moe.run(moe.parse_args([*ARGS, "--out", out]), rank, world)


@pytest.mark.slow  # 15-30 s on 2 busy cores, nearly all spawning the two torch workers
def test_moe_benchmark_smoke(tmp_path: Path) -> None:
    cluster = Cluster(2)
    try:
        results = cluster.run(sc_moe, str(tmp_path), env={"ZIPCCL_MODE": "always"})
    finally:
        cluster.close()
    print(f"\nmoe smoke: {results[0]}")
    for r in results:
        assert r["exact"] is True
        assert r["strategy"]["dispatch"] == "compressed"
        assert 0 < r["dispatch_ratio"] < 1, r
    found = json.loads((tmp_path / "moe.json").read_text())
    assert {"date", "device", "torch", "env", "args", "results", "transport"} <= set(found)
    assert found["zipccl_mode"] == "always" and found["env"]["ZIPCCL_MODE"] == "always"
    assert found["args"]["tokens"] == 256 and found["args"]["hidden"] == 64
    res = found["results"]
    assert res["exact"] is True and res["dispatch_ratio"] < 1
    for key in (
        "native_step_ms",
        "zipccl_step_ms",
        "speedup",
        "native_a2a_share",
        "zipccl_a2a_share",
        "dispatch_wire_ratio",
        "wire_bytes",
        "raw_bytes",
        "load",
    ):
        assert key in res, key
    assert res["native_step_ms"] > 0 and res["zipccl_step_ms"] > 0
    assert abs(sum(res["load"]) - 1) < 1e-6 and len(res["load"]) == 8
    assert res["raw_bytes"]["dispatch"] > 0 and res["wire_bytes"]["dispatch"] > 0
