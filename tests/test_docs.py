"""The documents' Python code runs as written: every ```python block of README.md and docs/*.md,
each in a fresh interpreter on CPU, unless the line right before its fence is
``<!-- not run in CI: REASON -->`` (a GPU, several processes, hardware tools); and the README's
torchrun example on two gloo processes."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```python\n(.*?)^```\n", re.MULTILINE | re.DOTALL)
SKIP = re.compile(r"<!-- not run in CI: (.+?) -->\s*$")
TIMEOUT_S = 120  # a block is a few seconds of work; the limit only turns a hang into a failure


def blocks() -> list[tuple[str, str | None, str]]:
    """(id, reason it is skipped or None, code) of every ```python block in the documents."""
    found = []
    for doc in DOCS:
        text = doc.read_text()
        for match in FENCE.finditer(text):
            before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
            skip = SKIP.search(before)
            line = text.count("\n", 0, match.start()) + 1
            found.append(
                (f"{doc.relative_to(ROOT)}:{line}", skip.group(1) if skip else None, match[1])
            )
    return found


def _env() -> dict[str, str]:
    """The checkout's package first on the path; CPU only, one thread per process."""
    path = os.pathsep.join(p for p in (str(ROOT / "sw"), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}


def test_the_documents_have_code() -> None:
    run = [b for b in blocks() if b[1] is None]
    assert len(run) >= 4, [b[0] for b in blocks()]


@pytest.mark.parametrize(("where", "skip", "code"), [pytest.param(*b, id=b[0]) for b in blocks()])
def test_code_block_runs(where: str, skip: str | None, code: str, tmp_path: Path) -> None:
    if skip is not None:
        pytest.skip(f"{where}: {skip}")
    run = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,  # blocks that write files (Calibrator.save) write them here
        env=_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert run.returncode == 0, f"{where} failed:\n{run.stderr[-3000:]}"


@pytest.mark.timeout(240)
def test_the_allreduce_example_runs_on_two_processes(tmp_path: Path) -> None:
    """`torchrun --nproc-per-node 2 examples/allreduce.py`, as the README shows it."""
    torchrun = shutil.which("torchrun") or str(Path(sys.executable).parent / "torchrun")
    run = subprocess.run(
        [
            torchrun,
            "--standalone",  # a free local port, so that runs beside each other do not collide
            "--nproc-per-node",
            "2",
            str(ROOT / "examples" / "allreduce.py"),
        ],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=200,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    for rank in (0, 1):
        assert f"rank {rank}/2: all-reduce of 1,048,576 BF16 values bit-exact" in run.stdout
