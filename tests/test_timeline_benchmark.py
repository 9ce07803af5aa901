"""benchmarks/investigations/timeline.py's probe stays in step with the kernels: every stamp's
anchor is found exactly once in the current csrc/ (a kernel edit that moves one fails here, on
CPU, instead of silently timing the wrong point on the GPU machine), and a missing anchor is
refused."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

TIMELINE = Path(__file__).resolve().parents[1] / "benchmarks" / "investigations" / "timeline.py"


def _timeline():
    spec = importlib.util.spec_from_file_location("timeline", TIMELINE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("timeline", module)
    spec.loader.exec_module(module)
    return module


def test_every_stamp_lands_once(tmp_path: Path) -> None:
    timeline = _timeline()
    codec = timeline.patch(timeline.CSRC, tmp_path / "csrc")
    text = {name: (codec.parent / name).read_text() for name in ("sample.cuh", "encode.cuh")}
    for stamp in timeline.STAMPS:
        mark = f"STAMP_{stamp.kind}({stamp.slot});"
        assert text[stamp.file].count(mark) == 1, stamp.name
        line = next(ln for ln in text[stamp.file].splitlines() if mark in ln)
        assert line.strip().endswith(mark), f"{stamp.name}: the stamp shares a line: {line!r}"
    assert codec.read_text().startswith(timeline.PRELUDE)
    assert len({s.slot for s in timeline.STAMPS}) == len(timeline.STAMPS) <= timeline.SLOTS


def test_a_missing_anchor_is_refused(tmp_path: Path) -> None:
    timeline = _timeline()
    src = tmp_path / "src"
    src.mkdir()
    for name in ("codec.cu", "sample.cuh", "encode.cuh"):
        (src / name).write_text("// nothing to stamp\n")
    with pytest.raises(ValueError, match="anchor of 'table: first CTA in'"):
        timeline.patch(src, tmp_path / "dst")
