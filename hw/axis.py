"""AXI4-Stream tops of the QLC blocks: the port names a Vivado or Quartus user expects.

Each top runs its block on ``aclk`` with the active-low synchronous ``aresetn`` and renames the
streams (``tdata/tvalid/tready/tlast``). Byte lanes follow AXI: lane 0 (``tdata[7:0]``) is the
first byte of the stream, so a word frame carries the serial layout's bytes in order (the blocks'
big-endian words are byte-swapped here) and a symbol beat's ``tkeep`` marks its valid symbols
(low lanes first; fewer only on a packet's last beat).

* encoder: symbols on ``s_axis`` (``tlast`` ends a packet) -> words on ``m_axis`` (``tlast`` on
  the packet's last beat, whose ``tuser`` is the packet's bit count; the rest is zero padding).
* decoder: each packet's symbol count on ``s_axis_count`` (32 bits), its words on ``s_axis``
  (``tlast`` is accepted and ignored: the count ends the packet) -> symbols on ``m_axis``;
  ``error`` rises on an illegal codeword or non-zero padding and holds until reset.
* decoder pool (hw/pool.py): the same ports plus ``s_axis_tkeep``, and a packet is its serial
  bytes padded to a whole 32-bit word only: ``tlast`` marks its last beat (the pool hands whole
  packets to its engines by it) and ``tkeep`` that beat's words (whole words from lane 0, as
  AXI's packed streams; a word counts by its first byte's bit); the next packet starts on a new
  beat.
* both: table writes on ``s_axis_table`` (32 bits: ``mem | addr << 2 | word << 10``, see
  hw.tables.pack_table_write), taken between packets.
"""

from __future__ import annotations

from amaranth import C, Cat, ClockDomain, Module, Value
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from zipccl.golden.codebook import Codebook
from zipccl.hw.decoder import QLCDecoder
from zipccl.hw.encoder import QLCEncoder
from zipccl.hw.multilane import QLCDecoderN, QLCEncoderN, words_per_beat
from zipccl.hw.pool import QLCDecoderPool, default_words
from zipccl.hw.tables import COUNT_BITS, TableWriteLayout

TABLE_TDATA_BITS = 32  # a table write beat, zero extended to whole bytes


def byte_swap(value: Value) -> Value:
    """Reverse the byte order: the blocks' first stream byte on top <-> AXI byte lane 0."""
    return Cat(value[k : k + 8] for k in reversed(range(0, len(value), 8)))


def _axis(prefix: str, flow, data_bits: int, *extra: tuple[str, int]) -> dict:
    """Members of one AXI4-Stream port (``flow`` is the data direction)."""
    back = Out if flow is In else In
    members = {
        f"{prefix}_tdata": flow(data_bits),
        f"{prefix}_tvalid": flow(1),
        f"{prefix}_tready": back(1),
    }
    members.update({f"{prefix}_{name}": flow(bits) for name, bits in extra})
    return members


class _AxisTop(wiring.Component):
    """Clock, reset and the table port shared by both tops."""

    def __init__(self, members: dict) -> None:
        super().__init__(
            {
                "aclk": In(1),
                "aresetn": In(1),
                **members,
                **_axis("s_axis_table", In, TABLE_TDATA_BITS),
            }
        )

    def _clocked(self, core: wiring.Component) -> Module:
        m = Module()
        m.domains.sync = cd = ClockDomain("sync")
        m.submodules.core = core
        m.d.comb += [
            cd.clk.eq(self.aclk),
            cd.rst.eq(~self.aresetn),
            core.tw.payload.eq(self.s_axis_table_tdata[: TableWriteLayout.size]),
            core.tw.valid.eq(self.s_axis_table_tvalid),
            self.s_axis_table_tready.eq(core.tw.ready),
        ]
        return m


class AxisEncoder(_AxisTop):
    """The encoder (``lanes`` symbols per beat) behind AXI4-Stream ports."""

    def __init__(self, lanes: int = 1, book: Codebook | None = None) -> None:
        self.lanes, self.book = lanes, book
        words = words_per_beat(lanes)
        super().__init__(
            {
                **_axis("s_axis", In, 8 * lanes, ("tkeep", lanes), ("tlast", 1)),
                **_axis("m_axis", Out, 32 * words, ("tlast", 1), ("tuser", COUNT_BITS)),
            }
        )

    def elaborate(self, platform) -> Module:
        core = QLCEncoder(self.book) if self.lanes == 1 else QLCEncoderN(self.lanes, self.book)
        m = self._clocked(core)
        m.d.comb += [
            core.i.payload.data.eq(self.s_axis_tdata),
            core.i.payload.last.eq(self.s_axis_tlast),
            core.i.valid.eq(self.s_axis_tvalid),
            self.s_axis_tready.eq(core.i.ready),
            self.m_axis_tdata.eq(byte_swap(core.o.payload.data)),
            self.m_axis_tlast.eq(core.o.payload.last),
            self.m_axis_tuser.eq(core.o.payload.bits),
            self.m_axis_tvalid.eq(core.o.valid),
            core.o.ready.eq(self.m_axis_tready),
        ]
        if self.lanes > 1:
            m.d.comb += core.i.payload.count.eq(sum(self.s_axis_tkeep))
        return m


class AxisDecoder(_AxisTop):
    """The decoder (``lanes`` symbols per beat; with ``pool``, a pool of ``lanes`` engines)
    behind AXI4-Stream ports, plus ``error``."""

    def __init__(self, lanes: int = 1, book: Codebook | None = None, *, pool: bool = False) -> None:
        self.lanes, self.book, self.pool = lanes, book, pool
        words = default_words(lanes) if pool else words_per_beat(lanes)
        keep = (("tkeep", 4 * words),) if pool else ()
        super().__init__(
            {
                **_axis("s_axis_count", In, COUNT_BITS),
                **_axis("s_axis", In, 32 * words, *keep, ("tlast", 1)),
                **_axis("m_axis", Out, 8 * lanes, ("tkeep", lanes), ("tlast", 1)),
                "error": Out(1),
            }
        )

    def elaborate(self, platform) -> Module:
        if self.pool:
            core = QLCDecoderPool(self.lanes, self.book)
        else:
            core = QLCDecoder(self.book) if self.lanes == 1 else QLCDecoderN(self.lanes, self.book)
        m = self._clocked(core)
        if self.pool:  # its beats carry tlast, which hands a packet to an engine, and tkeep
            words = core.i.payload.data
            m.d.comb += [
                core.i.payload.last.eq(self.s_axis_tlast),
                core.i.payload.words.eq(sum(self.s_axis_tkeep[::4])),
            ]
        else:
            words = core.i.payload
        m.d.comb += [
            core.n.payload.eq(self.s_axis_count_tdata),
            core.n.valid.eq(self.s_axis_count_tvalid),
            self.s_axis_count_tready.eq(core.n.ready),
            words.eq(byte_swap(self.s_axis_tdata)),
            core.i.valid.eq(self.s_axis_tvalid),
            self.s_axis_tready.eq(core.i.ready),
            self.m_axis_tdata.eq(core.o.payload.data),
            self.m_axis_tlast.eq(core.o.payload.last),
            self.m_axis_tvalid.eq(core.o.valid),
            core.o.ready.eq(self.m_axis_tready),
            self.error.eq(core.error),
        ]
        if self.lanes == 1:
            m.d.comb += self.m_axis_tkeep.eq(1)
        else:  # the count's low lanes
            m.d.comb += self.m_axis_tkeep.eq((C(1, self.lanes + 1) << core.o.payload.count) - 1)
        return m
