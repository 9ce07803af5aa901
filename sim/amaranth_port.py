"""Run sim/bench.py scenarios in Amaranth's Python simulator (the fast unit-test path)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from amaranth import ResetInserter, Signal
from amaranth.lib import wiring
from amaranth.sim import Simulator
from zipccl.sim.bench import Port

T = TypeVar("T")


class AmaranthPort:
    """Port over a Component's members, addressed by their Verilog names (``i__valid``)."""

    def __init__(self, ctx, dut: wiring.Component, rst: Signal) -> None:
        self.ctx, self.dut, self.rst = ctx, dut, rst
        self._cache: dict[str, object] = {}

    def _sig(self, name: str):
        if name not in self._cache:
            obj = self.dut
            for part in name.split("__"):
                obj = getattr(obj, part)
            self._cache[name] = obj.as_value() if hasattr(obj, "as_value") else obj
        return self._cache[name]

    def set(self, name: str, value: int) -> None:
        self.ctx.set(self._sig(name), int(value))

    def get(self, name: str) -> int:
        return int(self.ctx.get(self._sig(name)))

    async def settle(self) -> None:
        """Testbench reads already see settled combinational logic."""

    async def tick(self) -> None:
        await self.ctx.tick()

    async def reset(self) -> None:
        self.ctx.set(self.rst, 1)
        await self.ctx.tick()
        self.ctx.set(self.rst, 0)


def run_amaranth(dut: wiring.Component, body: Callable[[Port], Awaitable[T]]) -> T:
    """Simulate ``dut`` (with a synchronous reset the body can pulse) and return body's result."""
    rst = Signal()
    sim = Simulator(ResetInserter(rst)(dut))
    sim.add_clock(1e-8)
    result: list[T] = []

    async def testbench(ctx) -> None:
        result.append(await body(AmaranthPort(ctx, dut, rst)))

    sim.add_testbench(testbench)
    sim.run()
    return result[0]
