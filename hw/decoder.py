"""QLC decoder: 32-bit serial-layout word stream in, 8-bit symbol stream out, 1 symbol per clock.

A packet starts with its symbol count on ``n`` and ends after that many symbols; the rest of the
last word is its padding, which must be zero (otherwise ``error``), and the next packet starts on
a word boundary. An illegal codeword (an empty region, a rank past the table) raises ``error``
and stops the decoder until reset; nothing after it is emitted.

This is the N-lane decoder of hw/multilane.py at N = 1 with the plain symbol layout: a ring of
four words whose every bit offset carries the registered length of a code starting there (its
3 prefix bits through the 8 region widths), so the parse loop is ``pos += length[pos]`` -- a mux
over the ring and an add, with the region lookup out of it -- then the head cut at ``pos``,
region lookup, rank LUT (block RAM) with literal bypass, and legality, each a register stage.

Tables: region registers, rank LUT and rank count start as ``book`` (reset-time init; reset does
not touch them, like the memory) and are rewritten through ``tw`` when no packet is in flight.
"""

from __future__ import annotations

from amaranth import Module
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from golden.codebook import Codebook
from hw.multilane import QLCDecoderN
from hw.tables import (
    COUNT_BITS,
    WORD_BITS,
    SymbolLayout,
    TableWriteLayout,
    default_book,
)


class QLCDecoder(wiring.Component):
    """Counts (``n``) and serial words (``i``) -> symbols (``o``); ``tw`` loads tables."""

    def __init__(self, book: Codebook | None = None) -> None:
        self.book = book or default_book()
        super().__init__(
            {
                "n": In(stream.Signature(COUNT_BITS)),
                "i": In(stream.Signature(WORD_BITS)),
                "o": Out(stream.Signature(SymbolLayout)),
                "tw": In(stream.Signature(TableWriteLayout)),
                "error": Out(1),
            }
        )

    def elaborate(self, platform) -> Module:
        m = Module()
        m.submodules.core = core = QLCDecoderN(1, self.book)
        for name in ("n", "i", "tw"):
            wiring.connect(m, wiring.flipped(getattr(self, name)), getattr(core, name))
        m.d.comb += [
            self.o.valid.eq(core.o.valid),
            core.o.ready.eq(self.o.ready),
            self.o.payload.data.eq(core.o.payload.data),
            self.o.payload.last.eq(core.o.payload.last),
            self.error.eq(core.error),
        ]
        return m
