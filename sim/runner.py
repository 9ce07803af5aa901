"""Build one block's Verilog with Icarus and run the cocotb suite on it (cocotb 2 runner)."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from cocotb_tools.runner import get_results, get_runner
from zipccl.hw.generate import write_verilog
from zipccl.sim.suite import TOPS

# the folder that holds the zipccl package (sw/ of a checkout, or site-packages): the simulator's
# Python imports the cocotb test modules (zipccl.sim.*) from it
PACKAGE_ROOT = Path(__file__).parents[2]
INSTALL_HINT = (
    "Icarus Verilog (iverilog, vvp) not found: install it with `sudo apt-get install -y iverilog`"
)


class SimFailure(RuntimeError):
    """The cocotb suite failed (a mismatch against golden/, a stall, or no report)."""


def have_icarus() -> bool:
    return shutil.which("iverilog") is not None and shutil.which("vvp") is not None


def run_module(
    verilog_top: str, test_module: str, work: Path, env: dict[str, str], quiet: bool = False
) -> None:
    """Generate ``verilog_top`` (a name in hw.generate.TOPS) into ``work``, compile it with Icarus
    and run the cocotb ``test_module`` on it; raises SimFailure if a test fails. ``quiet`` sends
    the simulator's output to ``work/cocotb.log`` (its tail goes into the SimFailure)."""
    if not have_icarus():
        raise SimFailure(INSTALL_HINT)
    source = write_verilog(verilog_top, work)
    log = work / "cocotb.log" if quiet else None
    runner = get_runner("icarus")
    runner.build(
        sources=[source],
        hdl_toplevel=verilog_top,
        build_dir=work,
        timescale=("1ns", "1ps"),
        always=True,
        log_file=log,
    )
    pythonpath = os.pathsep.join(
        p for p in (str(PACKAGE_ROOT), os.environ.get("PYTHONPATH", "")) if p
    )
    results = runner.test(
        test_module=test_module,
        hdl_toplevel=verilog_top,
        build_dir=work,
        test_dir=work,
        extra_env={**env, "PYTHONPATH": pythonpath},
        log_file=log,
    )
    _, failed = get_results(results)
    if failed:
        raise SimFailure(
            f"cocotb {test_module} failed on {verilog_top} (results in {results})" + _tail(log)
        )


def _tail(log: Path | None, lines: int = 40) -> str:
    if log is None or not log.exists():
        return ""
    text = log.read_text(errors="replace").splitlines()[-lines:]
    return f"; the end of {log}:\n" + "\n".join(text)


def run_cocotb(top: str, level: str, seed: int, build: Path, quiet: bool = False) -> dict:
    """Generate, compile and simulate ``top``; returns its suite report (with the block's wall
    time in ``seconds``) or raises SimFailure."""
    began = time.monotonic()
    if top not in TOPS:
        raise ValueError(f"unknown block {top!r}; expected one of {sorted(TOPS)}")
    work = (build / top).resolve()
    report = work / "report.json"
    report.unlink(missing_ok=True)
    env = {
        "ZIPCCL_TOP": top,
        "ZIPCCL_LEVEL": level,
        "ZIPCCL_SEED": str(seed),
        "ZIPCCL_REPORT": str(report),
    }
    run_module(top, "zipccl.sim.cocotb_suite", work, env, quiet)
    if not report.exists():
        raise SimFailure(f"cocotb suite wrote no report on {top}" + _tail(work / "cocotb.log"))
    return {**json.loads(report.read_text()), "seconds": time.monotonic() - began}
