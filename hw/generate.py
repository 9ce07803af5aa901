"""Verilog of the QLC blocks for FPGA/ASIC flows, plus ``$readmemh`` images of the default table.

    python -m hw.generate --out build [--table TABLE.json]

writes ``qlc_encoder.v``, ``qlc_decoder.v``, ``qlc_loopback.v``, the multi-lane blocks
``qlc_encoder_x{N}.v`` (N = 2, 4, 8, 32), ``qlc_decoder_x{N}.v`` and ``qlc_loopback_x{N}.v``
(N = 2, 4, 8) -- their
memories initialised with the table, the reset-time default -- and
``{stem}_{enc,region,rank,count}.hex`` of that table.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from functools import partial
from pathlib import Path

from amaranth.back import verilog
from amaranth.lib import wiring

from golden.codebook import Codebook
from hw.decoder import QLCDecoder
from hw.encoder import QLCEncoder
from hw.loopback import QLCLoopback
from hw.multilane import ENCODER_ONLY_LANES, MULTI_LANES, QLCDecoderN, QLCEncoderN
from hw.tables import default_book

TOPS: dict[str, Callable[[Codebook | None], wiring.Component]] = {
    "qlc_encoder": QLCEncoder,
    "qlc_decoder": QLCDecoder,
    "qlc_loopback": QLCLoopback,
    **{f"qlc_encoder_x{n}": partial(QLCEncoderN, n) for n in (*MULTI_LANES, ENCODER_ONLY_LANES)},
    **{f"qlc_decoder_x{n}": partial(QLCDecoderN, n) for n in MULTI_LANES},
    **{f"qlc_loopback_x{n}": partial(QLCLoopback, lanes=n) for n in MULTI_LANES},
}


def verilog_text(top: str, book: Codebook | None = None) -> str:
    try:
        make = TOPS[top]
    except KeyError:
        raise ValueError(f"unknown top {top!r}; expected one of {sorted(TOPS)}") from None
    return verilog.convert(make(book), name=top)


def write_verilog(top: str, out: Path, book: Codebook | None = None) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{top}.v"
    path.write_text(verilog_text(top, book))
    return path


def generate(out: Path, book: Codebook | None = None) -> list[Path]:
    """Every top's Verilog and the table's memory images; returns the files written."""
    book = book or default_book()
    paths = [write_verilog(top, out, book) for top in TOPS]
    stem = (book.name or "table").replace("/", "_")
    return paths + list(book.write_memh(out, stem).values())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("build"))
    ap.add_argument("--table", type=Path, help="table JSON file (default: the QLC e4m3 preset)")
    args = ap.parse_args(argv)
    book = Codebook.load(args.table) if args.table else None
    for path in generate(args.out, book):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
