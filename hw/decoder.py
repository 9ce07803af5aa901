"""QLC decoder: 32-bit serial-layout word stream in, 8-bit symbol stream out, 1 symbol per clock.

A packet starts with its symbol count on ``n`` and ends after that many symbols; the rest of the
last word (the encoder's zero padding) is dropped, so the next packet starts on a word boundary.

Pipeline:

1. **Prefix parse + length select** (the only loop): a two-word window ``w0:w1`` and a bit
   pointer ``pos`` in ``w0``. Each clock the 3 prefix bits at ``pos`` pick a region register
   (8 x {literal, width, base}, plain registers so the lookup is combinational) and
   ``pos += 3 + width``; crossing the end of ``w0`` pops it. The window refills from ``i`` one
   word per clock whenever ``w1`` is free (``i.ready`` is a register, no combinational path), and
   a code is at most 11 bits, so the loop never waits for words when the source keeps up.
2. **Payload extract** -- the 8 bits after the prefix, shifted right by ``8 - width``;
   ``rank = base + payload`` addresses the rank LUT (block RAM, synchronous read). ``rank >=
   num_ranked`` in a ranked region (an empty region, a rank past the table) is illegal.
3. **LUT remap** -- ``symbol = literal ? payload : rank_lut[rank]`` into the output register.
   An illegal codeword reaching this stage is not emitted: ``error`` rises and the decoder stops
   (no beat accepted or sent) until reset.

Tables: region registers, rank LUT and rank count start as ``book`` (reset-time init; reset does
not touch them, like the memory) and are rewritten through ``tw`` when no packet is in flight.
"""

from __future__ import annotations

from amaranth import Cat, Module, Mux, Signal
from amaranth.lib import memory, stream, wiring
from amaranth.lib.wiring import In, Out

from golden.codebook import (
    ALPHABET,
    MAX_CODE_LENGTH,
    MAX_WIDTH,
    PREFIX_BITS,
    RANK_COUNT_BITS,
    REGION_BASE_BITS,
    REGION_WORD_BITS,
    Codebook,
)
from hw.tables import (
    COUNT_BITS,
    WIDTH_BITS,
    WORD_BITS,
    Mem,
    RegionEntry,
    SymbolLayout,
    TableWriteLayout,
    default_book,
)

RANK_BITS = 10  # base (<= 256) + payload (<= 255)


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
        regions = [
            Signal(REGION_WORD_BITS, init=w, reset_less=True, name=f"region{p}")
            for p, w in enumerate(self.book.region_words())
        ]
        num_ranked = Signal(RANK_COUNT_BITS, init=self.book.num_ranked, reset_less=True)
        m.submodules.rank_lut = lut = memory.Memory(
            shape=8, depth=ALPHABET, init=self.book.rank_words()
        )
        rd = lut.read_port()
        wr = lut.write_port()

        err = Signal()
        active = Signal()
        remaining = Signal(COUNT_BITS)
        w0, w1 = Signal(WORD_BITS), Signal(WORD_BITS)
        h0, h1 = Signal(), Signal()  # w0 / w1 hold a word (h1 implies h0)
        pos = Signal(range(WORD_BITS))
        s1_valid, s1_last, s1_literal = Signal(), Signal(), Signal()
        s1_raw, s1_width = Signal(MAX_WIDTH), Signal(WIDTH_BITS)
        s1_base = Signal(REGION_BASE_BITS)
        s2_valid, s2_last, s2_literal, s2_illegal = Signal(), Signal(), Signal(), Signal()
        s2_payload = Signal(MAX_WIDTH)

        # table writes, only with no packet in flight; they win over a new packet's count
        tw = self.tw.payload
        tw_ready = ~active & ~s1_valid & ~s2_valid
        tw_take = self.tw.valid & tw_ready
        m.d.comb += [
            self.tw.ready.eq(tw_ready),
            wr.addr.eq(tw.addr),
            wr.data.eq(tw.data),
            wr.en.eq(tw_take & (tw.mem == Mem.RANK)),
        ]
        with m.If(tw_take & (tw.mem == Mem.REGION)), m.Switch(tw.addr):
            for p, reg in enumerate(regions):
                with m.Case(p):
                    m.d.sync += reg.eq(tw.data)
        with m.If(tw_take & (tw.mem == Mem.COUNT)):
            m.d.sync += num_ranked.eq(tw.data)

        # stage 3 (output) and stage 2 free flags: everything freezes once err is set
        s2_free = ~err & ~(s2_valid & s2_illegal) & (~s2_valid | self.o.ready)
        s1_free = ~s1_valid | s2_free

        # stage 1: prefix parse + length select
        head = Signal(MAX_CODE_LENGTH)  # the 11 stream bits at pos, first bit at the top
        region = Signal(REGION_WORD_BITS)
        entry = RegionEntry(region)
        end = Signal(range(2 * WORD_BITS))
        at = Signal(range(2 * WORD_BITS))
        m.d.comb += [
            at.eq(2 * WORD_BITS - MAX_CODE_LENGTH - pos),
            head.eq(Cat(w1, w0).bit_select(at, MAX_CODE_LENGTH)),
            end.eq(pos + PREFIX_BITS + entry.width),
        ]
        with m.Switch(head[MAX_WIDTH:]):
            for p, reg in enumerate(regions):
                with m.Case(p):
                    m.d.comb += region.eq(reg)
        last = remaining == 1
        parse = active & s1_free & h0 & (h1 | (end <= WORD_BITS))
        pop1 = parse & ((end >= WORD_BITS) | last) & ~(last & (end > WORD_BITS))
        pop2 = parse & last & (end > WORD_BITS)
        take_n = self.n.valid & self.n.ready
        m.d.comb += [
            self.n.ready.eq(~active & ~err & ~self.tw.valid),
            self.i.ready.eq(~h1 & ~err),
        ]
        with m.If(take_n):
            m.d.sync += [active.eq(self.n.payload != 0), remaining.eq(self.n.payload)]
        with m.If(s1_free):
            m.d.sync += s1_valid.eq(parse)
        with m.If(parse):
            m.d.sync += [
                remaining.eq(remaining - 1),
                active.eq(~last),
                pos.eq(end),  # mod 32: the part past w0 is the offset in the next word
                s1_last.eq(last),
                s1_literal.eq(entry.literal),
                s1_raw.eq(head[:MAX_WIDTH]),
                s1_width.eq(entry.width),
                s1_base.eq(entry.base),
            ]
            with m.If(last):
                m.d.sync += pos.eq(0)
        self._window(m, w0, w1, h0, h1, pop1, pop2)

        # stage 2: payload extract, rank, legality; the rank LUT read is stage 3's register
        shift = Signal(range(MAX_WIDTH + 1))
        payload = Signal(MAX_WIDTH)
        rank = Signal(RANK_BITS)
        m.d.comb += [
            shift.eq(MAX_WIDTH - s1_width),
            payload.eq(s1_raw >> shift),
            rank.eq(s1_base + payload),
            rd.addr.eq(rank),
            rd.en.eq(s2_free),
        ]
        with m.If(s2_free):
            m.d.sync += [
                s2_valid.eq(s1_valid),
                s2_last.eq(s1_last),
                s2_literal.eq(s1_literal),
                s2_payload.eq(payload),
                s2_illegal.eq(~s1_literal & (rank >= num_ranked)),
            ]

        # stage 3: LUT remap with literal bypass
        with m.If(s2_valid & s2_illegal):
            m.d.sync += err.eq(1)
        m.d.comb += [
            self.o.valid.eq(s2_valid & ~s2_illegal & ~err),
            self.o.payload.data.eq(Mux(s2_literal, s2_payload, rd.data)),
            self.o.payload.last.eq(s2_last),
            self.error.eq(err),
        ]
        return m

    def _window(self, m: Module, w0, w1, h0, h1, pop1, pop2) -> None:
        """Two-word FIFO: pop one or two words as the parser leaves them, push from ``i``."""
        push = self.i.valid & self.i.ready  # implies ~h1
        with m.If(pop2):
            m.d.sync += [h0.eq(0), h1.eq(0)]
        with m.Elif(pop1):
            m.d.sync += [w0.eq(w1), h0.eq(h1), h1.eq(0)]
            with m.If(push):
                m.d.sync += [w0.eq(self.i.payload), h0.eq(1)]
        with m.Elif(push):
            with m.If(h0):
                m.d.sync += [w1.eq(self.i.payload), h1.eq(1)]
            with m.Else():
                m.d.sync += [w0.eq(self.i.payload), h0.eq(1)]

