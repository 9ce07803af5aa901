"""Encoder -> decoder loopback: the encoder's word stream feeds the decoder through full handshakes.

Used to verify that the two blocks agree with each other in hardware, not only with golden/. One
``tw`` stream loads the same table into both (a beat is taken when both blocks take it). A table
write applies to the packets whose count (``n``) comes after it: offer it between packets, once
every packet begun has its count, and hold symbols back while it is offered (sim/formal.py's
loopback checks prove that a write then lands with no symbol in flight and both blocks back in
their reset state, the tables and stale data aside).

With ``engines``, the decoder is hw/pool.py's pool of that many engines behind the N-lane
encoder (``qlc_loopback_pool``: N = 16, E = 13), the pool taking the encoder's beats as they
are (8 words wide at N = 16). The pool takes a packet padded to a word with the final beat's
word count (``words``), where the encoder pads it to a beat and counts its bits: the final beat
holds ceil(bits mod beat / 32) words (all of them where that is 0), every other beat all.
"""

from __future__ import annotations

from amaranth import Cat, Module, Mux, Value
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out
from zipccl.golden.codebook import Codebook
from zipccl.hw.decoder import QLCDecoder
from zipccl.hw.encoder import QLCEncoder
from zipccl.hw.multilane import QLCDecoderN, QLCEncoderN, lane_layout
from zipccl.hw.pool import QLCDecoderPool
from zipccl.hw.tables import COUNT_BITS, WORD_BITS, SymbolLayout, TableWriteLayout

LOOPBACK_POOL = (16, 13)  # encoder lanes, decoder engines: qlc_loopback_pool


class QLCLoopback(wiring.Component):
    """Symbols in (``i``), symbol counts (``n``), symbols out (``o``), shared table load;
    single-lane blocks, or the N-lane ones of hw/multilane.py when ``lanes`` is given, or the
    N-lane encoder and a pool of ``engines`` decoders (symbols out E to a beat)."""

    def __init__(
        self, book: Codebook | None = None, lanes: int | None = None, engines: int | None = None
    ) -> None:
        self.book, self.lanes, self.engines = book, lanes, engines
        self.enc: QLCEncoder | QLCEncoderN
        self.dec: QLCDecoder | QLCDecoderN | QLCDecoderPool
        if lanes is None:
            if engines is not None:
                raise ValueError("a loopback with a decoder pool needs the encoder's lanes")
            self.enc, self.dec = QLCEncoder(book), QLCDecoder(book)
        elif engines is None:
            self.enc, self.dec = QLCEncoderN(lanes, book), QLCDecoderN(lanes, book)
        else:
            encoder = QLCEncoderN(lanes, book)
            self.enc, self.dec = encoder, QLCDecoderPool(engines, book, words=encoder.words)
        symbols = SymbolLayout if lanes is None else lane_layout(lanes)
        out = symbols if engines is None else lane_layout(engines)
        super().__init__(
            {
                "i": In(stream.Signature(symbols)),
                "n": In(stream.Signature(COUNT_BITS)),
                "o": Out(stream.Signature(out)),
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
        if self.engines is None:
            m.d.comb += dec.i.payload.eq(enc.o.payload.data)
        else:
            m.d.comb += dec.i.payload.eq(pool_beat(enc.o.payload, self.enc.words))
        m.d.comb += [
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


def pool_beat(beat, words: int) -> Value:
    """The encoder's word beat (data, last, the packet's bit count) as the pool's (data, last,
    the words it holds): the final beat's words from the count (module docstring)."""
    tail = beat.bits[: (WORD_BITS * words).bit_length() - 1]  # the bits past whole beats
    held = Mux(
        beat.last & (tail != 0), (tail + WORD_BITS - 1) >> (WORD_BITS.bit_length() - 1), words
    )
    return Cat(beat.data, beat.last, held)
