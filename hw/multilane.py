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

:class:`QLCDecoderN`: hw.decoder's design at N lanes (registered widths at every offset, N
one-hot code steps in the loop, N heads, N region lookups, N rank LUT read ports). An illegal
code in lane j: lanes before j go out as a partial beat, then ``error``. A packet's padding (the
rest of its last beat) must be zero: a 1 raises ``error`` after the packet's last symbols, as in
the single-lane decoder.
"""

from __future__ import annotations

from amaranth import C, Cat, Module, Mux, Signal, Value
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out
from zipccl.golden.codebook import (
    MAX_CODE_LENGTH,
    MAX_WIDTH,
    PREFIX_BITS,
    Codebook,
)
from zipccl.hw.decoder import QLCDecoder
from zipccl.hw.packer import add_packer
from zipccl.hw.tables import (
    COUNT_BITS,
    WORD_BITS,
    EncEntry,
    Mem,
    TableWriteLayout,
    default_book,
    encoder_lut,
    lane_layout,
    table_write_port,
    words_per_beat,
)

MULTI_LANES = (2, 4, 8)  # both blocks (the single-lane blocks are N = 1)
ENCODER_ONLY_LANES = (16, 32)  # 16: a billion symbols/s on an ECP5; 32: the QLC paper's batch


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
        # a copy of the table per lane, each with one read port: as a flow with 2-port block
        # RAMs maps it, and within yosys' memory_libmap, whose search over one memory's many
        # read ports exhausted the dev machine's memory at 16 ports
        self.luts = [encoder_lut(self.book) for _ in range(lanes)]
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
        rds, wrs = [], []
        for j, lut in enumerate(self.luts):
            m.submodules[f"lut{j}"] = lut
            rds.append(lut.read_port())
            wrs.append(lut.write_port())

        in_packet = Signal(name="in_packet")
        s1_valid, s1_last = Signal(name="s1_valid"), Signal(name="s1_last")
        s1_count = Signal(range(n_lanes + 1), name="s1_count")
        s2_valid, s2_last = Signal(name="s2_valid"), Signal(name="s2_last")
        s2_codes = [Signal(MAX_CODE_LENGTH, name=f"s2_code{j}") for j in range(n_lanes)]
        s2_lens = [Signal(range(MAX_CODE_LENGTH + 1), name=f"s2_len{j}") for j in range(n_lanes)]

        tw_take = table_write_port(m, self.tw, ~in_packet, wrs, Mem.ENC)

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


class QLCDecoderN(QLCDecoder):
    """N-lane decoder: counts (``n``) and word beats (``i``) -> symbol beats (``o``); the
    design is hw.decoder's at N lanes."""

    def __init__(self, lanes: int, book: Codebook | None = None) -> None:
        super().__init__(book, lanes=lanes)
