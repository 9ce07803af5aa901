"""The AXI4-Stream tops (hw/axis.py) under Icarus with cocotbext-axi against golden/."""

from __future__ import annotations

import pytest
from zipccl.sim.runner import have_icarus, run_module

pytestmark = [
    pytest.mark.rtl,
    pytest.mark.skipif(not have_icarus(), reason="needs Icarus Verilog: apt-get install iverilog"),
]


@pytest.mark.parametrize(
    ("kind", "lanes"), [("encoder", 1), ("decoder", 1), ("encoder", 4), ("decoder", 4)]
)
def test_axis_top_against_golden(kind: str, lanes: int, tmp_path) -> None:
    top = f"qlc_{kind}_axis" + (f"_x{lanes}" if lanes > 1 else "")
    env = {"ZIPCCL_KIND": kind, "ZIPCCL_LANES": str(lanes), "ZIPCCL_SEED": "3"}
    run_module(top, "zipccl.sim.axis_tb", tmp_path, env)
