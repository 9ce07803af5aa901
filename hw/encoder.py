"""QLC encoder: 8-bit symbol stream in, 32-bit serial-layout word stream out, 1 symbol per clock.

Pipeline (every stage holds under back-pressure, so no beat is lost or repeated):

1. **LUT read** -- the accepted symbol addresses the 256-entry encoder LUT (a block RAM with a
   synchronous read port whose enable is the stage's advance, so its output holds while stalled).
2. **Align** -- the LUT entry becomes the codeword left aligned in 11 bits (prefix, then the
   payload shifted up by ``8 - width``) and its length ``3 + width``, registered.
3. **Pack** (``hw.packer``, shared with the N-lane encoder) -- the pending bits ``acc`` are left
   aligned with zeros below them (``n`` < 32), so the codeword goes in with one shift by the
   *register* ``n`` and an OR; once ``n + length >= 32`` the top 32 bits leave as a word (bit 31
   = first stream bit) and the 0..10 bits past it become the new ``acc``, a fixed shift. No
   shift depends on a value computed in the same cycle.
4. **Output register** -- the word stream ``o``; ``o.payload.bits`` counts the packet's bits and
   is final on the ``last`` word. A packet whose bits do not fill its last word takes one extra
   *flush* cycle that sends ``acc`` as it is: already zero padded.

Tables: the LUT starts as ``book`` (reset-time init) and is rewritten through ``tw`` between
packets; ``tw.ready`` is low inside a packet so a packet is always coded with one table.
"""

from __future__ import annotations

from amaranth import Cat, Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out
from zipccl.golden.codebook import (
    MAX_CODE_LENGTH,
    MAX_WIDTH,
    PREFIX_BITS,
    Codebook,
)
from zipccl.hw.packer import add_packer
from zipccl.hw.tables import (
    WORD_BITS,
    EncEntry,
    EncWordLayout,
    Mem,
    SymbolLayout,
    TableWriteLayout,
    default_book,
    encoder_lut,
    table_write_port,
)


class QLCEncoder(wiring.Component):
    """Symbols (``i``: data, last) -> serial words (``o``: data, last, bits); ``tw``: tables."""

    def __init__(self, book: Codebook | None = None) -> None:
        self.book = book or default_book()
        self.lut = encoder_lut(self.book)
        super().__init__(
            {
                "i": In(stream.Signature(SymbolLayout)),
                "o": Out(stream.Signature(EncWordLayout)),
                "tw": In(stream.Signature(TableWriteLayout)),
            }
        )

    def elaborate(self, platform) -> Module:
        m = Module()
        m.submodules.lut = lut = self.lut
        rd = lut.read_port()
        wr = lut.write_port()

        in_packet = Signal()  # a packet's first symbol is in, its last is not yet
        s1_valid, s1_last = Signal(name="s1_valid"), Signal(name="s1_last")
        s2_valid, s2_last = Signal(name="s2_valid"), Signal(name="s2_last")
        s2_code = Signal(MAX_CODE_LENGTH)  # the codeword, left aligned (first bit at the top)
        s2_length = Signal(range(MAX_CODE_LENGTH + 1))

        # table writes, only between packets; they win over a new packet's first symbol
        tw_take = table_write_port(m, self.tw, ~in_packet, [wr], Mem.ENC)

        # handshakes: each stage advances when the one after it can take its contents
        pack = add_packer(
            m,
            self.o,
            beat=WORD_BITS,
            code_bits=MAX_CODE_LENGTH,
            valid=s2_valid,
            code=s2_code,
            length=s2_length,
            last=s2_last,
        )
        s2_free = ~s2_valid | pack
        s1_free = ~s1_valid | s2_free
        take = self.i.valid & self.i.ready
        m.d.comb += [
            self.i.ready.eq(s1_free & ~tw_take),
            rd.addr.eq(self.i.payload.data),
            rd.en.eq(s1_free),
        ]

        # stage 1: LUT read
        with m.If(s1_free):
            m.d.sync += [s1_valid.eq(take), s1_last.eq(self.i.payload.last)]
        with m.If(take):
            m.d.sync += in_packet.eq(~self.i.payload.last)

        # stage 2: left-align the codeword
        entry = EncEntry(rd.data)
        shift = Signal(range(MAX_WIDTH + 1))
        m.d.comb += shift.eq(MAX_WIDTH - entry.width)
        with m.If(s2_free):
            m.d.sync += [
                s2_valid.eq(s1_valid),
                s2_last.eq(s1_last),
                s2_code.eq(Cat((entry.payload << shift)[:MAX_WIDTH], entry.prefix)),
                s2_length.eq(PREFIX_BITS + entry.width),
            ]

        # stage 3: pack below the pending bits (hw.packer), stage 4: the output register
        return m
