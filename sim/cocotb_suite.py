"""cocotb test module: runs sim/suite.py on the generated Verilog of one block.

Configured by the runner (sim/runner.py) through the environment: ZIPCCL_TOP (a block:
qlc_encoder, qlc_decoder_x4, ...), ZIPCCL_LEVEL (smoke, quick, full), ZIPCCL_SEED, ZIPCCL_REPORT
(where the figures go as JSON).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import FallingEdge, Timer
from zipccl.sim.suite import run_suite

PERIOD_NS = 10


class CocotbPort:
    """Drive at the falling edge, sample 1 ns later (settled), the DUT clocks on the rising edge."""

    def __init__(self, dut) -> None:
        self.dut = dut
        self._handles: dict[str, object] = {}

    def _h(self, name: str):
        if name not in self._handles:
            self._handles[name] = getattr(self.dut, name)
        return self._handles[name]

    def set(self, name: str, value: int) -> None:
        self._h(name).value = int(value)

    def get(self, name: str) -> int:
        return int(self._h(name).value)

    async def settle(self) -> None:
        await Timer(1, unit="ns")

    async def tick(self) -> None:
        await FallingEdge(self.dut.clk)

    async def reset(self) -> None:
        self.dut.rst.value = 1
        await FallingEdge(self.dut.clk)
        self.dut.rst.value = 0


@cocotb.test()
async def suite(dut) -> None:
    """The whole suite on this top; the figures are written to ZIPCCL_REPORT."""
    Clock(dut.clk, PERIOD_NS, unit="ns").start()
    for name in ("i__valid", "tw__valid", "o__ready") + (
        ("n__valid",) if hasattr(dut, "n__valid") else ()
    ):
        getattr(dut, name).value = 0
    port = CocotbPort(dut)
    await FallingEdge(dut.clk)
    await port.reset()
    report = await run_suite(
        os.environ["ZIPCCL_TOP"],
        port,
        os.environ.get("ZIPCCL_LEVEL", "quick"),
        int(os.environ.get("ZIPCCL_SEED", "1")),
    )
    Path(os.environ["ZIPCCL_REPORT"]).write_text(json.dumps(report, indent=1))
