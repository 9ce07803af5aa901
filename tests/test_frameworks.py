"""Unmodified training scripts (examples/frameworks/) under the zipccl-run launcher on 2 CPU
processes (4 for the Megatron-style one: tensor x data parallel), each compared bit for bit
with the same script under plain torchrun (gloo).

``ZIPCCL_MODE=always``: every float collective the frameworks make goes through zipccl's
compressed protocols, and ``ZIPCCL_LOG=summary``'s report must show compressed calls -- so a
launcher that left the groups plain gloo fails here. Each framework is skipped where it is not
installed (the ``frameworks`` extra installs them all).
"""

import importlib
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from zipccl import accounting

EXAMPLES = Path(__file__).parent.parent / "examples" / "frameworks"
BENCHMARKS = Path(__file__).parent.parent / "benchmarks" / "frameworks"  # the torchtitan run
WAIT_S = 240  # one launch; the groups' own timeout is torch's (far longer): a hang fails here


#  What gloo prints when a rank's process exits with the group's threads still running; runs of
#  these scripts show it now and then on a loaded 2-core machine after the script's output is
#  written and its group destroyed: plain torchrun's (no zipccl in them), and once a zipccl
#  launch of fsdp2.py (CPU tensors: no zipccl thread in the process) in a fresh clone's CI run
GLOO_TEARDOWN = "terminate called without an active exception"


def _launch(launcher: str, script: str, out: str, cwd: Path, nproc: int, **env: str) -> str:
    """stderr of ``launcher`` (a module: zipccl.run or torch.distributed.run) running ``script
    out`` on ``nproc`` processes, launched once more where the first launch wrote its output and
    then died in gloo's teardown (GLOO_TEARDOWN); twice is a failure."""
    done = _run(launcher, script, out, cwd, nproc, **env)
    if done.returncode and GLOO_TEARDOWN in done.stderr and Path(out).exists():
        Path(out).unlink()
        done = _run(launcher, script, out, cwd, nproc, **env)
    assert done.returncode == 0, done.stderr[-6000:]
    return done.stderr


def _run(
    launcher: str, script: str, out: str, cwd: Path, nproc: int, **env: str
) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("ZIPCCL_")}
    return subprocess.run(
        [sys.executable, "-m", launcher, "--standalone", f"--nproc-per-node={nproc}", script, out],
        cwd=cwd,
        env={
            **base,
            "OMP_NUM_THREADS": "1",
            "HF_HUB_OFFLINE": "1",
            "DS_ACCELERATOR": "cpu",
            "ZIPCCL_CACHE_DIR": str(cwd / "cache"),
            **env,
        },
        capture_output=True,
        text=True,
        timeout=WAIT_S,
    )


def _compressed_calls(log: str) -> list[int]:
    """Each rank's total compressed calls, from ZIPCCL_LOG=summary's tables."""
    return [int(m) for m in re.findall(r"^\s*total\s+\d+\s+(\d+)\s", log, re.MULTILINE)]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("script", "needs", "nproc"),
    [
        ("ddp.py", "torch", 2),
        ("fsdp2.py", "torch", 2),
        ("dtensor.py", "torch", 2),
        ("megatron_style.py", "torch", 4),  # tensor parallel 2 x data parallel 2
        ("lightning_ddp.py", "lightning", 2),
        ("hf_trainer.py", "transformers", 2),
        ("deepspeed_zero2.py", "deepspeed", 2),
    ],
)
def test_unmodified_script_matches_gloo(
    tmp_path: Path, script: str, needs: str, nproc: int
) -> None:
    pytest.importorskip(needs)
    if needs == "transformers":
        pytest.importorskip("accelerate")  # the Trainer's own requirement
    zipped, plain, path = tmp_path / "zipccl.pt", tmp_path / "gloo.pt", str(EXAMPLES / script)
    log = _launch(
        "zipccl.run",
        path,
        str(zipped),
        tmp_path,
        nproc,
        ZIPCCL_MODE="always",
        ZIPCCL_LOG="summary",
    )
    _launch("torch.distributed.run", path, str(plain), tmp_path, nproc)
    counts = _compressed_calls(log)
    assert len(counts) == nproc and min(counts) > 0, log[-3000:]
    ours, theirs = torch.load(zipped), torch.load(plain)
    assert list(ours) == list(theirs)
    for name in ours:
        assert torch.equal(ours[name].view(torch.uint8), theirs[name].view(torch.uint8)), name


@pytest.fixture
def torchtitan_run(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """benchmarks/frameworks/torchtitan_h200.py (run on the GPU machine) and its offline
    folder, importable as the run imports them (the ``datasets`` stand-in only while a test
    runs: any real one is put back)."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    monkeypatch.syspath_prepend(str(BENCHMARKS / "offline"))
    for name in [m for m in sys.modules if m.split(".")[0] == "datasets"]:
        monkeypatch.delitem(sys.modules, name)
    yield importlib.import_module("torchtitan_h200")
    for name in [m for m in sys.modules if m.split(".")[0] == "datasets"]:
        del sys.modules[name]


def test_the_torchtitan_run_reads_zipccls_report(torchtitan_run: Any) -> None:
    """It parses ZIPCCL_LOG=summary's table out of the workers' logs: a change to the table's
    format must fail here, not on the GPU machine."""
    accounting.reset_stats()
    accounting.record("all_gather", torch.bfloat16, "compressed", 8192, 6000, 0.01)
    accounting.record("all_reduce", torch.float32, "native", 4, 4, 0.001, "size: at most 512 bytes")
    log = f"[titan] step: 1\nzipccl[rank 1] summary:\n{accounting.stats(reset=True)}\n[titan] end"
    shown: list[str] = []
    report = torchtitan_run.read_report(log, shown)["1"]
    assert report["all_gather/bfloat16"]["compressed"] == 1
    assert report["all_gather/bfloat16"]["mb_out"] == 0.006
    assert (report["total"]["calls"], report["total"]["compressed"]) == (2, 1)
    assert report["not_compressed"] == {"reasons": "size: at most 512 bytes (1)"}
    assert len(shown) == 6 and shown[0] == "zipccl[rank 1] summary:"


@pytest.mark.parametrize("rows", [0, 1, 7, 8])
def test_the_datasets_stand_in_splits_like_datasets(
    tmp_path: Path, rows: int, torchtitan_run: Any
) -> None:
    """The run's stand-in for Hugging Face datasets (the GPU machine has none): every row once,
    in file order, rank r taking the r-th contiguous block, the first len % world one longer."""
    from datasets import load_dataset
    from datasets.distributed import split_dataset_by_node

    (tmp_path / "a.json").write_text(
        "".join(json.dumps({"text": str(i)}) + "\n" for i in range(rows))
    )
    if not rows:
        (tmp_path / "a.json").unlink()
        with pytest.raises(FileNotFoundError, match=r"no \.json or \.jsonl files"):
            load_dataset(str(tmp_path))
        return
    whole = load_dataset(str(tmp_path), split="train")
    parts = [[r["text"] for r in split_dataset_by_node(whole, r, 3)] for r in range(3)]
    assert [text for part in parts for text in part] == [str(i) for i in range(rows)]
    assert [len(p) for p in parts] == [rows // 3 + (r < rows % 3) for r in range(3)]
    assert [r["text"] for r in whole.skip(rows - 1)] == [str(rows - 1)]
