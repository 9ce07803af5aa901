"""Stream layouts and table memories shared by the QLC encoder and decoder.

The word layouts of the three table memories are golden/codebook.py's constants, so a Codebook's
``encoder_words/region_words/rank_words`` images load unchanged: as reset-time init of the memories
(the bitstream's default table) or, one word per beat, through the ``tw`` table-write stream. One
write stream can feed both blocks: each block keeps the memories it uses and drops the rest.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

from amaranth import Module, Signal, Value, unsigned
from amaranth.lib import data, memory
from zipccl.golden import presets
from zipccl.golden.codebook import (
    ALPHABET,
    ENC_PAYLOAD_BITS,
    ENC_PREFIX_SHIFT,
    ENC_WIDTH_SHIFT,
    ENC_WORD_BITS,
    MAX_CODE_LENGTH,
    PREFIX_BITS,
    RANK_COUNT_BITS,
    REGION_BASE_BITS,
    REGION_LITERAL_SHIFT,
    REGION_WIDTH_SHIFT,
    REGION_WORD_BITS,
    Codebook,
)

WORD_BITS = 32  # serial stream word; bit 31 is the first stream bit (big-endian words)
WIDTH_BITS = 4
COUNT_BITS = 32  # symbols per packet (decoder) and bits per packet (encoder report)


class Mem(enum.IntEnum):
    """Which table memory a ``tw`` beat writes."""

    ENC = 0  # 256 x ENC_WORD_BITS   {width, prefix, payload}
    REGION = 1  # 8 x REGION_WORD_BITS {literal, width, base}
    RANK = 2  # 256 x 8              rank -> symbol
    COUNT = 3  # 1 x RANK_COUNT_BITS  number of ranked symbols


TW_DATA_BITS = max(ENC_WORD_BITS, REGION_WORD_BITS, RANK_COUNT_BITS, 8)

SymbolLayout = data.StructLayout({"data": 8, "last": 1})
WordLayout = data.StructLayout({"data": WORD_BITS, "last": 1})
# Encoder output: the packet's bit count rides on every word and is final on the ``last`` word.
EncWordLayout = data.StructLayout({"data": WORD_BITS, "last": 1, "bits": COUNT_BITS})
TableWriteLayout = data.StructLayout(
    {"mem": unsigned(2), "addr": unsigned(8), "data": unsigned(TW_DATA_BITS)}
)

EncEntry = data.StructLayout(
    {"payload": ENC_PAYLOAD_BITS, "prefix": PREFIX_BITS, "width": WIDTH_BITS}
)
RegionEntry = data.StructLayout({"base": REGION_BASE_BITS, "width": WIDTH_BITS, "literal": 1})

assert EncEntry.size == ENC_WORD_BITS
assert EncEntry["prefix"].offset == ENC_PREFIX_SHIFT
assert EncEntry["width"].offset == ENC_WIDTH_SHIFT
assert RegionEntry.size == REGION_WORD_BITS
assert RegionEntry["width"].offset == REGION_WIDTH_SHIFT
assert RegionEntry["literal"].offset == REGION_LITERAL_SHIFT


def table_writes(book: Codebook, mems: tuple[Mem, ...] = tuple(Mem)) -> list[tuple[int, int, int]]:
    """(mem, addr, data) beats that load ``book`` into the selected memories."""
    images = {
        Mem.ENC: book.encoder_words(),
        Mem.REGION: book.region_words(),
        Mem.RANK: book.rank_words(),
        Mem.COUNT: [book.num_ranked],
    }
    return [(int(m), a, w) for m in mems for a, w in enumerate(images[m])]


def pack_table_write(mem: int, addr: int, word: int) -> int:
    """The flat ``tw.payload`` value of one beat (StructLayout fields sit LSB first)."""
    return mem | addr << 2 | word << 10


def default_book() -> Codebook:
    """The table a block holds after configuration when none is given: the QLC e4m3 preset."""
    return presets.qlc_e4m3()


def encoder_lut(book: Codebook) -> memory.Memory:
    """An encoder's LUT (symbol -> ``EncEntry``) holding ``book``. The encoders build it with the
    block, before it elaborates, so that a formal harness can add a read port (sim/formal.py)."""
    return memory.Memory(shape=ENC_WORD_BITS, depth=ALPHABET, init=book.encoder_words())


def table_write_port(m: Module, tw, ready: Value, wrs: Sequence, mem: Mem) -> Value:
    """Accept ``tw`` beats while ``ready`` and write those addressed to ``mem`` through the memory
    write ports ``wrs`` (one per copy of the table); returns the beat-taken signal (for the
    tables a block keeps in registers)."""
    take = tw.valid & ready
    m.d.comb += tw.ready.eq(ready)
    for port in wrs:
        m.d.comb += [
            port.addr.eq(tw.payload.addr),
            port.data.eq(tw.payload.data),
            port.en.eq(take & (tw.payload.mem == mem)),
        ]
    return take


class DecoderTables:
    """A decoder's tables: the 8 region words and the rank count in registers, the rank LUT in a
    memory (``lut``: the caller adds its read ports and the memory to its module), all starting
    as ``book`` (reset-time init; reset does not touch them, like the memory). Built with the
    block, before it elaborates, so that a formal harness can read them (sim/formal.py)."""

    def __init__(self, book: Codebook) -> None:
        self.regions = [
            Signal(REGION_WORD_BITS, init=w, reset_less=True, name=f"region{p}")
            for p, w in enumerate(book.region_words())
        ]
        self.num_ranked = Signal(RANK_COUNT_BITS, init=book.num_ranked, reset_less=True)
        self.lut = memory.Memory(shape=8, depth=ALPHABET, init=book.rank_words())

    def write_port(self, m: Module, tw, ready: Value, wr) -> None:
        """Take ``tw`` beats while ``ready``: ranks through the memory write port ``wr``, region
        words and the count into their registers."""
        take = table_write_port(m, tw, ready, [wr], Mem.RANK)
        with m.If(take & (tw.payload.mem == Mem.REGION)), m.Switch(tw.payload.addr):
            for p, reg in enumerate(self.regions):
                with m.Case(p):
                    m.d.sync += reg.eq(tw.payload.data)
        with m.If(take & (tw.payload.mem == Mem.COUNT)):
            m.d.sync += self.num_ranked.eq(tw.payload.data)


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
