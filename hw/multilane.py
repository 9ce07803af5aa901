"""Multi-lane QLC blocks: N symbols per clock, same serial format, tables and table port.

Beats. A symbol beat carries ``lanes`` symbols (lane 0 = first, in the low byte) and ``count``
(1..lanes valid lanes; fewer than ``lanes`` only on a packet's last beat). A word beat carries
``words`` 32-bit serial words, the first word in the top bits, so bit ``32 * words - 1`` is the
first stream bit: the serial layout unchanged, with a packet padded to a whole beat instead of a
word. ``words`` is the smallest power of two with ``32 * words >= 11 * lanes``, so one beat per
clock carries N codes of any length.

:class:`QLCEncoderN` (no serial dependency): N LUT reads in parallel (one block RAM copy per
read port), each code left aligned, a binary merge tree that concatenates the N codes (each
merge shifts the right half by the left half's length: a prefix sum and shifter network in
one) with a register after every level (log2 N clocks of latency, one merge per clock path),
and the single-lane packer widened to beats.

:class:`QLCDecoderN` (the single-lane ``hw.decoder.QLCDecoder`` is its N = 1 instance): no
chain of length selects inside a clock. Words sit in a ring of 4 beat slots that never move, and
every ring offset k carries registered *jump tables*: ``D1[k]`` = the length of a code starting
at k (its 3 prefix bits -> region width, looked up at every offset in parallel) and, by pointer
jumping, ``D(a+b)[k] = Da[k] + Db[k + Da[k]]`` with ``a`` the largest power of two below
``a + b`` (a mux over the 8a + 1 places ``Da`` can reach and an add per offset), the bits
spanned by j codes from k: ``Dj`` is registered log2(j) levels after ``D1``. The parse loop is
then one step whatever N: ``pos += DN[pos]``, a mux over the ring and an add; the lane starts
``pos + Dj[pos]`` come from the same tables beside it. A beat's tables settle log2 N clocks
after it arrives (or after a table write), so a slot is *ready* once its age reaches log2 N;
a group parses when its longest
case (11 N bits from ``pos``) lies in ready slots, or -- at a packet's end, when the source has
run dry -- when the exact end, computed with the slots settled, lies in the held words. The
last group of a packet ends at ``pos + D_count[pos]``; the next clock rounds ``pos`` up to the
beat boundary and checks the padding bits in between: any 1 raises ``error``. Lane extraction
is pipelined: the 11 N bits from ``pos`` and the lane offsets are registered, then each lane's
11-bit head is cut, then region lookup, rank LUT (one read port per lane) and legality as in
the single-lane design. An illegal code in lane j: lanes before j go out as a partial beat, then
``error``.
"""

from __future__ import annotations

from amaranth import Array, C, Cat, Module, Mux, Signal, Value
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from golden.codebook import (
    ALPHABET,
    ENC_WORD_BITS,
    MAX_CODE_LENGTH,
    MAX_WIDTH,
    NUM_REGIONS,
    PREFIX_BITS,
    RANK_COUNT_BITS,
    REGION_BASE_BITS,
    REGION_WORD_BITS,
    Codebook,
)
from hw.packer import add_packer
from hw.tables import (
    COUNT_BITS,
    WIDTH_BITS,
    WORD_BITS,
    DecoderTables,
    EncEntry,
    Mem,
    RegionEntry,
    TableWriteLayout,
    default_book,
    table_write_port,
)

MULTI_LANES = (2, 4, 8)  # both blocks (the single-lane blocks are N = 1)
ENCODER_ONLY_LANES = 32  # the encoder's batch width in the QLC paper
RANK_BITS = 10  # base (<= 256) + payload (<= 255)
SLOTS = 4  # beat slots in the decoder's ring


def words_per_beat(lanes: int) -> int:
    """Smallest power of two of 32-bit words that holds ``lanes`` 11-bit codes."""
    if lanes < 1:
        raise ValueError(f"lanes must be >= 1, got {lanes}")
    words = 1
    while WORD_BITS * words < MAX_CODE_LENGTH * lanes:
        words *= 2
    return words


def lane_layout(lanes: int) -> data.StructLayout:
    return data.StructLayout({"data": 8 * lanes, "count": range(lanes + 1), "last": 1})


def beat_layout(words: int) -> data.StructLayout:
    return data.StructLayout({"data": WORD_BITS * words, "last": 1, "bits": COUNT_BITS})


Code = tuple[Value, Value, int]  # left-aligned bits (zeros below ``length``), length, width


def merge_pair(a: Code, b: Code) -> Code:
    """Concatenate two left-aligned codes: ``a | b >> len(a)``."""
    (bits_a, len_a, width_a), (bits_b, len_b, width_b) = a, b
    bits = Cat(C(0, width_b), bits_a) | (Cat(C(0, width_a), bits_b) >> len_a)
    return bits, len_a + len_b, width_a + width_b


class MergeTree:
    """A binary tree of :func:`merge_pair` with a register after every level, so the critical
    path is one merge (one shifter) at any lane count; the levels form a pipeline that holds
    under back-pressure like the stages around it. ``connect`` closes the handshake chain once
    the consumer's ``free`` is known."""

    def __init__(self, m: Module, codes: list[Code], valid: Value, last: Value) -> None:
        self.levels: list[tuple[Signal, Signal]] = []  # (free, valid) per level
        while len(codes) > 1:
            depth = len(self.levels)
            merged = [merge_pair(codes[k], codes[k + 1]) for k in range(0, len(codes) - 1, 2)]
            merged += codes[len(codes) - len(codes) % 2 :]
            free, lvl_valid, lvl_last = (Signal(name=f"merge{depth}_{n}")
                                         for n in ("free", "valid", "last"))
            regs = []
            for k, (bits, length, width) in enumerate(merged):
                r_bits = Signal(width, name=f"merge{depth}_bits{k}")
                r_len = Signal(range(width + 1), name=f"merge{depth}_len{k}")
                with m.If(free):
                    m.d.sync += [r_bits.eq(bits), r_len.eq(length)]
                regs.append((r_bits, r_len, width))
            with m.If(free):
                m.d.sync += [lvl_valid.eq(valid), lvl_last.eq(last)]
            self.levels.append((free, lvl_valid))
            codes, valid, last = regs, lvl_valid, lvl_last
        (self.block, self.length, self.width), = codes
        self.valid, self.last = valid, last

    def connect(self, m: Module, out_free: Value) -> Value:
        """Drive each level's advance from the one after it; returns the tree's input free."""
        for free, valid in reversed(self.levels):
            m.d.comb += free.eq(~valid | out_free)
            out_free = free
        return out_free


class QLCEncoderN(wiring.Component):
    """N-lane encoder: symbol beats (``i``) -> word beats (``o``: data, last, bits)."""

    def __init__(self, lanes: int, book: Codebook | None = None) -> None:
        self.lanes, self.words = lanes, words_per_beat(lanes)
        self.book = book or default_book()
        super().__init__(
            {
                "i": In(stream.Signature(lane_layout(lanes))),
                "o": Out(stream.Signature(beat_layout(self.words))),
                "tw": In(stream.Signature(TableWriteLayout)),
            }
        )

    def elaborate(self, platform) -> Module:
        m = Module()
        n_lanes, beat = self.lanes, WORD_BITS * self.words
        m.submodules.lut = lut = memory.Memory(
            shape=ENC_WORD_BITS, depth=ALPHABET, init=self.book.encoder_words()
        )
        rds = [lut.read_port() for _ in range(n_lanes)]
        wr = lut.write_port()

        in_packet = Signal()
        s1_valid, s1_last, s1_count = Signal(), Signal(), Signal(range(n_lanes + 1))
        s2_valid, s2_last = Signal(), Signal()
        s2_codes = [Signal(MAX_CODE_LENGTH, name=f"s2_code{j}") for j in range(n_lanes)]
        s2_lens = [Signal(range(MAX_CODE_LENGTH + 1), name=f"s2_len{j}") for j in range(n_lanes)]

        tw_take = table_write_port(m, self.tw, ~in_packet, wr, Mem.ENC)

        # stage 3: the merge tree, one register per level
        tree = MergeTree(
            m, [(c, ln, MAX_CODE_LENGTH) for c, ln in zip(s2_codes, s2_lens, strict=True)],
            s2_valid, s2_last,
        )
        pack = add_packer(
            m, self.o, beat=beat, code_bits=tree.width, valid=tree.valid, code=tree.block,
            length=tree.length, last=tree.last,
        )
        s2_free = tree.connect(m, ~tree.valid | pack)
        s1_free = ~s1_valid | s2_free
        take = self.i.valid & self.i.ready
        m.d.comb += self.i.ready.eq(s1_free & ~tw_take)
        for j, rd in enumerate(rds):
            m.d.comb += [rd.addr.eq(self.i.payload.data[8 * j : 8 * j + 8]), rd.en.eq(s1_free)]
        with m.If(s1_free):
            m.d.sync += [
                s1_valid.eq(take),
                s1_last.eq(self.i.payload.last),
                s1_count.eq(self.i.payload.count),
            ]
        with m.If(take):
            m.d.sync += in_packet.eq(~self.i.payload.last)

        # stage 2: every lane's code left aligned; lanes past count are empty
        with m.If(s2_free):
            m.d.sync += [s2_valid.eq(s1_valid), s2_last.eq(s1_last)]
            for j, rd in enumerate(rds):
                entry = EncEntry(rd.data)
                shift = Signal(range(MAX_WIDTH + 1), name=f"shift{j}")
                m.d.comb += shift.eq(MAX_WIDTH - entry.width)
                live = j < s1_count
                m.d.sync += [
                    s2_codes[j].eq(Mux(live, Cat((entry.payload << shift)[:MAX_WIDTH],
                                                 entry.prefix), 0)),
                    s2_lens[j].eq(Mux(live, PREFIX_BITS + entry.width, 0)),
                ]

        # last stage: the packer (hw.packer, beat wide)
        return m


class QLCDecoderN(wiring.Component):
    """N-lane decoder: counts (``n``) and word beats (``i``) -> symbol beats (``o``)."""

    def __init__(self, lanes: int, book: Codebook | None = None) -> None:
        if lanes < 1 or lanes & (lanes - 1):
            raise ValueError(f"the decoder takes a power of two of lanes, got {lanes}")
        self.lanes, self.words = lanes, words_per_beat(lanes)
        self.book = book or default_book()
        super().__init__(
            {
                "n": In(stream.Signature(COUNT_BITS)),
                "i": In(stream.Signature(WORD_BITS * self.words)),
                "o": Out(stream.Signature(lane_layout(lanes))),
                "tw": In(stream.Signature(TableWriteLayout)),
                "error": Out(1),
            }
        )

    def elaborate(self, platform) -> Module:
        m = Module()
        n_lanes, span = self.lanes, MAX_CODE_LENGTH * self.lanes
        lane_range = range(n_lanes)
        tables = DecoderTables(m, self.book)
        regions, num_ranked = tables.regions, tables.num_ranked
        rds = [tables.lut.read_port() for _ in lane_range]
        wr = tables.lut.write_port()

        err, busy, tail = Signal(), Signal(), Signal()
        s1_valid, s1_last, s1_count = Signal(), Signal(), Signal(range(n_lanes + 1))
        s1_local = Signal(span)  # the 11 N stream bits from the group's start, first bit at 0
        s1_rel = [Signal(range(span + 1), name=f"s1_rel{j}") for j in lane_range]
        s2_valid, s2_last, s2_count = Signal(), Signal(), Signal(range(n_lanes + 1))
        s2_heads = [Signal(MAX_CODE_LENGTH, name=f"s2_head{j}") for j in lane_range]
        s3_valid, s3_last, s3_count = Signal(), Signal(), Signal(range(n_lanes + 1))
        s3_lit = [Signal(name=f"s3_lit{j}") for j in lane_range]
        s3_pay = [Signal(MAX_WIDTH, name=f"s3_pay{j}") for j in lane_range]
        s3_base = [Signal(REGION_BASE_BITS, name=f"s3_base{j}") for j in lane_range]
        s3_room = [Signal(RANK_COUNT_BITS, name=f"s3_room{j}") for j in lane_range]
        s4_valid, s4_last, s4_count = Signal(), Signal(), Signal(range(n_lanes + 1))
        s4_lit = [Signal(name=f"s4_lit{j}") for j in lane_range]
        s4_pay = [Signal(MAX_WIDTH, name=f"s4_pay{j}") for j in lane_range]
        s4_bad = [Signal(name=f"s4_bad{j}") for j in lane_range]

        idle = ~busy & ~tail & ~s1_valid & ~s2_valid & ~s3_valid & ~s4_valid
        tw_take = tables.write_port(m, self.tw, idle, wr)

        # output: lanes before the first illegal one, then error
        bad_any = Cat(*s4_bad).any()
        first_bad = Signal(range(n_lanes + 1))
        for j in reversed(lane_range):
            with m.If(s4_bad[j]):
                m.d.comb += first_bad.eq(j)
        s4_free = ~err & ~(s4_valid & bad_any) & (~s4_valid | self.o.ready)
        s3_free = ~s3_valid | s4_free
        s2_free = ~s2_valid | s3_free
        s1_free = ~s1_valid | s2_free

        # stage 0: the parse loop over the ring's jump tables
        parse, local, rel, count, last, pad_bad = self._parser(
            m, regions, s1_free, busy, tail, err, tw_take
        )
        with m.If(s1_free):
            m.d.sync += [s1_valid.eq(parse), s1_last.eq(last), s1_count.eq(count),
                         s1_local.eq(local)]
            m.d.sync += [r.eq(v) for r, v in zip(s1_rel, rel, strict=True)]
        with m.If(pad_bad):
            m.d.sync += err.eq(1)

        # stage 1 -> 2: each lane's 11-bit head, first stream bit on top
        with m.If(s2_free):
            m.d.sync += [s2_valid.eq(s1_valid), s2_last.eq(s1_last), s2_count.eq(s1_count)]
            m.d.sync += [
                h.eq(s1_local.bit_select(r, MAX_CODE_LENGTH)[::-1])
                for h, r in zip(s2_heads, s1_rel, strict=True)
            ]

        # stage 2 -> 3: region lookup and payload; 3 -> 4: rank LUT read and legality
        with m.If(s3_free):
            m.d.sync += [s3_valid.eq(s2_valid), s3_last.eq(s2_last), s3_count.eq(s2_count)]
        with m.If(s4_free):
            m.d.sync += [s4_valid.eq(s3_valid), s4_last.eq(s3_last), s4_count.eq(s3_count)]
        for j in lane_range:
            region = Signal(REGION_WORD_BITS, name=f"region_of{j}")
            entry = RegionEntry(region)
            with m.Switch(s2_heads[j][MAX_WIDTH:]):
                for p, reg in enumerate(regions):
                    with m.Case(p):
                        m.d.comb += region.eq(reg)
            shift = Signal(range(MAX_WIDTH + 1), name=f"shift{j}")
            m.d.comb += shift.eq(MAX_WIDTH - entry.width)
            with m.If(s3_free):
                m.d.sync += [
                    s3_lit[j].eq(entry.literal),
                    s3_pay[j].eq(s2_heads[j][:MAX_WIDTH] >> shift),
                    s3_base[j].eq(entry.base),
                    s3_room[j].eq(Mux(entry.base < num_ranked, num_ranked - entry.base, 0)),
                ]
            rank = Signal(RANK_BITS, name=f"rank{j}")
            m.d.comb += [
                rank.eq(s3_base[j] + s3_pay[j]),
                rds[j].addr.eq(rank),
                rds[j].en.eq(s4_free),
            ]
            with m.If(s4_free):
                m.d.sync += [
                    s4_lit[j].eq(s3_lit[j]),
                    s4_pay[j].eq(s3_pay[j]),
                    s4_bad[j].eq((j < s3_count) & ~s3_lit[j] & (s3_pay[j] >= s3_room[j])),
                ]

        with m.If(s4_valid & bad_any & ((first_bad == 0) | self.o.ready)):
            m.d.sync += err.eq(1)
        m.d.comb += [
            self.o.valid.eq(s4_valid & ~err & ~(bad_any & (first_bad == 0))),
            self.o.payload.data.eq(
                Cat(Mux(s4_lit[j], s4_pay[j], rds[j].data) for j in lane_range)
            ),
            self.o.payload.count.eq(Mux(bad_any, first_bad, s4_count)),
            self.o.payload.last.eq(s4_last & ~bad_any),
            self.error.eq(err),
        ]
        return m

    def _parser(self, m: Module, regions, s1_free, busy, tail, err, tw_take):
        """The ring, its jump tables and the loop; returns (parse, local, rel, count, last,
        pad_bad): the group's bits and lane offsets for stage 1, and the padding verdict."""
        n_lanes, beat = self.lanes, WORD_BITS * self.words
        span = MAX_CODE_LENGTH * n_lanes
        beat_log = beat.bit_length() - 1
        ring_bits = SLOTS * beat
        age_max = (n_lanes - 1).bit_length()  # clocks for a slot's Dj tables to settle
        active = busy
        remaining = Signal(COUNT_BITS)
        last = Signal()  # remaining <= lanes: this group ends the packet
        slots = [Signal(beat, name=f"slot{s}") for s in range(SLOTS)]
        ages = [Signal(range(age_max + 1), name=f"age{s}") for s in range(SLOTS)]
        wr_at, rd_at, held = Signal(range(SLOTS)), Signal(range(SLOTS)), Signal(range(SLOTS + 1))
        pos = Signal(range(ring_bits))  # ring offset of the next codeword
        tw_recent, fits_late, skip = Signal(), Signal(), Signal()
        tail_end = Signal(range(ring_bits))  # where the packet's last code ends

        # the ring: slots behind pos's slot free up on the next clock; a beat fills the next slot
        drops = Signal(range(SLOTS))
        left = Signal(range(SLOTS + 1))
        push = self.i.valid & self.i.ready
        m.d.comb += [
            drops.eq(pos[beat_log:] - rd_at),
            left.eq(held - drops),
            self.i.ready.eq((left < SLOTS) & ~err),
        ]
        next_slots = [Mux(push & (wr_at == s), self.i.payload, v) for s, v in enumerate(slots)]
        m.d.sync += [slot.eq(v) for slot, v in zip(slots, next_slots, strict=True)]
        m.d.sync += [wr_at.eq(wr_at + push), rd_at.eq(rd_at + drops), held.eq(left + push),
                     tw_recent.eq(tw_take)]
        for s, age in enumerate(ages):
            with m.If(tw_take | (push & (wr_at == s))):
                m.d.sync += age.eq(0)
            with m.Elif(~tw_recent & (age != age_max)):
                m.d.sync += age.eq(age + 1)

        # jump tables: D1 from the next clock's ring bits (so a new beat's lengths are there
        # with it), each further level from the one before, a register per level
        ring_next = Signal(ring_bits + PREFIX_BITS - 1)  # bit k: the ring's k-th stream bit
        stream_order = Cat(v[::-1] for v in next_slots)
        m.d.comb += ring_next.eq(Cat(stream_order, stream_order[: PREFIX_BITS - 1]))
        planes = [Signal(NUM_REGIONS, name=f"width_plane{b}") for b in range(WIDTH_BITS)]
        for b, plane in enumerate(planes):
            m.d.comb += plane.eq(Cat(RegionEntry(r).width[b] for r in regions))
        jumps = [[Signal(range(MAX_CODE_LENGTH + 1), name=f"d1_{k}") for k in range(ring_bits)]]
        for k, d1 in enumerate(jumps[0]):
            prefix = ring_next[k : k + PREFIX_BITS][::-1]
            m.d.sync += d1.eq(PREFIX_BITS + Cat(p.bit_select(prefix, 1) for p in planes))
        for j in range(2, n_lanes + 1):  # D(a + b)[k] = Da[k] + Db[k + Da[k]], a = 2^level
            a = 1 << (j - 1).bit_length() - 1
            jump_a, jump_b = jumps[a - 1], jumps[j - a - 1]
            level = [Signal(range(MAX_CODE_LENGTH * j + 1), name=f"d{j}_{k}")
                     for k in range(ring_bits)]
            for k, (d, da) in enumerate(zip(level, jump_a, strict=True)):
                later = [jump_b[(k + step) % ring_bits]
                         for step in range(PREFIX_BITS * a, MAX_CODE_LENGTH * a + 1)]
                index = Signal(range(len(later)), name=f"d{j}_{k}_at")
                m.d.comb += index.eq(da - PREFIX_BITS * a)
                m.d.sync += d.eq(da + Array(later)[index])
            jumps.append(level)
        at_pos = [Signal(range(MAX_CODE_LENGTH * j + 1), name=f"d{j}_at_pos")
                  for j in range(1, n_lanes + 1)]  # at_pos[j - 1] = Dj[pos]
        m.d.comb += [v.eq(Array(level)[pos]) for v, level in zip(at_pos, jumps, strict=True)]

        # readiness: the held slots from the oldest, each settled
        rel = Signal(range(ring_bits))  # pos from the oldest held slot's start
        m.d.comb += rel.eq(pos - Cat(C(0, beat_log), rd_at))
        ready = [Signal(name=f"ready{j}") for j in range(SLOTS)]  # j-th held slot, settled
        for j, r in enumerate(ready):
            age = Array(ages)[(rd_at + j)[: len(rd_at)]]
            m.d.comb += r.eq((held > j) & (age == age_max) & ~tw_recent)
        sure = C(0)
        for j in range(SLOTS):  # the whole worst-case group lies in the first j + 1 slots
            sure = sure | (Cat(*ready[: j + 1]).all() & (rel + span <= beat * (j + 1)))
        settled = Cat(*((held <= j) | ready[j] for j in range(SLOTS))).all()
        held_bits = Cat(C(0, beat_log), held)

        count = Signal(range(n_lanes + 1))
        m.d.comb += count.eq(Mux(last, remaining, n_lanes))
        group = Signal(range(span + 1))  # bits of this group's codes
        m.d.comb += group.eq(Array(at_pos)[(count - 1)[: len(count)]])
        parse = Signal()
        m.d.comb += parse.eq(active & s1_free & (sure | fits_late))
        take_n = self.n.valid & self.n.ready
        rounded = Cat(C(0, beat_log), tail_end[beat_log:] + (tail_end[:beat_log] != 0))
        m.d.sync += [
            pos.eq(Mux(parse & ~last, pos + at_pos[-1], Mux(skip, rounded, pos))),
            skip.eq(parse & last),
            # the exact fit holds next clock if pos and the count stay (more words only help)
            # (pos itself held: its tables are then settled, never the zeros after reset)
            fits_late.eq(~parse & ~skip & ~take_n & (drops == 0) & settled & (rel < held_bits)
                         & (rel + group <= held_bits)),
        ]
        with m.If(parse & last):
            m.d.sync += tail_end.eq(pos + group)

        # padding: the bits from the last code's end to its beat's end must be zero
        pad_word, pad_at, pad_check = Signal(beat), Signal(beat_log), Signal()
        m.d.sync += [
            pad_word.eq(Array(slots)[tail_end[beat_log:]]),
            pad_at.eq(tail_end[:beat_log]),
            pad_check.eq(skip & (tail_end[:beat_log] != 0)),
        ]
        m.d.comb += tail.eq(skip | pad_check)
        pad_bad = pad_check & (pad_word << pad_at)[:beat].any()

        m.d.comb += self.n.ready.eq(~active & ~err & ~self.tw.valid)
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
        ring = Cat(slot[::-1] for slot in slots)
        local = Signal(span)
        m.d.comb += local.eq(Cat(ring, ring[:span]).bit_select(pos, span))
        return parse, local, [C(0), *at_pos[:-1]], count, last, pad_bad
