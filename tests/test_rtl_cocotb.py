"""The cocotb suite (sim/suite.py, quick level) on the generated Verilog under Icarus Verilog."""

from __future__ import annotations

import pytest

from sim.runner import have_icarus, run_cocotb
from sim.suite import LEVELS, TOPS

pytestmark = [
    pytest.mark.rtl,
    pytest.mark.skipif(not have_icarus(), reason="needs Icarus Verilog: apt-get install iverilog"),
]


@pytest.mark.parametrize(
    ("top", "level"),
    [
        ("encoder", "quick"),
        ("decoder", "quick"),
        ("loopback", "quick"),
        ("encoder_x4", "smoke"),
        ("decoder_x4", "smoke"),
    ],
)
def test_cocotb_suite_passes(top: str, level: str, tmp_path) -> None:
    report = run_cocotb(top, level, seed=2, build=tmp_path)
    assert report["top"] == top
    assert report["symbols"] >= 9 * LEVELS[level].length_symbols
    lanes = TOPS[top].shape.lanes
    # pipeline fill weighs more in the multi-lane smoke runs (256 symbols = 64 beats at x4);
    # the loopback's figure includes the encoder's word buffering
    limit = 1.01 if lanes == 1 else 1.15
    if top != "loopback":
        assert max(report["lengths"].values()) * lanes <= limit, report["lengths"]
