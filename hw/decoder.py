"""QLC decoder: 32-bit serial-layout word stream in, 8-bit symbol stream out, 1 symbol per clock.

A packet starts with its symbol count on ``n`` and ends after that many symbols; the rest of the
last word is its padding, which must be zero, and the next packet starts on a word boundary.

Pipeline:

0. **Prefix parse + length select** (the only loop): a two-word window ``w0:w1`` and a bit
   pointer ``pos`` (0..64). The loop is ``pos += 3 + width[prefix at pos]`` (a 64:1 mux of the
   3 prefix bits, the 8:1 mux of the region registers' widths, an add). Whether to parse -- the
   enable that fans out to every stage register and counter -- depends on registers only: two
   words held, or the code surely fits in ``w0`` (``pos <= 21``), or -- only when the source
   runs dry near a word's end -- the exact check registered the clock before. After a packet's
   last code, the next clock rounds ``pos`` up to a word boundary and checks the padding bits it
   skips: a 1 among them raises ``error`` once the packet's symbols have left the pipeline. Words
   wholly behind ``pos`` are dropped on the next clock (from the registered ``pos``). A code is
   at most 11 bits and ``pos`` stays below 43, so after a drop the next code lies in ``w0`` and
   the refill (a word per clock whenever a slot is free) comes in time: the loop never waits
   when the source keeps up. (A dry source costs a clock per code in the last 10 bits of a word.)
1. **Head** -- the 11 stream bits at ``pos`` (prefix + up to 8 payload bits), registered.
2. **Region** -- the prefix picks a region register (8 x {literal, width, base}); the payload is
   the 8 bits after the prefix shifted right by ``8 - width``; ``room`` is how many ranks the
   region has in the table.
3. **Rank + legality** -- ``rank = base + payload`` addresses the rank LUT (block RAM,
   synchronous read); in parallel ``payload >= room`` in a ranked region (an empty region, a rank
   past the table) marks an illegal codeword.
4. **LUT remap** -- ``symbol = literal ? payload : rank_lut[rank]`` is the output. An illegal
   codeword reaching it is not emitted: ``error`` rises and the decoder stops (no beat accepted
   or sent) until reset.

Tables: region registers, rank LUT and rank count start as ``book`` (reset-time init; reset does
not touch them, like the memory) and are rewritten through ``tw`` when no packet is in flight.
"""

from __future__ import annotations

from amaranth import C, Cat, Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out
from zipccl.golden.codebook import (
    MAX_CODE_LENGTH,
    MAX_WIDTH,
    PREFIX_BITS,
    RANK_COUNT_BITS,
    REGION_BASE_BITS,
    REGION_WORD_BITS,
    Codebook,
)
from zipccl.hw.tables import (
    COUNT_BITS,
    WIDTH_BITS,
    WORD_BITS,
    DecoderTables,
    RegionEntry,
    SymbolLayout,
    TableWriteLayout,
    default_book,
)

RANK_BITS = 10  # base (<= 256) + payload (<= 255)
SURE_FIT = WORD_BITS - MAX_CODE_LENGTH  # pos <= 21: any code ends inside w0


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
        tables = DecoderTables(m, self.book)
        regions, num_ranked = tables.regions, tables.num_ranked
        rd = tables.lut.read_port()
        wr = tables.lut.write_port()

        err = Signal()
        s1_valid, s1_last, s1_head = Signal(), Signal(), Signal(MAX_CODE_LENGTH)
        s2_valid, s2_last, s2_literal = Signal(), Signal(), Signal()
        s2_payload, s2_base = Signal(MAX_WIDTH), Signal(REGION_BASE_BITS)
        s2_room = Signal(RANK_COUNT_BITS)
        s3_valid, s3_last, s3_literal, s3_illegal = Signal(), Signal(), Signal(), Signal()
        s3_payload = Signal(MAX_WIDTH)

        # table writes, only with no packet in flight; they win over a new packet's count
        busy, bad_padding = Signal(), Signal()
        drained = ~s1_valid & ~s2_valid & ~s3_valid
        idle = ~busy & ~bad_padding & drained
        tables.write_port(m, self.tw, idle, wr)

        # handshakes: everything freezes once err is set
        s3_free = ~err & ~(s3_valid & s3_illegal) & (~s3_valid | self.o.ready)
        s2_free = ~s2_valid | s3_free
        s1_free = ~s1_valid | s2_free

        # stage 0: the parse loop
        parse, head, last, padding_set = self._parser(m, regions, s1_free, busy, err, bad_padding)
        with m.If(padding_set):
            m.d.sync += bad_padding.eq(1)
        with m.If(bad_padding & drained):  # after the packet's last symbol
            m.d.sync += err.eq(1)
        with m.If(s1_free):
            m.d.sync += [s1_valid.eq(parse), s1_last.eq(last), s1_head.eq(head)]

        # stage 1 -> 2: region lookup, payload extract, the region's ranks in the table
        region = Signal(REGION_WORD_BITS)
        entry = RegionEntry(region)
        with m.Switch(s1_head[MAX_WIDTH:]):
            for p, reg in enumerate(regions):
                with m.Case(p):
                    m.d.comb += region.eq(reg)
        shift = Signal(range(MAX_WIDTH + 1))
        m.d.comb += shift.eq(MAX_WIDTH - entry.width)
        with m.If(s2_free):
            m.d.sync += [
                s2_valid.eq(s1_valid),
                s2_last.eq(s1_last),
                s2_literal.eq(entry.literal),
                s2_payload.eq(s1_head[:MAX_WIDTH] >> shift),
                s2_base.eq(entry.base),
                s2_room.eq(Mux(entry.base < num_ranked, num_ranked - entry.base, 0)),
            ]

        # stage 2 -> 3: rank and legality in parallel; the rank LUT read is stage 3's register
        rank = Signal(RANK_BITS)
        m.d.comb += [
            rank.eq(s2_base + s2_payload),
            rd.addr.eq(rank),
            rd.en.eq(s3_free),
        ]
        with m.If(s3_free):
            m.d.sync += [
                s3_valid.eq(s2_valid),
                s3_last.eq(s2_last),
                s3_literal.eq(s2_literal),
                s3_payload.eq(s2_payload),
                s3_illegal.eq(~s2_literal & (s2_payload >= s2_room)),
            ]

        # stage 4: LUT remap with literal bypass
        with m.If(s3_valid & s3_illegal):
            m.d.sync += err.eq(1)
        m.d.comb += [
            self.o.valid.eq(s3_valid & ~s3_illegal & ~err),
            self.o.payload.data.eq(Mux(s3_literal, s3_payload, rd.data)),
            self.o.payload.last.eq(s3_last),
            self.error.eq(err),
        ]
        return m

    def _parser(self, m: Module, regions, s1_free, busy, err, bad_padding):
        """The window and the loop; returns the (parse, head, last, padding_set) signals."""
        active = busy  # a packet's count is taken and symbols remain
        remaining = Signal(COUNT_BITS)
        last = Signal()  # remaining == 1, kept as a register
        w0, w1 = Signal(WORD_BITS), Signal(WORD_BITS)
        words = Signal(range(3))  # words held in w0, w1
        pos = Signal(range(2 * WORD_BITS + 1))  # bit offset of the next codeword from w0's top
        fits_late = Signal()  # the exact fit check of the previous clock still holds

        # the window: drop the words behind pos, push into the first free slot
        pops = pos[5:7]
        left = Signal.like(words)
        next_w0, next_w1 = Signal(WORD_BITS), Signal(WORD_BITS)
        push = self.i.valid & self.i.ready
        m.d.comb += [
            self.i.ready.eq((words - pops < 2) & ~err),
            left.eq(words - pops),
            next_w0.eq(Mux(pops == 1, w1, w0)),
            next_w1.eq(w1),
        ]
        with m.If(push):
            with m.If(left == 0):
                m.d.comb += next_w0.eq(self.i.payload)
            with m.Else():
                m.d.comb += next_w1.eq(self.i.payload)
        m.d.sync += [w0.eq(next_w0), w1.eq(next_w1), words.eq(left + push)]

        # the loop: prefix at pos -> region width -> pos + 3 + width
        head = Signal(MAX_CODE_LENGTH)  # the 11 stream bits at pos, first bit at the top
        window = Cat(w0[::-1], w1[::-1])  # bit k: the k-th bit from w0's top
        m.d.comb += head.eq(window.bit_select(pos[:6], MAX_CODE_LENGTH)[::-1])
        width = Signal(WIDTH_BITS)  # one 8:1 mux per width bit, over that bit of each region
        for j in range(WIDTH_BITS):
            plane = Cat(RegionEntry(r).width[j] for r in regions)
            m.d.comb += width[j].eq(plane.bit_select(head[MAX_WIDTH:], 1))
        end = Signal(range(2 * WORD_BITS))
        m.d.comb += end.eq(pos + PREFIX_BITS + width)
        fits = (words == 2) | ((words == 1) & ((pos <= SURE_FIT) | fits_late))
        parse = Signal()
        skip = Signal()  # the packet's last code was parsed: skip its padding
        m.d.comb += parse.eq(active & s1_free & fits)
        rounded = Cat(C(0, 5), pos[5:7] + (pos[:5] != 0))
        moved = Mux(parse, end, Mux(skip, rounded, pos))
        m.d.sync += [
            pos.eq(Cat(moved[:5], moved[5:7] - pops)),
            skip.eq(parse & last),
            # valid next clock only if pos and w0 stay as they are
            fits_late.eq(~parse & ~skip & (pops == 0) & (words == 1) & (end <= WORD_BITS)),
        ]

        # the padding skipped: the rest of the word holding pos, below the stream bit at pos
        padding = Mux(pos[5], w1, w0) << pos[:5]
        padding_set = skip & (pos[:5] != 0) & padding[:WORD_BITS].any()

        take_n = self.n.valid & self.n.ready
        m.d.comb += self.n.ready.eq(~active & ~err & ~bad_padding & ~self.tw.valid)
        with m.If(take_n):
            m.d.sync += [
                active.eq(self.n.payload != 0),
                remaining.eq(self.n.payload),
                last.eq(self.n.payload == 1),
            ]
        with m.If(parse):
            m.d.sync += [
                remaining.eq(remaining - 1),
                last.eq(remaining == 2),
                active.eq(~last),
            ]
        return parse, head, last, padding_set
