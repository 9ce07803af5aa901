"""cocotb test module: the AXI4-Stream tops (hw/axis.py) against golden/, with cocotbext-axi.

AXI-Stream sources and sinks with random pauses drive a top's streams; every packet is checked
byte for byte with golden/: the encoder's frame is golden's serial bytes (zero padded to the beat)
and its last ``tuser`` the packet's bit count, the decoder's frame is the packet's symbols. Tables
from golden's builders and random codebooks are loaded through ``s_axis_table`` before each
table's packets. The decoder must also raise ``error`` on non-zero padding after a packet's last
codeword, having emitted at most that packet's symbols. Configured by the environment (set by
tests/test_rtl_axis.py): ZIPCCL_KIND (encoder, decoder), ZIPCCL_LANES, ZIPCCL_SEED.
"""

from __future__ import annotations

import os
import random
import struct

import cocotb
import numpy as np
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, RisingEdge, with_timeout
from cocotbext.axi import AxiStreamBus, AxiStreamFrame, AxiStreamSink, AxiStreamSource
from zipccl.golden.codebook import Codebook
from zipccl.golden.streams import encode_codewords, pack_serial
from zipccl.hw.multilane import words_per_beat
from zipccl.hw.tables import Mem, pack_table_write, table_writes
from zipccl.sim.cases import builder_sets, load_data, random_book, symbol_mix

PERIOD_NS = 10


def _pauses(rng: random.Random, rate: float):
    while True:
        yield rng.random() > rate


def padded(data: bytes, size: int) -> bytes:
    return data + bytes(-len(data) % size)


class Top:
    """The top's streams as cocotbext-axi endpoints, with random pauses on every one."""

    def __init__(self, dut, rng: random.Random) -> None:
        self.dut = dut
        self.decoder = os.environ["ZIPCCL_KIND"] == "decoder"
        self.lanes = int(os.environ["ZIPCCL_LANES"])
        # where a packet's bytes end: a whole beat, or a whole word where tkeep says how many a
        # beat holds (the decoder pool)
        keeps = hasattr(dut, "s_axis_tkeep") and self.decoder
        self.pad_to = 4 if keeps else 4 * words_per_beat(self.lanes)

        def bus(prefix: str) -> AxiStreamBus:
            return AxiStreamBus.from_prefix(dut, prefix)

        clk, rst = dut.aclk, dut.aresetn
        self.table = AxiStreamSource(bus("s_axis_table"), clk, rst, reset_active_level=False)
        self.source = AxiStreamSource(bus("s_axis"), clk, rst, reset_active_level=False)
        self.sink = AxiStreamSink(bus("m_axis"), clk, rst, reset_active_level=False)
        self.count = (
            AxiStreamSource(bus("s_axis_count"), clk, rst, reset_active_level=False)
            if self.decoder
            else None
        )
        for port in (self.source, self.sink, self.count):
            if port is not None:
                port.set_pause_generator(_pauses(rng, 0.6))

    async def reset(self) -> None:
        self.dut.aresetn.value = 0
        await ClockCycles(self.dut.aclk, 2)
        self.dut.aresetn.value = 1
        await RisingEdge(self.dut.aclk)

    async def load(self, book: Codebook) -> None:
        mems = (Mem.REGION, Mem.RANK, Mem.COUNT) if self.decoder else (Mem.ENC,)
        beats = [pack_table_write(*w) for w in table_writes(book, mems)]
        await self.table.send(AxiStreamFrame(b"".join(struct.pack("<I", b) for b in beats)))
        await self.table.wait()

    async def send(self, book: Codebook, packet: np.ndarray) -> None:
        if not self.decoder:
            await self.source.send(AxiStreamFrame(bytes(packet)))
            return
        await self.count.send(AxiStreamFrame(struct.pack("<I", len(packet))))
        serial = pack_serial(encode_codewords(packet, book))
        await self.source.send(AxiStreamFrame(padded(serial, self.pad_to)))

    async def check(self, book: Codebook, packet: np.ndarray) -> None:
        frame = await with_timeout(self.sink.recv(), 200 * (len(packet) + 50), "ns")
        if self.decoder:
            assert bytes(frame.tdata) == bytes(packet), f"decoded symbols differ ({book.name})"
            return
        cw = encode_codewords(packet, book)
        assert bytes(frame.tdata) == padded(pack_serial(cw), self.pad_to), "words differ"
        bits = frame.tuser[-1] if isinstance(frame.tuser, list) else frame.tuser
        assert bits == cw.total_bits, f"bit count {bits}, want {cw.total_bits}"


@cocotb.test()
async def axis_against_golden(dut) -> None:
    """Builder tables and random codebooks, packets of 1..N+2 symbols and real data."""
    seed = int(os.environ.get("ZIPCCL_SEED", "1"))
    rng, nrng = random.Random(seed), np.random.default_rng(seed)
    Clock(dut.aclk, PERIOD_NS, unit="ns").start()
    top = Top(dut, rng)
    await top.reset()
    data = load_data()
    books = [ds.book for ds in builder_sets(data)[:5]] + [random_book(nrng) for _ in range(2)]
    real = data["fp8_ffn1"]
    for book in books:
        await top.load(book)
        packets = [symbol_mix(nrng, real, 48)]
        packets += [
            nrng.integers(0, 256, int(nrng.integers(1, top.lanes + 3))).astype(np.uint8)
            for _ in range(3)
        ]
        for p in packets:
            cocotb.start_soon(top.send(book, p))
        for p in packets:
            await top.check(book, p)


@cocotb.test()
async def decoder_rejects_bad_padding(dut) -> None:
    """A 1 in the padding after the last codeword: ``error``, and no symbol past the packet."""
    if os.environ["ZIPCCL_KIND"] != "decoder":
        return
    rng, nrng = random.Random(5), np.random.default_rng(5)
    Clock(dut.aclk, PERIOD_NS, unit="ns").start()
    top = Top(dut, rng)
    await top.reset()
    book = builder_sets(load_data())[4].book
    packet = nrng.integers(0, 256, 37).astype(np.uint8)
    cw = encode_codewords(packet, book)
    serial = padded(pack_serial(cw), top.pad_to)
    pad_bits = 8 * len(serial) - cw.total_bits
    assert pad_bits > 0, "pick a packet that leaves padding"
    bad = int.from_bytes(serial, "big") | 1 << int(nrng.integers(pad_bits))
    await top.load(book)
    await top.count.send(AxiStreamFrame(struct.pack("<I", len(packet))))
    await top.source.send(AxiStreamFrame(bad.to_bytes(len(serial), "big")))
    for _ in range(40 * len(serial)):
        await RisingEdge(dut.aclk)
        if dut.error.value:
            break
    assert dut.error.value, "no error on non-zero padding"
    await ClockCycles(dut.aclk, 20)
    got = bytes(top.sink.read_nowait()) if not top.sink.empty() else b""
    assert got == bytes(packet[: len(got)]), "symbols out that are not the packet's"
