"""Encoder -> decoder loopback: the encoder's word stream feeds the decoder through full handshakes.

Used to verify that the two blocks agree with each other in hardware, not only with golden/. One
``tw`` stream loads the same table into both (a beat is taken when both blocks take it). A table
write applies to the packets whose count (``n``) comes after it: offer it between packets, once
every packet begun has its count, and hold symbols back while it is offered (sim/formal.py's
loopback checks prove that a write then lands with no symbol in flight and both blocks back in
their reset state, the tables and stale data aside).
"""

from __future__ import annotations

from amaranth import Module
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out
from zipccl.golden.codebook import Codebook
from zipccl.hw.decoder import QLCDecoder
from zipccl.hw.encoder import QLCEncoder
from zipccl.hw.multilane import QLCDecoderN, QLCEncoderN, lane_layout
from zipccl.hw.tables import COUNT_BITS, SymbolLayout, TableWriteLayout


class QLCLoopback(wiring.Component):
    """Symbols in (``i``), symbol counts (``n``), symbols out (``o``), shared table load;
    single-lane blocks, or the N-lane ones of hw/multilane.py when ``lanes`` is given."""

    def __init__(self, book: Codebook | None = None, lanes: int | None = None) -> None:
        self.book, self.lanes = book, lanes
        if lanes is None:
            self.enc, self.dec = QLCEncoder(book), QLCDecoder(book)
        else:
            self.enc, self.dec = QLCEncoderN(lanes, book), QLCDecoderN(lanes, book)
        symbols = SymbolLayout if lanes is None else lane_layout(lanes)
        super().__init__(
            {
                "i": In(stream.Signature(symbols)),
                "n": In(stream.Signature(COUNT_BITS)),
                "o": Out(stream.Signature(symbols)),
                "tw": In(stream.Signature(TableWriteLayout)),
                "error": Out(1),
            }
        )

    def elaborate(self, platform) -> Module:
        m = Module()
        m.submodules.enc, m.submodules.dec = enc, dec = self.enc, self.dec
        wiring.connect(m, wiring.flipped(self.i), enc.i)
        wiring.connect(m, wiring.flipped(self.n), dec.n)
        wiring.connect(m, dec.o, wiring.flipped(self.o))
        m.d.comb += [
            dec.i.payload.eq(enc.o.payload.data),
            dec.i.valid.eq(enc.o.valid),
            enc.o.ready.eq(dec.i.ready),
            enc.tw.payload.eq(self.tw.payload),
            dec.tw.payload.eq(self.tw.payload),
            enc.tw.valid.eq(self.tw.valid & dec.tw.ready),
            dec.tw.valid.eq(self.tw.valid & enc.tw.ready),
            self.tw.ready.eq(enc.tw.ready & dec.tw.ready),
            self.error.eq(dec.error),
        ]
        return m
