"""QLC decoder: 32-bit serial-layout word stream in, 8-bit symbol stream out, 1 symbol per clock.

A packet starts with its symbol count on ``n`` and ends after that many symbols; the rest of the
last word (the encoder's zero padding) is dropped, so the next packet starts on a word boundary.

Pipeline:

1. **Prefix parse + length select + payload extract** (the only loop): a two-word window
   ``w0:w1`` and a bit pointer ``pos`` (0..64). Each clock the 3 prefix bits at ``pos`` pick a
   region register (8 x {literal, width, base}, plain registers so the lookup is combinational)
   and ``pos += 3 + width``; the 8 bits after the prefix, shifted right by ``8 - width``, are the
   payload. Words wholly behind ``pos`` are dropped on the *next* clock (from the registered
   ``pos``), so nothing but ``pos`` itself depends on the loop. A code is at most 11 bits and
   ``pos`` stays below 43 while parsing, so after a drop the next code lies in ``w0`` and the
   refill (a word per clock whenever a slot is free; ``i.ready`` depends on registers only)
   always comes in time: the loop never waits when the source keeps up.
2. **Rank + legality** -- ``rank = base + payload`` addresses the rank LUT (block RAM,
   synchronous read); in parallel ``payload >= room`` (the region's ranks in the table) flags an
   illegal codeword (an empty region, a rank past the table).
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
        words = Signal(range(3))  # words held in w0, w1
        pos = Signal(range(2 * WORD_BITS + 1))  # bit offset of the next codeword from w0's top
        s1_valid, s1_last, s1_literal = Signal(), Signal(), Signal()
        s1_payload, s1_base = Signal(MAX_WIDTH), Signal(REGION_BASE_BITS)
        s1_room = Signal(RANK_COUNT_BITS)  # ranks the region has in the table
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

        # stage 1: prefix parse + length select. The loop is pos -> 3 bits of a 64:1 mux ->
        # region mux -> add -> pos; dropping consumed words waits for the next clock (pops come
        # from the registered pos), so no window enable hangs off the loop.
        window = Cat(w0[::-1], w1[::-1])  # stream order: bit k is the k-th bit from w0's top
        head = Signal(MAX_CODE_LENGTH)  # the 11 stream bits at pos, first bit at the top
        region = Signal(REGION_WORD_BITS)
        entry = RegionEntry(region)
        end = Signal(range(2 * WORD_BITS))
        shift = Signal(range(MAX_WIDTH + 1))
        m.d.comb += [
            head.eq(window.bit_select(pos[:6], MAX_CODE_LENGTH)[::-1]),
            end.eq(pos + PREFIX_BITS + entry.width),
            shift.eq(MAX_WIDTH - entry.width),
        ]
        with m.Switch(head[MAX_WIDTH:]):
            for p, reg in enumerate(regions):
                with m.Case(p):
                    m.d.comb += region.eq(reg)
        last = remaining == 1
        fits = Mux(words == 2, 1, (words == 1) & (end <= WORD_BITS))
        parse = active & s1_free & fits
        # after a packet's last codeword the rest of its word is padding: skip to a word boundary
        stop = Mux(end <= WORD_BITS, WORD_BITS, 2 * WORD_BITS)
        moved = Mux(parse, Mux(last, stop, end), pos)
        pops = pos[5:7]  # whole words behind pos, dropped this clock
        take_n = self.n.valid & self.n.ready
        m.d.comb += [
            self.n.ready.eq(~active & ~err & ~self.tw.valid),
            self.i.ready.eq((words - pops < 2) & ~err),
        ]
        m.d.sync += pos.eq(Cat(moved[:5], moved[5:7] - pops))
        with m.If(take_n):
            m.d.sync += [active.eq(self.n.payload != 0), remaining.eq(self.n.payload)]
        with m.If(s1_free):
            m.d.sync += s1_valid.eq(parse)
        with m.If(parse):
            m.d.sync += [
                remaining.eq(remaining - 1),
                active.eq(~last),
                s1_last.eq(last),
                s1_literal.eq(entry.literal),
                s1_payload.eq(head[:MAX_WIDTH] >> shift),
                s1_base.eq(entry.base),
                s1_room.eq(Mux(entry.base < num_ranked, num_ranked - entry.base, 0)),
            ]
        self._window(m, w0, w1, words, pops)

        # stage 2: rank and legality in parallel; the rank LUT read is stage 3's register
        rank = Signal(RANK_BITS)
        m.d.comb += [
            rank.eq(s1_base + s1_payload),
            rd.addr.eq(rank),
            rd.en.eq(s2_free),
        ]
        with m.If(s2_free):
            m.d.sync += [
                s2_valid.eq(s1_valid),
                s2_last.eq(s1_last),
                s2_literal.eq(s1_literal),
                s2_payload.eq(s1_payload),
                s2_illegal.eq(~s1_literal & (s1_payload >= s1_room)),
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

    def _window(self, m: Module, w0, w1, words, pops) -> None:
        """Two-word FIFO: drop ``pops`` words, then push from ``i`` into the first free slot."""
        push = self.i.valid & self.i.ready  # implies a free slot once the pops are done
        with m.If(pops == 1):
            m.d.sync += w0.eq(w1)
        left = Signal.like(words)
        m.d.comb += left.eq(words - pops)
        m.d.sync += words.eq(left + push)
        with m.If(push):
            with m.If(left == 0):
                m.d.sync += w0.eq(self.i.payload)
            with m.Else():
                m.d.sync += w1.eq(self.i.payload)
