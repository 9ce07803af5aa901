"""Unmodified training scripts (examples/frameworks/) under the zipccl-run launcher on 2 CPU
processes (4 for the Megatron-style one: tensor x data parallel), each compared bit for bit
with the same script under plain torchrun (gloo).

``ZIPCCL_MODE=always``: every float collective the frameworks make goes through zipccl's
compressed protocols, and ``ZIPCCL_LOG=summary``'s report must show compressed calls -- so a
launcher that left the groups plain gloo fails here. Each framework is skipped where it is not
installed (the ``frameworks`` extra installs them all).
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

EXAMPLES = Path(__file__).parent.parent / "examples" / "frameworks"
WAIT_S = 240  # one launch; the groups' own timeout is torch's (far longer): a hang fails here


def _launch(launcher: str, script: str, out: str, cwd: Path, nproc: int, **env: str) -> str:
    """stderr of ``launcher`` (a module: zipccl.run or torch.distributed.run) running ``script
    out`` on ``nproc`` processes."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("ZIPCCL_")}
    done = subprocess.run(
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
    assert done.returncode == 0, done.stderr[-6000:]
    return done.stderr


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
