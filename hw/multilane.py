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

:class:`QLCDecoderN`: the single-lane decoder with N length selects chained in the parse loop
(``p[j+1] = p[j] + 3 + width(prefix at p[j])``), N heads, N region lookups, N rank LUT read
ports. An illegal code in lane j: lanes before j go out as a partial beat, then ``error``. A
packet's padding (the rest of its last beat) must be zero: a 1 raises ``error`` after the
packet's last symbols, as in the single-lane decoder.
"""

from __future__ import annotations

from amaranth import C, Cat, Module, Mux, Signal, Value
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out
from zipccl.golden.codebook import (
    ALPHABET,
    ENC_WORD_BITS,
    MAX_CODE_LENGTH,
    MAX_WIDTH,
    PREFIX_BITS,
    RANK_COUNT_BITS,
    REGION_BASE_BITS,
    REGION_WORD_BITS,
    Codebook,
)
from zipccl.hw.packer import add_packer
from zipccl.hw.tables import (
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
RANK_BITS = 10


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
            free, lvl_valid, lvl_last = (
                Signal(name=f"merge{depth}_{n}") for n in ("free", "valid", "last")
            )
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
        ((self.block, self.length, self.width),) = codes
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
            m,
            [(c, ln, MAX_CODE_LENGTH) for c, ln in zip(s2_codes, s2_lens, strict=True)],
            s2_valid,
            s2_last,
        )
        pack = add_packer(
            m,
            self.o,
            beat=beat,
            code_bits=tree.width,
            valid=tree.valid,
            code=tree.block,
            length=tree.length,
            last=tree.last,
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
                    s2_codes[j].eq(
                        Mux(live, Cat((entry.payload << shift)[:MAX_WIDTH], entry.prefix), 0)
                    ),
                    s2_lens[j].eq(Mux(live, PREFIX_BITS + entry.width, 0)),
                ]

        # last stage: the packer (hw.packer, beat wide)
        return m


class QLCDecoderN(wiring.Component):
    """N-lane decoder: counts (``n``) and word beats (``i``) -> symbol beats (``o``)."""

    def __init__(self, lanes: int, book: Codebook | None = None) -> None:
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
        n_lanes = self.lanes
        lane_range = range(n_lanes)
        tables = DecoderTables(m, self.book)
        regions, num_ranked = tables.regions, tables.num_ranked
        rds = [tables.lut.read_port() for _ in lane_range]
        wr = tables.lut.write_port()

        err, busy = Signal(), Signal()
        s1_valid, s1_last = Signal(), Signal()
        s1_count = Signal(range(n_lanes + 1))
        s1_heads = [Signal(MAX_CODE_LENGTH, name=f"s1_head{j}") for j in lane_range]
        s2_valid, s2_last, s2_count = Signal(), Signal(), Signal(range(n_lanes + 1))
        s2_lit = [Signal(name=f"s2_lit{j}") for j in lane_range]
        s2_pay = [Signal(MAX_WIDTH, name=f"s2_pay{j}") for j in lane_range]
        s2_base = [Signal(REGION_BASE_BITS, name=f"s2_base{j}") for j in lane_range]
        s2_room = [Signal(RANK_COUNT_BITS, name=f"s2_room{j}") for j in lane_range]
        s3_valid, s3_last, s3_count = Signal(), Signal(), Signal(range(n_lanes + 1))
        s3_lit = [Signal(name=f"s3_lit{j}") for j in lane_range]
        s3_pay = [Signal(MAX_WIDTH, name=f"s3_pay{j}") for j in lane_range]
        s3_bad = [Signal(name=f"s3_bad{j}") for j in lane_range]

        bad_padding = Signal()
        drained = ~s1_valid & ~s2_valid & ~s3_valid
        idle = ~busy & ~bad_padding & drained
        tables.write_port(m, self.tw, idle, wr)

        # output: lanes before the first illegal one, then error
        bad_any = Cat(*s3_bad).any()
        first_bad = Signal(range(n_lanes + 1))
        for j in reversed(lane_range):
            with m.If(s3_bad[j]):
                m.d.comb += first_bad.eq(j)
        s3_free = ~err & ~(s3_valid & bad_any) & (~s3_valid | self.o.ready)
        s2_free = ~s2_valid | s3_free
        s1_free = ~s1_valid | s2_free

        parse, heads, count, last, padding_set = self._parser(
            m, regions, s1_free, busy, err, bad_padding
        )
        with m.If(padding_set):
            m.d.sync += bad_padding.eq(1)
        with m.If(bad_padding & drained):  # after the packet's last symbols
            m.d.sync += err.eq(1)
        with m.If(s1_free):
            m.d.sync += [s1_valid.eq(parse), s1_last.eq(last), s1_count.eq(count)]
            m.d.sync += [h.eq(v) for h, v in zip(s1_heads, heads, strict=True)]

        with m.If(s2_free):
            m.d.sync += [s2_valid.eq(s1_valid), s2_last.eq(s1_last), s2_count.eq(s1_count)]
        for j in lane_range:
            region = Signal(REGION_WORD_BITS, name=f"region_of{j}")
            entry = RegionEntry(region)
            with m.Switch(s1_heads[j][MAX_WIDTH:]):
                for p, reg in enumerate(regions):
                    with m.Case(p):
                        m.d.comb += region.eq(reg)
            shift = Signal(range(MAX_WIDTH + 1), name=f"shift{j}")
            m.d.comb += shift.eq(MAX_WIDTH - entry.width)
            with m.If(s2_free):
                m.d.sync += [
                    s2_lit[j].eq(entry.literal),
                    s2_pay[j].eq(s1_heads[j][:MAX_WIDTH] >> shift),
                    s2_base[j].eq(entry.base),
                    s2_room[j].eq(Mux(entry.base < num_ranked, num_ranked - entry.base, 0)),
                ]
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

        with m.If(s3_valid & bad_any & ((first_bad == 0) | self.o.ready)):
            m.d.sync += err.eq(1)
        m.d.comb += [
            self.o.valid.eq(s3_valid & ~err & ~(bad_any & (first_bad == 0))),
            self.o.payload.data.eq(Cat(Mux(s3_lit[j], s3_pay[j], rds[j].data) for j in lane_range)),
            self.o.payload.count.eq(Mux(bad_any, first_bad, s3_count)),
            self.o.payload.last.eq(s3_last & ~bad_any),
            self.error.eq(err),
        ]
        return m

    def _parser(self, m: Module, regions, s1_free, busy, err, bad_padding):
        """Window of three beats and the loop of N chained length selects; returns (parse,
        heads, count, last, padding_set).

        ``pos`` < beat + 11 N while parsing, and N codes from there end before 3 beats; beats
        wholly behind ``pos`` drop on the next clock, as in the single-lane decoder."""
        n_lanes, beat = self.lanes, WORD_BITS * self.words
        beat_log = beat.bit_length() - 1
        span = MAX_CODE_LENGTH * n_lanes
        active = busy
        remaining = Signal(COUNT_BITS)
        last = Signal()  # remaining <= lanes: this beat ends the packet
        bs = [Signal(beat, name=f"b{k}") for k in range(3)]
        held = Signal(range(4))
        pos = Signal(range(2 * beat + 1))
        fits_late, skip = Signal(), Signal()

        pops = pos[beat_log : beat_log + 2]
        left = Signal.like(held)
        nexts = [Signal(beat, name=f"next_b{k}") for k in range(3)]
        push = self.i.valid & self.i.ready
        m.d.comb += [
            self.i.ready.eq((held - pops < 3) & ~err),
            left.eq(held - pops),
            nexts[0].eq(Mux(pops == 0, bs[0], Mux(pops == 1, bs[1], bs[2]))),
            nexts[1].eq(Mux(pops == 0, bs[1], bs[2])),
            nexts[2].eq(bs[2]),
        ]
        with m.If(push), m.Switch(left):
            for k in range(3):
                with m.Case(k):
                    m.d.comb += nexts[k].eq(self.i.payload)
        m.d.sync += [b.eq(nb) for b, nb in zip(bs, nexts, strict=True)]
        m.d.sync += held.eq(left + push)

        window = Cat(*(b[::-1] for b in bs))  # bit k: the k-th stream bit from b0's top
        planes = [Cat(RegionEntry(r).width[k] for r in regions) for k in range(WIDTH_BITS)]
        at = pos
        heads, ends = [], []
        for j in range(n_lanes):
            head = Signal(MAX_CODE_LENGTH, name=f"head{j}")
            width = Signal(WIDTH_BITS, name=f"width{j}")
            m.d.comb += head.eq(window.bit_select(at, MAX_CODE_LENGTH)[::-1])
            for k, plane in enumerate(planes):
                m.d.comb += width[k].eq(plane.bit_select(head[MAX_WIDTH:], 1))
            nxt = Signal(range(3 * beat), name=f"end{j}")
            m.d.comb += nxt.eq(at + PREFIX_BITS + width)
            heads.append(head)
            ends.append(nxt)
            at = nxt
        count = Signal(range(n_lanes + 1))
        m.d.comb += count.eq(Mux(last, remaining, n_lanes))
        end = Signal(range(3 * beat))
        with m.Switch(count):
            for k in range(1, n_lanes + 1):
                with m.Case(k):
                    m.d.comb += end.eq(ends[k - 1])
        sure = Mux(
            held == 3, 1, Mux(held == 2, pos <= 2 * beat - span, (held == 1) & (pos <= beat - span))
        )
        parse = Signal()
        m.d.comb += parse.eq(active & s1_free & (sure | fits_late))
        rounded = Cat(C(0, beat_log), pos[beat_log : beat_log + 2] + (pos[:beat_log] != 0))
        moved = Mux(parse, end, Mux(skip, rounded, pos))
        take_n = self.n.valid & self.n.ready
        m.d.sync += [
            pos.eq(Cat(moved[:beat_log], moved[beat_log : beat_log + 2] - pops)),
            skip.eq(parse & last),
            # the exact check holds next clock if pos and the lane count stay (more beats only
            # help); a new packet's count changes how many codes must fit
            fits_late.eq(~parse & ~skip & ~take_n & (pops == 0) & (end <= held * beat)),
        ]

        # the padding skipped: the rest of the beat holding pos, below the stream bit at pos
        offset = pos[:beat_log]
        padding = Mux(pops == 0, bs[0], Mux(pops == 1, bs[1], bs[2])) << offset
        padding_set = skip & (offset != 0) & padding[:beat].any()

        m.d.comb += self.n.ready.eq(~active & ~err & ~bad_padding & ~self.tw.valid)
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
        return parse, heads, count, last, padding_set
