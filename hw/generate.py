"""Verilog of the QLC blocks for FPGA/ASIC flows, plus ``$readmemh`` images of the default table.

    python -m zipccl.hw.generate [--out out/verilog] [--table TABLE.json] [--tops TOP ...]

writes ``qlc_encoder.v``, ``qlc_decoder.v``, ``qlc_loopback.v``, the multi-lane blocks
``qlc_encoder_x{N}.v`` (N = 2, 4, 8, 16, 32), ``qlc_decoder_x{N}.v`` and ``qlc_loopback_x{N}.v``
(N = 2, 4, 8), the AXI4-Stream tops ``qlc_{encoder,decoder}_axis.v`` and
``qlc_{encoder,decoder}_axis_x{N}.v`` (hw/axis.py), the decoder pools (hw/pool.py)
``qlc_decoder_pool_x{E}.v`` and ``qlc_decoder_pool_axis_x{E}.v`` (E = 2, 4, 8, 12, 13), the 16-lane
encoder into the 13-engine pool ``qlc_loopback_pool.v`` (hw/loopback.py) -- their memories
initialised with the table, the reset-time default -- and ``{stem}_{enc,region,rank,count}.hex``
of that table.

The text is the same on every machine: source locations (``src`` attributes) are written
relative to the repository, or to the installed package for library code, never absolute.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path

from amaranth.back import verilog
from amaranth.lib import wiring
from zipccl.golden.codebook import Codebook
from zipccl.hw.axis import AxisDecoder, AxisEncoder
from zipccl.hw.decoder import QLCDecoder
from zipccl.hw.encoder import QLCEncoder
from zipccl.hw.loopback import LOOPBACK_POOL, QLCLoopback
from zipccl.hw.multilane import ENCODER_ONLY_LANES, MULTI_LANES, QLCDecoderN, QLCEncoderN
from zipccl.hw.pool import POOL_ENGINES, QLCDecoderPool
from zipccl.hw.tables import default_book

TOPS: dict[str, Callable[[Codebook | None], wiring.Component]] = {
    "qlc_encoder": QLCEncoder,
    "qlc_decoder": QLCDecoder,
    "qlc_loopback": QLCLoopback,
    **{f"qlc_encoder_x{n}": partial(QLCEncoderN, n) for n in (*MULTI_LANES, *ENCODER_ONLY_LANES)},
    **{f"qlc_decoder_x{n}": partial(QLCDecoderN, n) for n in MULTI_LANES},
    **{f"qlc_loopback_x{n}": partial(QLCLoopback, lanes=n) for n in MULTI_LANES},
    "qlc_loopback_pool": partial(QLCLoopback, lanes=LOOPBACK_POOL[0], engines=LOOPBACK_POOL[1]),
    **{f"qlc_decoder_pool_x{n}": partial(QLCDecoderPool, n) for n in POOL_ENGINES},
    "qlc_encoder_axis": partial(AxisEncoder, 1),
    "qlc_decoder_axis": partial(AxisDecoder, 1),
    **{f"qlc_encoder_axis_x{n}": partial(AxisEncoder, n) for n in MULTI_LANES},
    **{f"qlc_decoder_axis_x{n}": partial(AxisDecoder, n) for n in MULTI_LANES},
    **{f"qlc_decoder_pool_axis_x{n}": partial(AxisDecoder, n, pool=True) for n in POOL_ENGINES},
}
# the folder that holds the zipccl package: sw/ of a checkout (whose zipccl/hw links to hw/), or
# site-packages; source locations are written relative to it (zipccl/hw/encoder.py), alike for both
ROOT = Path(__file__).parents[2]
# a source path up to an installed package's top (site/dist-packages; wherever the environment
# lies, the repository included), then up to ROOT
_PACKAGES_PREFIX = re.compile(r"(?<=[\"|])[^\"|]*[/\\](?:site|dist)-packages[/\\]")
_ROOT_PREFIX = re.compile(re.escape(f"{ROOT}{os.sep}"))


def portable(text: str) -> str:
    """``text`` with the build machine's directories taken out of its source locations."""
    return _ROOT_PREFIX.sub("", _PACKAGES_PREFIX.sub("", text))


def verilog_text(top: str, book: Codebook | None = None) -> str:
    try:
        make = TOPS[top]
    except KeyError:
        raise ValueError(f"unknown top {top!r}; expected one of {sorted(TOPS)}") from None
    return portable(verilog.convert(make(book), name=top))


def write_verilog(top: str, out: Path, book: Codebook | None = None) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{top}.v"
    path.write_text(verilog_text(top, book))
    return path


def generate(
    out: Path,
    book: Codebook | None = None,
    tops: Sequence[str] = tuple(TOPS),
    progress: Callable[[str], None] | None = None,
) -> list[Path]:
    """The Verilog of ``tops`` (default: every top) and the table's memory images; returns the
    files written. ``progress`` hears of each file as it is written."""
    book = book or default_book()
    paths = []
    for k, top in enumerate(tops, 1):
        paths.append(write_verilog(top, out, book))
        if progress:
            progress(f"[{k}/{len(tops)}] {paths[-1]}")
    stem = (book.name or "table").replace("/", "_")
    images = list(book.write_memh(out, stem).values())
    if progress:
        progress(f"{len(images)} memory images {out / stem}_{{enc,region,rank,count}}.hex")
    return paths + images


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m zipccl.hw.generate", description=__doc__.split("\n\n")[0].replace("\n", " ")
    )
    ap.add_argument(
        "--out", type=Path, default=Path("out/verilog"), help="output folder (out/verilog/)"
    )
    ap.add_argument(
        "--table",
        type=Path,
        help="a table JSON file to initialise the memories with (default: the QLC "
        "e4m3 preset); the blocks still load any table through their tw port",
    )
    ap.add_argument(
        "--tops",
        nargs="+",
        choices=sorted(TOPS),
        default=list(TOPS),
        metavar="TOP",
        help=f"the modules to write (default: all {len(TOPS)}; the "
        "8-lane decoders take about a minute each)",
    )
    args = ap.parse_args(argv)
    book = Codebook.load(args.table) if args.table else None
    generate(args.out, book, args.tops, progress=print)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
