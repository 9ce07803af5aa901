"""The cocotb suite (sim/suite.py, quick level) on the generated Verilog under Icarus Verilog."""

from __future__ import annotations

import pytest

from sim.runner import have_icarus, run_cocotb
from sim.suite import LEVELS

pytestmark = [
    pytest.mark.rtl,
    pytest.mark.skipif(not have_icarus(), reason="needs Icarus Verilog: apt-get install iverilog"),
]


@pytest.mark.parametrize("top", ["encoder", "decoder", "loopback"])
def test_cocotb_suite_passes(top: str, tmp_path) -> None:
    report = run_cocotb(top, "quick", seed=2, build=tmp_path)
    lv = LEVELS["quick"]
    assert report["top"] == top
    assert report["symbols"] >= 9 * lv.length_symbols
    if top != "loopback":  # the loopback's figure includes the encoder's word buffering
        assert max(report["lengths"].values()) <= 1.01, report["lengths"]
