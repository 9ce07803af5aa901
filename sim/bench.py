"""Simulator-independent testbench: stream drivers, golden expectations and the test scenarios.

The same scenarios drive the Amaranth simulator (fast unit tests) and the generated Verilog under
cocotb/Icarus: a :class:`Port` hides how a signal is read, written and clocked. Signals are named
as in the generated Verilog (``i__valid``, ``o__payload``, ``error``); payloads are flat integers
in the StructLayout bit order of hw/tables.py.

Cycle protocol (both ports): at a drive point every driver sets its inputs, then ``settle`` lets
combinational logic settle, then handshakes are sampled (``valid & ready`` as the next clock edge
will see them), then ``tick`` moves to the next drive point across one rising edge.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
from zipccl.golden.codebook import Codebook
from zipccl.golden.streams import Codewords, StreamError, encode_codewords, pack_serial, resolve
from zipccl.hw.pool import default_words
from zipccl.hw.tables import WORD_BITS, Mem, pack_table_write, table_writes

MAX_CYCLES_PER_BEAT = 64  # a stuck design fails instead of hanging; generous for 25 % rates


class Aborted(Exception):
    """The bench reached its ``abort_at`` cycle (used to reset a block mid-packet)."""


class Port(Protocol):
    def set(self, name: str, value: int) -> None: ...
    def get(self, name: str) -> int: ...
    async def settle(self) -> None: ...
    async def tick(self) -> None: ...
    async def reset(self) -> None: ...


# ---------------------------------------------------------------------------- stream drivers
class Source:
    """Presents queued beats; once valid rises it holds (payload stable) until accepted."""

    def __init__(self, name: str, rate: float, rng: random.Random) -> None:
        self.name, self.rate, self.rng = name, rate, rng
        self.queue: deque[int] = deque()
        self.showing: int | None = None

    @property
    def idle(self) -> bool:
        return self.showing is None and not self.queue

    def clear(self) -> None:
        self.queue.clear()
        self.showing = None

    def drive(self, port: Port) -> None:
        if self.showing is None and self.queue and self.rng.random() < self.rate:
            self.showing = self.queue.popleft()
        port.set(f"{self.name}__valid", self.showing is not None)
        if self.showing is not None:
            port.set(f"{self.name}__payload", self.showing)

    def sample(self, port: Port) -> None:
        if self.showing is not None and port.get(f"{self.name}__ready"):
            self.showing = None


class Sink:
    """Random ready; records every accepted payload."""

    def __init__(self, name: str, rate: float, rng: random.Random) -> None:
        self.name, self.rate, self.rng = name, rate, rng
        self.got: list[int] = []
        self.ready = False

    def drive(self, port: Port) -> None:
        self.ready = self.rng.random() < self.rate
        port.set(f"{self.name}__ready", self.ready)

    def sample(self, port: Port) -> None:
        if self.ready and port.get(f"{self.name}__valid"):
            self.got.append(port.get(f"{self.name}__payload"))


@dataclass(frozen=True)
class Shape:
    """Beat layouts of a block: ``lanes`` symbols and ``words`` 32-bit words per beat;
    ``counted`` symbol beats carry a lane count (the multi-lane blocks of hw/multilane.py);
    ``tlast`` word beats carry the packet's end and their count of words above their data, and
    a packet is padded to a word, not a beat (hw/pool.py)."""

    lanes: int = 1
    words: int = 1
    counted: bool = False
    tlast: bool = False

    @property
    def beat_bits(self) -> int:
        return WORD_BITS * self.words

    def symbol_beats(self, packet: np.ndarray) -> list[int]:
        if not self.counted:
            return [int(s) | (i == len(packet) - 1) << 8 for i, s in enumerate(packet)]
        n, out = self.lanes, []
        for start in range(0, len(packet), n):
            chunk = packet[start : start + n]
            data = sum(int(s) << 8 * j for j, s in enumerate(chunk))
            last = start + n >= len(packet)
            out.append(data | len(chunk) << 8 * n | last << (8 * n + n.bit_length()))
        return out

    def symbols_of(self, beats: Sequence[int]) -> list[int]:
        """Output beats -> one ``symbol | last << 8`` per symbol (last on the packet's last)."""
        if not self.counted:
            return list(beats)
        n, out = self.lanes, []
        for b in beats:
            count = b >> 8 * n & ((1 << n.bit_length()) - 1)
            last = b >> (8 * n + n.bit_length()) & 1
            out += [(b >> 8 * j & 0xFF) | (last and j == count - 1) << 8 for j in range(count)]
        return out

    @classmethod
    def pool(cls, engines: int, words: int | None = None) -> Shape:
        """The decoder pool's beats (hw/pool.py): ``words`` (``default_words(E)``) words with
        ``tlast``, E symbols out."""
        words = default_words(engines) if words is None else words
        return cls(engines, words, counted=True, tlast=True)

    @property
    def pad_bits(self) -> int:
        """Where a packet's padding ends: a whole beat, or with ``tlast`` a whole word."""
        return WORD_BITS if self.tlast else self.beat_bits

    def packet_bytes(self, data: bytes) -> bytes:
        """A packet's serial bytes, zero padded to a multiple of ``pad_bits``."""
        return data + bytes(-len(data) % (self.pad_bits // 8))

    def word_beats(self, data: bytes) -> list[int]:
        """A packet's serial bytes -> beats of ``words`` big-endian words, the first on top,
        zero padded (with ``tlast``, above the data: ``last`` on the final beat, then the count
        of words the beat holds)."""
        data, size = self.packet_bytes(data), 4 * self.words
        beats = []
        for k in range(0, len(data), size):
            chunk = data[k : k + size]
            beat = int.from_bytes(chunk + bytes(size - len(chunk)), "big")
            if self.tlast:
                last = k + size >= len(data)
                beat |= (last | len(chunk) // 4 << 1) << self.beat_bits
            beats.append(beat)
        return beats

    def packet_beats(self, book: Codebook, packets: Sequence[np.ndarray]) -> tuple[list[int], int]:
        """Golden's word beats of ``packets`` coded with ``book``, and their codes' bits."""
        beats, bits = [], 0
        for p in packets:
            cw = encode_codewords(p, book)
            beats += self.word_beats(pack_serial(cw))
            bits += cw.total_bits
        return beats, bits

    def enc_fields(self, beat: int) -> tuple[int, int, int]:
        """Encoder output beat -> (data, last, bits)."""
        bits = self.beat_bits
        return beat & ((1 << bits) - 1), beat >> bits & 1, beat >> (bits + 1)


SINGLE = Shape()


@dataclass
class Bench:
    """Runs a block's streams cycle by cycle: ``sources`` feed it, ``sink`` drains it."""

    port: Port
    sources: dict[str, Source]
    sink: Sink
    shape: Shape = SINGLE
    out: Shape | None = None  # the output's beats where they differ (a loopback into a pool)
    cycles: int = 0
    watch_error: bool = False  # stop early when the ``error`` output rises
    abort_at: int | None = None  # raise Aborted at this cycle

    @classmethod
    def make(
        cls,
        port: Port,
        inputs: Sequence[str],
        seed: int,
        in_rate: float,
        out_rate: float,
        shape: Shape = SINGLE,
        out: Shape | None = None,
    ) -> Bench:
        rng = random.Random(seed)
        sources = {n: Source(n, 1.0 if n == "tw" else in_rate, rng) for n in inputs}
        return cls(port, sources, Sink("o", out_rate, rng), shape, out)

    @property
    def out_shape(self) -> Shape:
        return self.out or self.shape

    def error(self) -> bool:
        return self.watch_error and bool(self.port.get("error"))

    async def step(self) -> None:
        for s in self.sources.values():
            s.drive(self.port)
        self.sink.drive(self.port)
        await self.port.settle()
        for s in self.sources.values():
            s.sample(self.port)
        self.sink.sample(self.port)
        await self.port.tick()
        self.cycles += 1

    async def run_until(self, done: Callable[[], bool], budget: int) -> None:
        """Clock until ``done()`` (or the error flag); ``budget`` cycles at most, then fail."""
        start = self.cycles
        while not (done() or self.error()):
            if self.cycles == self.abort_at:
                raise Aborted
            if self.cycles - start > budget:
                raise AssertionError(f"stalled: {budget} cycles without finishing")
            await self.step()

    async def feed(self, beats: dict[str, Sequence[int]]) -> None:
        """Queue beats on several sources and clock until all of them are accepted."""
        for name, seq in beats.items():
            self.sources[name].queue.extend(int(b) for b in seq)
        total = sum(len(s) for s in beats.values())
        await self.run_until(
            lambda: all(self.sources[n].idle for n in beats), MAX_CYCLES_PER_BEAT * (total + 8)
        )

    async def drain(self, count: int) -> None:
        """Clock until the sink has ``count`` beats in all."""
        await self.run_until(lambda: len(self.sink.got) >= count, MAX_CYCLES_PER_BEAT * (count + 8))

    async def idle_cycles(self, n: int) -> None:
        for _ in range(n):
            await self.step()

    async def reset(self) -> None:
        for s in self.sources.values():
            s.clear()
            self.port.set(f"{s.name}__valid", 0)
        await self.port.reset()
        self.sink.got.clear()


# ---------------------------------------------------------------------------- golden side
def serial_words(data: bytes) -> list[int]:
    """Serial bytes -> 32-bit words, big-endian (bit 31 is the first stream bit), zero padded."""
    return SINGLE.word_beats(data)


def table_beats(book: Codebook, mems: tuple[Mem, ...] = tuple(Mem)) -> list[int]:
    return [pack_table_write(*w) for w in table_writes(book, mems)]


@dataclass
class Stats:
    """What a scenario checked: symbols, stream bits, clock cycles spent feeding and draining."""

    symbols: int = 0
    bits: int = 0
    cycles: int = 0
    notes: list[str] = field(default_factory=list)

    def add(self, other: Stats) -> None:
        self.symbols += other.symbols
        self.bits += other.bits
        self.cycles += other.cycles
        self.notes += other.notes


def _check_equal(what: str, got: Sequence[int], want: Sequence[int]) -> None:
    if list(got) != list(want):
        n = min(len(got), len(want))
        bad = next((i for i in range(n) if got[i] != want[i]), n)
        show = (got[bad] if bad < len(got) else None, want[bad] if bad < len(want) else None)
        raise AssertionError(
            f"{what}: mismatch at beat {bad} of {len(want)} (got {len(got)} beats): "
            f"got {show[0]!r}, want {show[1]!r}"
        )


def _check_beats(what: str, shape: Shape, got: Sequence[int], want: Sequence[int]) -> None:
    """Same symbols, and the same beats: lanes past a beat's count are don't-care."""
    _check_equal(what, shape.symbols_of(got), shape.symbols_of(want))
    if len(got) != len(want):
        raise AssertionError(f"{what}: {len(got)} beats, want {len(want)}")


# ---------------------------------------------------------------------------- scenarios
async def encode_packets(
    bench: Bench, book: Codebook, packets: Sequence[np.ndarray], load: bool = True
) -> Stats:
    """Load ``book`` through ``tw`` (unless told not to), encode, compare the words with golden/."""
    if load:
        await bench.feed({"tw": table_beats(book, (Mem.ENC,))})
    start, first = bench.cycles, len(bench.sink.got)
    want: list[tuple[int, int]] = []
    lasts: dict[int, int] = {}
    bits = 0
    shape = bench.shape
    for p in packets:
        cw = encode_codewords(p, book)
        words = shape.word_beats(pack_serial(cw))
        want += [(w, int(k == len(words) - 1)) for k, w in enumerate(words)]
        lasts[len(want) - 1] = cw.total_bits
        bits += cw.total_bits
    await bench.feed({"i": [b for p in packets for b in shape.symbol_beats(p)]})
    await bench.drain(first + len(want))
    got = [shape.enc_fields(b) for b in bench.sink.got[first:]]
    _check_equal(f"encoder words ({book.describe()})", [g[:2] for g in got], want)
    _check_equal(
        "encoder packet bit counts", [got[k][2] for k in sorted(lasts)], list(lasts.values())
    )
    return Stats(sum(len(p) for p in packets), bits, bench.cycles - start)


async def decode_packets(
    bench: Bench, book: Codebook, packets: Sequence[np.ndarray], load: bool = True
) -> Stats:
    """Load ``book`` (unless told not to), decode golden's words, compare the symbols."""
    if load:
        await bench.feed({"tw": table_beats(book, (Mem.REGION, Mem.RANK, Mem.COUNT))})
    start, first = bench.cycles, len(bench.sink.got)
    shape = bench.shape
    words, bits = shape.packet_beats(book, packets)
    want_beats = [b for p in packets for b in shape.symbol_beats(p)]
    await bench.feed({"n": [len(p) for p in packets], "i": words})
    await bench.drain(first + len(want_beats))
    _check_beats(f"decoder symbols ({book.describe()})", shape, bench.sink.got[first:], want_beats)
    return Stats(sum(len(p) for p in packets), bits, bench.cycles - start)


async def loopback_packets(
    bench: Bench, book: Codebook, packets: Sequence[np.ndarray], load: bool = True
) -> Stats:
    """Encoder -> decoder in hardware: the symbols must come back unchanged."""
    if load:
        await bench.feed({"tw": table_beats(book)})
    start, first = bench.cycles, len(bench.sink.got)
    beats = [b for p in packets for b in bench.shape.symbol_beats(p)]
    want = [b for p in packets for b in bench.out_shape.symbol_beats(p)]
    await bench.feed({"n": [len(p) for p in packets], "i": beats})
    await bench.drain(first + len(want))
    got = bench.sink.got[first:]
    _check_beats(f"loopback symbols ({book.describe()})", bench.out_shape, got, want)
    bits = sum(encode_codewords(p, book).total_bits for p in packets)
    return Stats(sum(len(p) for p in packets), bits, bench.cycles - start)


def illegal_stream(
    book: Codebook, symbols: np.ndarray, at: int, rng: np.random.Generator, shape: Shape = SINGLE
) -> list[int]:
    """Golden words of ``symbols`` with an illegal codeword (golden's resolve() rejects it)
    inserted at index ``at``: the decoder must emit exactly the ``at`` symbols before it."""
    cw = encode_codewords(symbols, book)
    _, base, literal = book.region_table()
    bad_regions = [
        p
        for p in range(len(book.widths))
        if not literal[p] and int(base[p]) + (1 << book.widths[p]) > book.num_ranked
    ]
    if not bad_regions:
        raise ValueError(f"{book.describe()} has no illegal codewords")
    p = int(rng.choice(bad_regions))
    lo = max(0, book.num_ranked - int(base[p]))
    v = int(rng.integers(lo, 1 << book.widths[p]))
    ins = lambda a, x: np.insert(a, at, x).astype(np.uint8)  # noqa: E731
    bad = Codewords(ins(cw.prefix, p), ins(cw.payload, v), ins(cw.width, book.widths[p]))
    try:
        resolve(bad, book)
    except StreamError as exc:
        if f"symbol {at}:" not in str(exc):
            raise AssertionError(f"golden rejects a different codeword: {exc}") from None
    else:
        raise AssertionError("golden accepted the illegal codeword")
    return shape.word_beats(pack_serial(bad))


async def decode_illegal(
    bench: Bench, book: Codebook, symbols: np.ndarray, at: int, rng: np.random.Generator
) -> Stats:
    """The decoder emits the symbols before the illegal codeword, raises ``error`` and stops."""
    await bench.feed({"tw": table_beats(book, (Mem.REGION, Mem.RANK, Mem.COUNT))})
    words = illegal_stream(book, symbols, at, rng, bench.shape)
    first = len(bench.sink.got)
    bench.watch_error = True
    bench.sources["n"].queue.append(len(symbols) + 1)
    bench.sources["i"].queue.extend(words)
    await bench.run_until(lambda: False, MAX_CYCLES_PER_BEAT * (len(words) + len(symbols) + 8))
    await bench.idle_cycles(20)
    if not bench.port.get("error"):
        raise AssertionError("decoder did not raise error on an illegal codeword")
    want = [int(s) for s in symbols[:at]]
    got = [g & 0xFF for g in bench.shape.symbols_of(bench.sink.got[first:])]
    _check_equal("symbols before the illegal codeword", got, want)
    return Stats(at, 0, 0, [f"expected error: illegal codeword at symbol {at} flagged"])


def bad_padding_stream(
    book: Codebook, symbols: np.ndarray, rng: np.random.Generator, shape: Shape = SINGLE
) -> list[int]:
    """Golden beats of ``symbols`` with one bit of the packet's padding set to 1."""
    cw = encode_codewords(symbols, book)
    data = shape.packet_bytes(pack_serial(cw))
    pad = 8 * len(data) - cw.total_bits
    if pad == 0:
        raise ValueError("the packet fills its last beat: it has no padding to corrupt")
    bad = int.from_bytes(data, "big") | 1 << int(rng.integers(pad))
    return shape.word_beats(bad.to_bytes(len(data), "big"))


async def decode_bad_padding(
    bench: Bench, book: Codebook, symbols: np.ndarray, rng: np.random.Generator
) -> Stats:
    """A 1 in the padding after the last codeword: the packet's symbols come out, then
    ``error``, and nothing more."""
    await bench.feed({"tw": table_beats(book, (Mem.REGION, Mem.RANK, Mem.COUNT))})
    beats = bad_padding_stream(book, symbols, rng, bench.shape)
    first = len(bench.sink.got)
    bench.watch_error = True
    bench.sources["n"].queue.append(len(symbols))
    bench.sources["i"].queue.extend(beats)
    await bench.run_until(lambda: False, MAX_CYCLES_PER_BEAT * (len(beats) + len(symbols) + 8))
    await bench.idle_cycles(20)
    if not bench.port.get("error"):
        raise AssertionError("decoder did not raise error on non-zero padding")
    got = bench.shape.symbols_of(bench.sink.got[first:])
    want = [int(s) | (k == len(symbols) - 1) << 8 for k, s in enumerate(symbols)]
    _check_equal("symbols of a packet with non-zero padding", got, want)
    note = "expected error: non-zero padding flagged after the packet's symbols"
    return Stats(len(symbols), 0, 0, [note])
