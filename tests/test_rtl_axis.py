"""The AXI4-Stream tops (hw/axis.py) under Icarus with cocotbext-axi against golden/."""

from __future__ import annotations

import pytest
from zipccl.sim.runner import have_icarus, run_module

pytestmark = [
    pytest.mark.rtl,
    pytest.mark.skipif(not have_icarus(), reason="needs Icarus Verilog: apt-get install iverilog"),
]


@pytest.mark.parametrize(
    ("block", "lanes"),
    [("encoder", 1), ("decoder", 1), ("encoder", 4), ("decoder", 4), ("decoder_pool", 4)],
)
def test_axis_top_against_golden(block: str, lanes: int, tmp_path) -> None:
    """The pool's top takes the decoder's frames: cocotbext-axi sets tlast on a frame's end."""
    top = f"qlc_{block}_axis" + (f"_x{lanes}" if lanes > 1 else "")
    kind = block.removesuffix("_pool")
    env = {"ZIPCCL_KIND": kind, "ZIPCCL_LANES": str(lanes), "ZIPCCL_SEED": "3"}
    run_module(top, "zipccl.sim.axis_tb", tmp_path, env)
