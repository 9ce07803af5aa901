"""QLC decoder: serial-layout word beats in, symbols out, ``lanes`` symbols per clock.

:class:`QLCDecoder` is the single-lane block (32-bit words in, one symbol per beat out);
hw.multilane's ``QLCDecoderN`` is the same design at N lanes (a beat of ``words_per_beat(N)``
words in, N symbols per beat out). A packet starts with its symbol count on ``n`` and ends after
that many symbols; the rest of its last beat is padding, which must be zero, and the next packet
starts on a beat boundary.

Why it is built this way: a code's length depends on the code before it, so the N code starts
of a clock form a chain. The chain is kept short and free of adders and wide multiplexers:

0. **Lengths at every offset** (registered, off the loop): for each bit offset ``k`` of the
   window that a code can start at, the width of the region named by the 3 bits at ``k``. It is
   computed from the window the next clock will hold (which depends on registers and the input
   beat only, never on this clock's parse), so it is a register when the loop reads it.
1. **The loop**: the bit pointer ``pos`` is one-hot. One code step is, for every position ``j``,
   an OR of the 9 terms ``at[j - L] & (width at j - L == L - 3)`` for L = 3..11: two LUT levels,
   no carry chain. N steps give the N lane starts and the end; the end, less the beat dropped,
   is the next ``pos``. Beats wholly behind ``pos`` drop on the next clock (a registered
   decision), and whether to parse depends on registers only: enough beats held for N codes of
   11 bits, or the exact check of the previous clock. After a packet's last code the next clock
   rounds ``pos`` up to a beat boundary and checks the padding bits it skips; a 1 raises
   ``error`` once the packet's symbols have left the pipeline.
2. **Head** -- per lane, the 11 stream bits at its start (an AND-OR of its one-hot start with
   the window), registered.
3. **Region** -- the prefix picks a region register (literal, width, base); the payload is the
   8 bits after the prefix shifted right by ``8 - width``; ``room`` is how many ranks the region
   has in the table.
4. **Rank + legality** -- ``rank = base + payload`` addresses the rank LUT (block RAM, one read
   port per lane); in parallel ``payload >= room`` in a ranked region marks an illegal codeword.
5. **LUT remap** -- ``symbol = literal ? payload : rank_lut[rank]``. An illegal codeword in lane
   j: the lanes before it go out (a partial beat), then ``error`` rises and the decoder stops
   (no beat accepted or sent) until reset.

Tables: region registers, rank LUT and rank count start as ``book`` (reset-time init; reset does
not touch them, like the memory) and are rewritten through ``tw`` when no packet is in flight.
"""

from __future__ import annotations

import operator
from functools import reduce

from amaranth import C, Cat, Module, Mux, Signal, Value
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
    lane_layout,
    words_per_beat,
)

RANK_BITS = 10  # base (<= 256) + payload (<= 255)
LENGTHS = range(PREFIX_BITS, MAX_CODE_LENGTH + 1)  # 3..11 bits


def one_hot_step(at: Value, length_at: list[Value]) -> Value:
    """Where one code from each set position of the one-hot ``at`` ends: bit ``j`` of the result
    is set when ``at[k]`` is and the code at ``k`` is ``j - k`` bits long (``length_at[n - 3]``:
    bit k set when the code at k is n bits long).

    Per position j an OR of the terms ``at[j - n] & length_at[n - 3][j - n]``, written as one
    vector AND and constant shift per code length: the same gates as one expression per bit,
    but compact Verilog and fast simulation."""
    return reduce(
        operator.or_, ((at & length_at[n - PREFIX_BITS][: len(at)]) << n for n in LENGTHS)
    )[: len(at) + MAX_CODE_LENGTH]


def select_bits(at: Value, window: Value, width: int) -> Value:
    """The ``width`` window bits from the one-hot position ``at``, the first at the top (bit i:
    the OR of ``at & window`` shifted by i, one vector AND per bit)."""
    return Cat(*((at & window[i : i + len(at)]).any() for i in range(width)))[::-1]


def spread_up(bits: Value, shifts: list[int]) -> Value:
    """``bits`` with each set bit copied upwards by every sum of ``shifts`` (all of 1, 2, 4, ...
    up to the width: bit j set when a bit at or below j is)."""
    for shift in shifts:
        bits = bits | (bits << shift)[: len(bits)]
    return bits


def at_most(at: Value, limit: int) -> Value:
    """The one-hot position ``at`` is <= ``limit``."""
    return at[: max(limit + 1, 0)].any() if limit >= 0 else C(0, 1)


class QLCDecoder(wiring.Component):
    """Counts (``n``) and serial words (``i``) -> symbols (``o``); ``tw`` loads tables."""

    def __init__(
        self,
        book: Codebook | None = None,
        *,
        lanes: int | None = None,
        hold: bool = False,
    ) -> None:
        """``lanes``: None for the single-lane ports, N for N-lane beats (with ``count``) of
        ``words_per_beat(N)`` words. ``hold``: a ``hold`` input that stops the parse, for a user
        that keeps ``o.ready`` high and room for the symbols already in the pipeline (the decoder
        pool's engines: their output ready is then a constant, out of the loop's logic), and a
        ``padded`` output, a one-clock pulse when a packet's last code is parsed and its padding
        found zero: a packet's verdict, which a bad padding otherwise gives only as ``error``
        some clocks after the packet's last symbol (the pool tags each packet's last beat with
        it)."""
        self.counted, self.holds = lanes is not None, hold
        self.lanes = lanes or 1
        self.words = words_per_beat(self.lanes)
        self.book = book or default_book()
        self.tables = DecoderTables(self.book)
        symbols = lane_layout(self.lanes) if self.counted else SymbolLayout
        super().__init__(
            {
                "n": In(stream.Signature(COUNT_BITS)),
                "i": In(stream.Signature(WORD_BITS * self.words)),
                "o": Out(stream.Signature(symbols)),
                "tw": In(stream.Signature(TableWriteLayout)),
                "error": Out(1),
                **({"hold": In(1), "padded": Out(1)} if hold else {}),
            }
        )

    def elaborate(self, platform) -> Module:
        m = Module()
        n_lanes = self.lanes
        lane_range = range(n_lanes)
        tables = self.tables
        m.submodules.rank_lut = tables.lut
        regions, num_ranked = tables.regions, tables.num_ranked
        rds = [tables.lut.read_port() for _ in lane_range]
        wr = tables.lut.write_port()

        err, busy, bad_padding = Signal(name="err"), Signal(name="busy"), Signal(name="bad_padding")
        s1_valid, s1_last = Signal(name="s1_valid"), Signal(name="s1_last")
        s1_count = Signal(range(n_lanes + 1), name="s1_count")
        s1_heads = [Signal(MAX_CODE_LENGTH, name=f"s1_head{j}") for j in lane_range]
        s2_valid, s2_last = Signal(name="s2_valid"), Signal(name="s2_last")
        s2_count = Signal(range(n_lanes + 1), name="s2_count")
        s2_lit = [Signal(name=f"s2_lit{j}") for j in lane_range]
        s2_pay = [Signal(MAX_WIDTH, name=f"s2_pay{j}") for j in lane_range]
        s2_base = [Signal(REGION_BASE_BITS, name=f"s2_base{j}") for j in lane_range]
        s2_room = [Signal(RANK_COUNT_BITS, name=f"s2_room{j}") for j in lane_range]
        s3_valid, s3_last = Signal(name="s3_valid"), Signal(name="s3_last")
        s3_count = Signal(range(n_lanes + 1), name="s3_count")
        s3_lit = [Signal(name=f"s3_lit{j}") for j in lane_range]
        s3_pay = [Signal(MAX_WIDTH, name=f"s3_pay{j}") for j in lane_range]
        s3_bad = [Signal(name=f"s3_bad{j}") for j in lane_range]

        # table writes, only with no packet in flight; they win over a new packet's count
        drained = ~s1_valid & ~s2_valid & ~s3_valid
        tables.write_port(m, self.tw, ~busy & ~bad_padding & drained, wr)

        # handshakes: lanes before the first illegal one go out, then everything freezes
        bad_any = Cat(*s3_bad).any()
        first_bad = Signal(range(n_lanes + 1))
        for j in reversed(lane_range):
            with m.If(s3_bad[j]):
                m.d.comb += first_bad.eq(j)
        s3_free = ~err & ~(s3_valid & bad_any) & (~s3_valid | self.o.ready)
        s2_free = ~s2_valid | s3_free
        s1_free = ~s1_valid | s2_free

        # stages 0-1: the window, the loop, the heads
        parse, heads, count, last, padding_set, padding_ok = self._parser(
            m, regions, s1_free, busy, err, bad_padding
        )
        if self.holds:
            m.d.comb += self.padded.eq(padding_ok)
        with m.If(padding_set):
            m.d.sync += bad_padding.eq(1)
        with m.If(bad_padding & drained):  # after the packet's last symbols
            m.d.sync += err.eq(1)
        with m.If(s1_free):
            m.d.sync += [s1_valid.eq(parse), s1_last.eq(last), s1_count.eq(count)]
            m.d.sync += [h.eq(v) for h, v in zip(s1_heads, heads, strict=True)]

        # stage 2: region lookup, payload extract, the region's ranks in the table (each
        # region's count of ranks, ``room``, kept in a register: a table write settles in it
        # before the next packet's first code reaches this stage)
        rooms = [Signal(RANK_COUNT_BITS, name=f"room{p}") for p in range(len(regions))]
        for reg, room in zip(regions, rooms, strict=True):
            base = RegionEntry(reg).base
            m.d.sync += room.eq(Mux(base < num_ranked, num_ranked - base, 0))
        with m.If(s2_free):
            m.d.sync += [s2_valid.eq(s1_valid), s2_last.eq(s1_last), s2_count.eq(s1_count)]
        for j in lane_range:
            region = Signal(REGION_WORD_BITS, name=f"region_of{j}")
            room = Signal(RANK_COUNT_BITS, name=f"room_of{j}")
            entry = RegionEntry(region)
            with m.Switch(s1_heads[j][MAX_WIDTH:]):
                for p, (reg, room_p) in enumerate(zip(regions, rooms, strict=True)):
                    with m.Case(p):
                        m.d.comb += [region.eq(reg), room.eq(room_p)]
            shift = Signal(range(MAX_WIDTH + 1), name=f"shift{j}")
            m.d.comb += shift.eq(MAX_WIDTH - entry.width)
            with m.If(s2_free):
                m.d.sync += [
                    s2_lit[j].eq(entry.literal),
                    s2_pay[j].eq(s1_heads[j][:MAX_WIDTH] >> shift),
                    s2_base[j].eq(entry.base),
                    s2_room[j].eq(room),
                ]

            # stage 3: rank and legality in parallel; the rank LUT read is stage 3's register
            rank = Signal(RANK_BITS, name=f"rank{j}")
            m.d.comb += [
                rank.eq(s2_base[j] + s2_pay[j]),
                rds[j].addr.eq(rank),
                rds[j].en.eq(s3_free),
            ]
            with m.If(s3_free):
                m.d.sync += [
                    s3_lit[j].eq(s2_lit[j]),
                    s3_pay[j].eq(s2_pay[j]),
                    s3_bad[j].eq((j < s2_count) & ~s2_lit[j] & (s2_pay[j] >= s2_room[j])),
                ]
        with m.If(s3_free):
            m.d.sync += [s3_valid.eq(s2_valid), s3_last.eq(s2_last), s3_count.eq(s2_count)]

        # stage 4: LUT remap with literal bypass; an illegal lane ends the beat and raises error
        with m.If(s3_valid & bad_any & ((first_bad == 0) | self.o.ready)):
            m.d.sync += err.eq(1)
        m.d.comb += [
            self.o.valid.eq(s3_valid & ~err & ~(bad_any & (first_bad == 0))),
            self.o.payload.data.eq(Cat(Mux(s3_lit[j], s3_pay[j], rds[j].data) for j in lane_range)),
            self.o.payload.last.eq(s3_last & ~bad_any),
            self.error.eq(err),
        ]
        if self.counted:
            m.d.comb += self.o.payload.count.eq(Mux(bad_any, first_bad, s3_count))
        return m

    def _parser(self, m: Module, regions, s1_free, busy, err, bad_padding):
        """The window, the per-offset widths and the one-hot loop; returns (parse, heads, count,
        last, padding_set, padding_ok): the last two pulse when a packet's padding is checked.

        ``pos`` < beat + 11 N while parsing (a beat past it drops on the next clock), so the lane
        starts lie below beat + 11 (2N - 1) and their codes inside the ``slots`` beats held."""
        n_lanes, beat = self.lanes, WORD_BITS * self.words
        reach = beat + MAX_CODE_LENGTH * n_lanes  # positions pos can hold
        starts_below = reach + MAX_CODE_LENGTH * (n_lanes - 1)  # offsets a lane can start at
        slots = 2 if starts_below + MAX_CODE_LENGTH <= 2 * beat else 3
        active = busy  # a packet's count is taken and symbols remain
        remaining = Signal(COUNT_BITS)
        last = Signal()  # remaining <= lanes: this parse ends the packet
        bs = [Signal(beat, name=f"b{k}") for k in range(slots)]
        held = Signal(range(slots + 1))
        pos = Signal(reach, init=1)  # one-hot bit offset of the next code from b0's start
        fits_late, skip = Signal(name="fits_late"), Signal(name="skip")

        # the window: drop the beat behind pos (pos >= beat, kept as a register); the input beat
        # waits in a register (``incoming``) and enters the first free slot, so that next
        # clock's window, and the widths read from it, depend on registers only
        pops = Signal()
        left = Signal.like(held)
        incoming, incoming_valid = Signal(beat, name="incoming"), Signal(name="incoming_valid")
        enter = incoming_valid & (left < slots)
        nexts = [Signal(beat, name=f"next_b{k}") for k in range(slots)]
        after = [*bs[1:], bs[-1]]  # each slot's content once b0 drops
        m.d.comb += [
            left.eq(held - pops),
            self.i.ready.eq((~incoming_valid | enter) & ~err),
            *(nb.eq(Mux(pops, nxt, b)) for nb, b, nxt in zip(nexts, bs, after, strict=True)),
        ]
        with m.If(self.i.ready):
            # bit-reversed on entry (wiring only): bit k of a held beat is its k-th stream bit
            m.d.sync += [incoming.eq(self.i.payload[::-1]), incoming_valid.eq(self.i.valid)]
        with m.If(enter), m.Switch(left):
            for k in range(slots):
                with m.Case(k):
                    m.d.comb += nexts[k].eq(incoming)
        m.d.sync += [b.eq(nb) for b, nb in zip(bs, nexts, strict=True)]
        m.d.sync += held.eq(left + enter)

        # the region width at every offset a code can start at, for next clock's window; each
        # per-offset quantity is a vector over the offsets (bit k: offset k), so the logic is a
        # few whole-vector ANDs and ORs (the same gates as per-offset selects, but the generated
        # Verilog and both simulators handle one vector op much faster than hundreds of bits; the
        # beats are held in stream order so that the offsets' bits are plain slices)
        window, upcoming = Cat(*bs), Cat(*nexts)  # bit k: the k-th stream bit from b0's start
        prefix_bits = [upcoming[i : i + starts_below] for i in range(PREFIX_BITS)]  # MSB first
        names = [  # names[r], bit k: the 3 bits at offset k name region r (an 8:1 select's decode)
            reduce(
                operator.and_,
                (
                    bit if r >> (PREFIX_BITS - 1 - i) & 1 else ~bit
                    for i, bit in enumerate(prefix_bits)
                ),
            )
            for r in range(len(regions))
        ]

        def select(per_region: list[Value], lo: int, hi: int) -> Value:
            """Offsets lo..hi-1 (bit k - lo): the bits of ``per_region`` of the region named at
            offset k."""
            return reduce(
                operator.or_,
                (name[lo:hi] & v for name, v in zip(names, per_region, strict=True)),
            )

        # widths[t], bit k: bit t of the width at offset k (registered)
        widths = [Signal(starts_below, name=f"width{t}_at") for t in range(WIDTH_BITS)]
        m.d.sync += [
            w.eq(
                select(
                    [RegionEntry(r).width[t].replicate(starts_below) for r in regions],
                    0,
                    starts_below,
                )
            )
            for t, w in enumerate(widths)
        ]
        room = MAX_CODE_LENGTH * n_lanes  # N codes of 11 bits
        limits = {
            beat - 1,  # a code ending past it crosses b0's end
            2 * beat - 1,  # ... or b1's, when pos was already past b0's
            *(h * beat for h in range(1, slots)),  # the exact fit check
            *(h * beat - room + d for h in range(1, slots) for d in (0, beat)),  # sure next clock
        }
        # ends_by[limit] = (lo, flags), flag k - lo: the code at offset k ends at or before bit
        # ``limit`` (registered with the widths; only for the offsets lo.. where that depends
        # on the width, an 8:1 select by the prefix as the width is: no compare after it)
        ends_by: dict[int, tuple[int, Signal]] = {}
        for limit in sorted(limits):
            lo = max(limit - MAX_CODE_LENGTH + 1, 0)
            hi = min(limit - PREFIX_BITS + 1, starts_below)
            if hi <= lo:
                continue
            fits = [  # per region, which of the offsets lo..hi-1 its codes fit from
                Cat(RegionEntry(r).width <= limit - PREFIX_BITS - k for k in range(lo, hi))
                for r in regions
            ]
            flags = Signal(hi - lo, name=f"ends_by{limit}")
            m.d.sync += flags.eq(select(fits, lo, hi))
            ends_by[limit] = lo, flags
        # length_at[n - 3], bit k: the code at offset k is n bits long
        length_at = [Signal(starts_below, name=f"length{n}_at") for n in LENGTHS]
        m.d.comb += [
            at.eq(
                reduce(
                    operator.and_,
                    (w if (n - PREFIX_BITS) >> t & 1 else ~w for t, w in enumerate(widths)),
                )
            )
            for n, at in zip(LENGTHS, length_at, strict=True)
        ]

        def ends_within(start: Value, limit: int) -> Value:
            """The code at the one-hot ``start`` ends at or before bit ``limit``."""
            sure = at_most(start, limit - MAX_CODE_LENGTH)
            if limit not in ends_by or ends_by[limit][0] >= len(start):
                return sure
            lo, flags = ends_by[limit]
            return sure | (start[lo : lo + len(flags)] & flags[: len(start) - lo]).any()

        # the loop: N one-hot code steps from pos
        lane_starts = [pos]
        for _ in range(n_lanes):
            start = Signal(len(lane_starts[-1]) + MAX_CODE_LENGTH, name=f"start{len(lane_starts)}")
            m.d.comb += start.eq(one_hot_step(lane_starts[-1], length_at))
            lane_starts.append(start)
        count = Signal(range(n_lanes + 1))
        if n_lanes == 1:
            m.d.comb += count.eq(1)
        else:
            m.d.comb += count.eq(Mux(last, remaining[: n_lanes.bit_length()], n_lanes))
        end, final_start = Signal(len(lane_starts[-1])), Signal(len(lane_starts[-2]))
        for ends, d in ((end, 0), (final_start, 1)):
            picks = [Mux(count == k, lane_starts[k - d], 0) for k in range(1, n_lanes + 1)]
            m.d.comb += ends.eq(reduce(operator.or_, picks))
        # parse when N codes of 11 bits surely lie in the beats held (registered), or on the
        # previous clock's exact check
        sure = Signal()
        parse = Signal()
        held_back = self.hold if self.holds else C(0, 1)
        m.d.comb += parse.eq(active & s1_free & (sure | fits_late) & ~held_back)

        # next pos: after the codes, or (the clock after a packet's last code) the next beat's
        # start, less the beat that drops
        aligned = pos[0] | pos[beat]
        rounded = Signal(2 * beat + 1)
        m.d.comb += [rounded[0].eq(pos[0]), rounded[beat].eq(~pos[0] & ~pos[beat + 1 :].any())]
        m.d.comb += rounded[2 * beat].eq(pos[beat + 1 :].any())
        moved = Mux(parse, end, Mux(skip, rounded, pos))
        moved_wide = Cat(moved, C(0, 2 * beat + reach))
        take_n = self.n.valid & self.n.ready
        held_next = left + enter
        fits_end = Cat(
            (held == h) & ends_within(final_start, h * beat) for h in range(1, slots)
        ).any()
        # after a parse, the next pos is past b0's end when the last code crosses it
        # (from past b0's end -- b0 drops this clock -- N codes can end past b1's when 22 N > beat)
        crossing = Mux(
            pops,
            ~ends_within(final_start, 2 * beat - 1) if reach + room > 2 * beat else C(0, 1),
            ~ends_within(final_start, beat - 1),
        )

        def sure_after(in_beats: list[Value]) -> Value:
            """Next clock's ``sure``, given per h = 1..slots-1 that pos then leaves N codes
            room in h beats."""
            return (held_next >= slots) | Cat(
                (held_next >= h) & ok for h, ok in enumerate(in_beats, 1)
            ).any()

        limit_for = [h * beat - room for h in range(1, slots)]
        m.d.sync += [
            pos.eq(Mux(pops, moved_wide[beat : beat + reach], moved_wide[:reach])),
            pops.eq(Mux(parse, crossing, skip & ~aligned)),
            skip.eq(parse & last),
            sure.eq(
                Mux(
                    parse,
                    sure_after(
                        [
                            Mux(
                                pops,
                                ends_within(final_start, e + beat),
                                ends_within(final_start, e),
                            )
                            for e in limit_for
                        ]
                    ),
                    Mux(
                        skip,
                        sure_after([C(h > 1, 1) | aligned for h in range(1, slots)]),
                        sure_after(
                            [Mux(pops, at_most(pos, e + beat), at_most(pos, e)) for e in limit_for]
                        ),
                    ),
                )
            ),
            # the exact check holds next clock if pos and the lane count stay (more beats only
            # help); a new packet's count changes how many codes must fit
            fits_late.eq(~parse & ~skip & ~take_n & ~pops & fits_end),
        ]

        # the padding skipped: the rest of the beat holding pos, from the stream bit at pos, as
        # the thermometer of pos within its beat (bit j: pos <= j) ANDed with that beat. The
        # thermometer is a log-depth spread (each doubling one OR level), as long as the loop at
        # wide beats, so it is cut in two registered halves: the skip clock spreads pos by the
        # short shifts, the next (``checking``: b0 is pos's beat, and drops after it) by the long
        # ones and keeps b0, the third (``checking_late``) ANDs them
        doublings = [1 << i for i in range((beat - 1).bit_length())]  # 1, 2, ..., beat / 2
        short = doublings[: len(doublings) // 2]
        in_beat = reduce(operator.or_, (pos[h : h + beat] for h in range(0, reach, beat)))
        behind_near = Signal(beat, name="behind_near")
        behind, pad_beat = Signal(beat, name="behind"), Signal(beat, name="pad_beat")
        checking, checking_late = Signal(name="checking"), Signal(name="checking_late")
        m.d.sync += [
            behind_near.eq(spread_up(in_beat, short)),
            checking.eq(skip & ~aligned),
            behind.eq(spread_up(behind_near, doublings[len(short) :])),
            pad_beat.eq(bs[0]),
            checking_late.eq(checking),
        ]
        padding_set = checking_late & (behind & pad_beat).any()
        padding_ok = (skip & aligned) | (checking_late & ~(behind & pad_beat).any())

        heads = [select_bits(at, window, MAX_CODE_LENGTH) for at in lane_starts[:n_lanes]]

        # no count while the last packet's padding is still to be checked (``skip``, then
        # ``checking``, ``checking_late``): a packet taken then would be decoded before its
        # predecessor's error
        checks = skip | checking | checking_late
        m.d.comb += self.n.ready.eq(~active & ~err & ~bad_padding & ~checks & ~self.tw.valid)
        with m.If(take_n):
            m.d.sync += [
                active.eq(self.n.payload != 0),
                remaining.eq(self.n.payload),
                last.eq(self.n.payload <= n_lanes),
            ]
        with m.If(parse):
            m.d.sync += [
                remaining.eq(remaining - n_lanes),
                last.eq(remaining <= 2 * n_lanes),
                active.eq(~last),
            ]
        return parse, heads, count, last, padding_set, padding_ok
