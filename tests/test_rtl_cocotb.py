"""The cocotb suite (sim/suite.py, quick level) on the generated Verilog under Icarus Verilog."""

from __future__ import annotations

import pytest
from zipccl.sim.runner import have_icarus, run_cocotb
from zipccl.sim.suite import LEVELS, TOPS

FILL_CYCLES = 12  # the deepest pipeline fill and flush (the N-lane blocks' merge and lane stages)

pytestmark = [
    pytest.mark.rtl,
    pytest.mark.skipif(not have_icarus(), reason="needs Icarus Verilog: apt-get install iverilog"),
]


@pytest.mark.parametrize(
    ("top", "level"),
    [
        ("qlc_encoder", "quick"),
        ("qlc_decoder", "quick"),
        ("qlc_loopback", "quick"),
        ("qlc_encoder_x4", "smoke"),
        ("qlc_decoder_x4", "smoke"),
    ],
)
def test_cocotb_suite_passes(top: str, level: str, tmp_path) -> None:
    report = run_cocotb(top, level, seed=2, build=tmp_path)
    assert report["top"] == top
    assert report["symbols"] >= 9 * LEVELS[level].length_symbols
    lanes = TOPS[top].shape.lanes
    if top == "qlc_loopback":  # its cycles include the encoder's word buffering
        return
    # one packet per code length, first input to last output: N symbols per clock plus at most
    # FILL_CYCLES of pipeline fill and flush, whatever the packet length
    symbols = LEVELS[level].length_symbols
    for length, per_symbol in report["lengths"].items():
        cycles = per_symbol * symbols
        assert cycles <= 1.01 * symbols / lanes + FILL_CYCLES, (length, cycles)
