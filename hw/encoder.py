"""QLC encoder: 8-bit symbol stream in, 32-bit serial-layout word stream out, 1 symbol per clock.

Pipeline (every stage holds under back-pressure, so no beat is lost or repeated):

1. **LUT read** -- the accepted symbol addresses the 256-entry encoder LUT (a block RAM with a
   synchronous read port whose enable is the stage's advance, so its output holds while stalled).
2. **Pack** -- the codeword ``prefix << width | payload`` (3..11 bits) is appended below the
   pending bits ``acc`` (right aligned, ``n`` < 32 of them); once ``n + length >= 32`` the top 32
   bits leave as a word (bit 31 = first stream bit) and the rest stay. Garbage above the pending
   bits is never masked: every extraction takes only bits below ``n + length``.
3. **Output register** -- the word stream ``o``; ``o.payload.bits`` counts the packet's bits and
   is final on the ``last`` word. A packet whose bits do not fill its last word takes one extra
   *flush* cycle that pads that word with zeros.

Tables: the LUT starts as ``book`` (reset-time init) and is rewritten through ``tw`` between
packets; ``tw.ready`` is low inside a packet so a packet is always coded with one table.
"""

from __future__ import annotations

from amaranth import Cat, Module, Signal
from amaranth.lib import memory, stream, wiring
from amaranth.lib.wiring import In, Out

from golden.codebook import ALPHABET, ENC_WORD_BITS, MAX_CODE_LENGTH, PREFIX_BITS, Codebook
from hw.tables import (
    COUNT_BITS,
    WORD_BITS,
    EncEntry,
    EncWordLayout,
    Mem,
    SymbolLayout,
    TableWriteLayout,
    default_book,
)


class QLCEncoder(wiring.Component):
    """Symbols (``i``: data, last) -> serial words (``o``: data, last, bits); ``tw``: tables."""

    def __init__(self, book: Codebook | None = None) -> None:
        self.book = book or default_book()
        super().__init__(
            {
                "i": In(stream.Signature(SymbolLayout)),
                "o": Out(stream.Signature(EncWordLayout)),
                "tw": In(stream.Signature(TableWriteLayout)),
            }
        )

    def elaborate(self, platform) -> Module:
        m = Module()
        m.submodules.lut = lut = memory.Memory(
            shape=ENC_WORD_BITS, depth=ALPHABET, init=self.book.encoder_words()
        )
        rd = lut.read_port()
        wr = lut.write_port()

        in_packet = Signal()  # a packet's first symbol is in, its last is not yet
        s1_valid, s1_last = Signal(), Signal()
        acc = Signal(WORD_BITS)  # pending bits, right aligned
        n = Signal(range(WORD_BITS))  # number of pending bits
        total = Signal(COUNT_BITS)  # bits of the packet so far
        flush = Signal()  # the packet ended with n > 0 pending bits: pad and send them
        o_valid = Signal()
        o_data, o_last, o_bits = Signal(WORD_BITS), Signal(), Signal(COUNT_BITS)

        # table writes, only between packets; they win over a new packet's first symbol
        tw_take = self.tw.valid & ~in_packet
        m.d.comb += [
            self.tw.ready.eq(~in_packet),
            wr.addr.eq(self.tw.payload.addr),
            wr.data.eq(self.tw.payload.data),
            wr.en.eq(tw_take & (self.tw.payload.mem == Mem.ENC)),
        ]

        # stage 1: LUT read
        out_free = ~o_valid | self.o.ready
        pack = s1_valid & out_free & ~flush
        s1_free = ~s1_valid | pack
        take = self.i.valid & self.i.ready
        m.d.comb += [
            self.i.ready.eq(s1_free & ~tw_take),
            rd.addr.eq(self.i.payload.data),
            rd.en.eq(s1_free),
        ]
        with m.If(s1_free):
            m.d.sync += [s1_valid.eq(take), s1_last.eq(self.i.payload.last)]
        with m.If(take):
            m.d.sync += in_packet.eq(~self.i.payload.last)

        # stage 2: pack
        entry = EncEntry(rd.data)
        length = Signal(range(MAX_CODE_LENGTH + 1))
        code = Signal(MAX_CODE_LENGTH)
        joined = Signal(WORD_BITS + MAX_CODE_LENGTH)
        end = Signal(range(WORD_BITS + MAX_CODE_LENGTH))
        over = Signal(range(MAX_CODE_LENGTH))
        pad = Signal(range(WORD_BITS + 1))
        m.d.comb += [
            length.eq(PREFIX_BITS + entry.width),
            code.eq((entry.prefix << entry.width) | entry.payload),
            joined.eq((acc << length) | code),
            end.eq(n + length),
            over.eq(end - WORD_BITS),
            pad.eq(WORD_BITS - n),
        ]
        with m.If(self.o.ready):
            m.d.sync += o_valid.eq(0)
        with m.If(flush & out_free):
            m.d.sync += [
                o_valid.eq(1),
                o_data.eq(acc << pad),
                o_last.eq(1),
                o_bits.eq(total),
                flush.eq(0),
                n.eq(0),
                total.eq(0),
            ]
        with m.Elif(pack):
            m.d.sync += [acc.eq(joined), total.eq(total + length)]
            with m.If(end >= WORD_BITS):
                aligned = end == WORD_BITS
                m.d.sync += [
                    o_valid.eq(1),
                    o_data.eq(joined >> over),
                    o_last.eq(s1_last & aligned),
                    o_bits.eq(total + length),
                    n.eq(over),
                    flush.eq(s1_last & ~aligned),
                ]
                with m.If(s1_last & aligned):
                    m.d.sync += total.eq(0)
            with m.Else():
                m.d.sync += [n.eq(end), flush.eq(s1_last)]
        m.d.comb += [
            self.o.valid.eq(o_valid),
            self.o.payload.eq(Cat(o_data, o_last, o_bits)),
        ]
        return m
