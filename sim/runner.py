"""Build one block's Verilog with Icarus and run the cocotb suite on it (cocotb 2 runner)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from cocotb_tools.runner import get_results, get_runner

from hw.generate import write_verilog
from sim.suite import TOPS

ROOT = Path(__file__).resolve().parent.parent
INSTALL_HINT = (
    "Icarus Verilog (iverilog, vvp) not found: install it with `sudo apt-get install -y iverilog`"
)


class SimFailure(RuntimeError):
    """The cocotb suite failed (a mismatch against golden/, a stall, or no report)."""


def have_icarus() -> bool:
    return shutil.which("iverilog") is not None and shutil.which("vvp") is not None


def run_cocotb(top: str, level: str, seed: int, build: Path) -> dict:
    """Generate, compile and simulate ``top``; returns its suite report or raises SimFailure."""
    if not have_icarus():
        raise SimFailure(INSTALL_HINT)
    name = TOPS[top].verilog
    work = (build / top).resolve()
    source = write_verilog(name, work)
    report = work / "report.json"
    report.unlink(missing_ok=True)
    runner = get_runner("icarus")
    runner.build(
        sources=[source], hdl_toplevel=name, build_dir=work, timescale=("1ns", "1ps"),
        always=True,
    )
    pythonpath = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    results = runner.test(
        test_module="sim.cocotb_suite",
        hdl_toplevel=name,
        build_dir=work,
        test_dir=work,
        extra_env={
            "ZIPCCL_TOP": top,
            "ZIPCCL_LEVEL": level,
            "ZIPCCL_SEED": str(seed),
            "ZIPCCL_REPORT": str(report),
            "PYTHONPATH": pythonpath,
        },
    )
    _, failed = get_results(results)
    if failed or not report.exists():
        raise SimFailure(f"cocotb suite failed on {name} (log above, results in {results})")
    return json.loads(report.read_text())
