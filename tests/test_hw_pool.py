"""The decoder pool (hw/pool.py) in Amaranth's simulator against golden/.

Small FIFOs (``depth``) so that back-pressure reaches the dispatcher; the cocotb suite
(``python -m zipccl.sim``, block ``qlc_decoder_pool_x{E}``) runs the generated Verilog at full
depth.
"""

from __future__ import annotations

import numpy as np
import pytest
from amaranth import Module, Signal
from amaranth.sim import Simulator
from zipccl.golden.codebook import Codebook
from zipccl.hw.loopback import QLCLoopback, pool_beat
from zipccl.hw.multilane import beat_layout
from zipccl.hw.pool import POOL_ENGINES, QLCDecoderPool, default_words, pool_beat_layout
from zipccl.hw.tables import WORD_BITS, Mem, words_per_beat
from zipccl.sim.amaranth_port import run_amaranth
from zipccl.sim.bench import (
    Bench,
    Shape,
    bad_padding_stream,
    decode_packets,
    illegal_stream,
    loopback_packets,
    table_beats,
)
from zipccl.sim.cases import DataSet, builder_sets, illegal_book, length_set, load_data, symbol_mix
from zipccl.sim.suite import DEC_IN, packets_of, with_padding

DATA = load_data()
SETS = builder_sets(DATA)


def _beats(shape: Shape, book: Codebook, packets: list[np.ndarray]) -> list[int]:
    return shape.packet_beats(book, packets)[0]


def _run(
    engines: int,
    seed: int,
    in_rate: float,
    out_rate: float,
    body,
    depth: int = 16,
    words: int | None = None,
):
    shape = Shape.pool(engines, words)
    return run_amaranth(
        QLCDecoderPool(engines, depth=depth, words=words),
        lambda port: body(Bench.make(port, DEC_IN, seed, in_rate, out_rate, shape)),
    )


def test_bad_parameters() -> None:
    with pytest.raises(ValueError, match="at least 2 engines"):
        QLCDecoderPool(1)
    with pytest.raises(ValueError, match="depth"):
        QLCDecoderPool(4, depth=8)
    with pytest.raises(ValueError, match="at least 1 word"):
        QLCDecoderPool(4, words=0)


def test_default_beats_carry_e_codes() -> None:
    """Up to 8 engines the multi-lane decoder's power-of-two beats; past 8 the fewest words
    that hold E 11-bit codes."""
    assert [default_words(e) for e in POOL_ENGINES] == [1, 2, 4, 5, 5]
    for e in range(2, 40):
        assert WORD_BITS * default_words(e) >= 11 * e


@pytest.mark.parametrize(("engines", "words"), [(4, 3), (2, 5)])
def test_beats_of_any_width(engines: int, words: int) -> None:
    """Beats of a width that is not the default (odd, and wider than the engines need):
    every symbol in order under back-pressure, packets of random sizes."""
    seed = 41 + words
    rng = np.random.default_rng(seed)

    async def body(bench):
        for ds in SETS[:2]:
            sizes = [0, 1, *rng.integers(0, 120, 8), engines]
            await decode_packets(bench, ds.book, [symbol_mix(rng, ds.symbols, s) for s in sizes])

    _run(engines, seed, 0.6, 0.6, body, words=words)


@pytest.mark.parametrize("engines", [2, 4])
def test_packets_in_order_under_backpressure(engines: int) -> None:
    """Packets of 0..200 symbols (a count of 0 has no beats) under builder tables, random
    valid/ready everywhere, FIFOs far smaller than a packet: every symbol in order."""
    seed = 11 + engines
    rng = np.random.default_rng(seed)

    async def body(bench):
        for ds in SETS[:3]:
            sizes = [0, 1, *rng.integers(0, 200, 6), engines, 2]
            await decode_packets(bench, ds.book, [symbol_mix(rng, ds.symbols, s) for s in sizes])

    _run(engines, seed, 0.6, 0.6, body)


def test_e_packets_decode_at_once() -> None:
    """16 packets of 256 eleven-bit codes, no back-pressure: the four engines overlap, so the
    stream takes well under half the clocks of one engine (4096 + fill); the first packet
    still leaves at one symbol per clock, so 16 packets give about 3.3, not 4."""
    ds = length_set(11, 16 * 256)

    async def body(bench):
        return await decode_packets(bench, ds.book, packets_of(ds.symbols, 256))

    stats = _run(4, 0, 1.0, 1.0, body, depth=256)
    assert stats.symbols / stats.cycles > 3.0, stats


def _around_a_table_write(
    engines: int,
    seed: int,
    old: DataSet,
    new: DataSet,
    first: list[np.ndarray],
    second: list[np.ndarray],
    depth: int,
) -> None:
    """Packets ``first`` under table ``old``, a table write, packets ``second`` under ``new``,
    through a pool of ``engines`` with random valid/ready: every symbol back in order."""
    shape = Shape.pool(engines)

    async def body(bench):
        await bench.feed({"tw": table_beats(old.book, (Mem.REGION, Mem.RANK, Mem.COUNT))})
        await bench.feed({"n": [len(p) for p in first], "i": _beats(shape, old.book, first)})
        await bench.feed({"tw": table_beats(new.book, (Mem.REGION, Mem.RANK, Mem.COUNT))})
        await bench.feed({"n": [len(p) for p in second], "i": _beats(shape, new.book, second)})
        want = [b for p in first + second for b in shape.symbol_beats(p)]
        await bench.drain(len(want))
        assert shape.symbols_of(bench.sink.got) == shape.symbols_of(want)

    _run(engines, seed, 0.7, 0.7, body, depth=depth)


def test_table_write_waits_for_counted_packets() -> None:
    """A table write queued while the engines still decode the packets counted before it:
    those keep the old table, the packets after it get the new one."""
    seed = 5
    rng = np.random.default_rng(seed)
    old, new = SETS[1], SETS[4]
    first = [symbol_mix(rng, old.symbols, 200) for _ in range(6)]
    second = [symbol_mix(rng, new.symbols, 150) for _ in range(5)]
    _around_a_table_write(4, seed, old, new, first, second, depth=64)


def test_twelve_engines_in_order_around_a_table_write() -> None:
    """The 12-engine pool (sized for a billion symbols per second on the ECP5): packets round
    the engines and past them, a table write between two of them, random valid/ready
    everywhere: every symbol in order, each packet under its own table."""
    seed, engines = 12, 12
    rng = np.random.default_rng(seed)
    old, new = SETS[0], SETS[3]
    first = [symbol_mix(rng, old.symbols, int(rng.integers(1, 40))) for _ in range(engines + 3)]
    second = [symbol_mix(rng, new.symbols, int(rng.integers(1, 40))) for _ in range(5)]
    _around_a_table_write(engines, seed, old, new, first, second, depth=16)


def _error_case(
    engines: int, kind: str, seed: int, good: int, out_rate: float, *, short: bool = False
) -> None:
    """``good`` good packets, then one with an illegal codeword or bad padding, then 2 E good
    ones, random valid/ready (the sink's at ``out_rate``): the packets before the bad one come
    out whole; of the bad one, the symbols before an illegal codeword, or all of it before bad
    padding; then ``error``, and nothing of the packets after it, although other engines
    decode them. ``short``: the good packets of 8 symbols and the illegal codeword the bad
    packet's third, so that an engine reaches it while its earlier packet still waits."""
    rng = np.random.default_rng(seed)
    shape = Shape.pool(engines)
    book = illegal_book(rng)
    real = DATA["fp8_ffn1"]
    if short:
        before = [rng.choice(real, 8) for _ in range(good)]
    else:
        before = [symbol_mix(rng, real, int(rng.integers(20, 120))) for _ in range(good)]
    after = [symbol_mix(rng, DATA["fp8_ffn1"], 80) for _ in range(2 * engines)]
    bad = with_padding(book, symbol_mix(rng, DATA["fp8_ffn1"], 60), shape.pad_bits)
    if kind == "illegal":
        at = 2 if short else int(rng.integers(len(bad)))
        bad_beats, bad_count, kept = illegal_stream(book, bad, at, rng, shape), len(bad) + 1, at
    else:
        bad_beats, bad_count, kept = bad_padding_stream(book, bad, rng, shape), len(bad), len(bad)

    async def body(bench):
        await bench.feed({"tw": table_beats(book, (Mem.REGION, Mem.RANK, Mem.COUNT))})
        bench.watch_error = True
        bench.sources["n"].queue.extend([*(len(p) for p in before), bad_count])
        bench.sources["n"].queue.extend(len(p) for p in after)
        beats = _beats(shape, book, before) + bad_beats + _beats(shape, book, after)
        bench.sources["i"].queue.extend(beats)
        await bench.run_until(lambda: False, 40_000)
        await bench.idle_cycles(50)
        assert bench.port.get("error"), "no error raised"
        got = [s & 0xFF for s in shape.symbols_of(bench.sink.got)]
        want = [int(s) for p in before for s in p] + [int(s) for s in bad[:kept]]
        assert got == want, f"seed {seed}: {len(got)} symbols out, want {len(want)}"

    run_amaranth(
        QLCDecoderPool(engines, depth=32),
        lambda port: body(Bench.make(port, DEC_IN, seed, 0.8, out_rate, shape)),
    )


@pytest.mark.parametrize("engines", [2, 4])
@pytest.mark.parametrize("kind", ["illegal", "padding"])
def test_error_in_one_packet_stops_the_packets_after_it(engines: int, kind: str) -> None:
    """Three good packets, then the bad one: see _error_case."""
    _error_case(engines, kind, 3 * engines + len(kind), good=3, out_rate=0.8)


@pytest.mark.parametrize("engines", [2, 4])
@pytest.mark.parametrize("kind", ["illegal", "padding"])
def test_error_behind_queued_packets_waits_for_them(engines: int, kind: str) -> None:
    """The bad packet is an engine's second while the output, slow, still holds that engine's
    first and the other engines' packets: the error waits until all of them are out."""
    _error_case(engines, kind, 40 + engines + len(kind), good=engines, out_rate=0.15, short=True)


def test_words_past_a_beats_count_are_ignored() -> None:
    """A beat holds its first ``words`` words: ones in the rest of a packet's last beat, and
    beats holding no word (AXI's null beats, ``tkeep`` all zero) inside a packet, change
    nothing."""
    seed = 21
    rng = np.random.default_rng(seed)
    shape = Shape.pool(4)
    book = SETS[2].book
    packets = [symbol_mix(rng, SETS[2].symbols, int(n)) for n in rng.integers(1, 90, 12)]
    words_at = shape.beat_bits + 1  # the count of words, above the data and ``last``
    garbage = (1 << shape.beat_bits) - 1

    def noisy(packet: np.ndarray) -> list[int]:
        beats = _beats(shape, book, [packet])
        held = beats[-1] >> words_at
        unkept = garbage >> WORD_BITS * held  # the low words: past the beat's count
        null = int.from_bytes(rng.bytes(shape.beat_bits // 8), "big")  # words = 0, last = 0
        return [*beats[:-1], null, beats[-1] | unkept]

    assert any(_beats(shape, book, [p])[-1] >> words_at == 1 for p in packets), "no partial beat"

    async def body(bench):
        await bench.feed({"tw": table_beats(book, (Mem.REGION, Mem.RANK, Mem.COUNT))})
        beats = [b for p in packets for b in noisy(p)]
        await bench.feed({"n": [len(p) for p in packets], "i": beats})
        want = [b for p in packets for b in shape.symbol_beats(p)]
        await bench.drain(len(want))
        assert shape.symbols_of(bench.sink.got) == shape.symbols_of(want), f"seed {seed}"

    _run(4, seed, 0.7, 0.7, body)


def test_loopback_into_a_pool_bad_parameters() -> None:
    with pytest.raises(ValueError, match="needs the encoder's lanes"):
        QLCLoopback(engines=4)


@pytest.mark.parametrize(("lanes", "engines"), [(4, 4), (8, 4), (8, 8)])
def test_loopback_into_a_pool_round_trip(lanes: int, engines: int) -> None:
    """The N-lane encoder into a pool (qlc_loopback_pool at small sizes): every symbol back in
    order under random valid/ready and table reloads, packets whose codes fill their last beat
    exactly (its word count then the whole beat) and packets that leave it part empty."""
    seed = 21 + lanes
    rng = np.random.default_rng(seed)
    beat_bits = WORD_BITS * words_per_beat(lanes)
    eight = length_set(8, 64)  # 8-bit codes: beat_bits / 8 symbols fill a beat
    shape = Shape(lanes, words_per_beat(lanes), counted=True)

    async def body(port):
        bench = Bench.make(port, DEC_IN, seed, 0.6, 0.6, shape, Shape.pool(engines))
        exact = beat_bits // 8
        await loopback_packets(
            bench,
            eight.book,
            [eight.symbols[:exact], eight.symbols[: 2 * exact], eight.symbols[:3]],
        )
        for ds in (SETS[1], SETS[4]):
            sizes = [1, 2, lanes, engines + 1, *rng.integers(1, 120, 5)]
            await loopback_packets(bench, ds.book, [symbol_mix(rng, ds.symbols, s) for s in sizes])

    run_amaranth(QLCLoopback(lanes=lanes, engines=engines), body)


@pytest.mark.parametrize(
    ("bits", "last", "words"),
    [
        (3 * 256, 1, 8),  # codes fill the last beat: all of it
        (3 * 256 + 1, 1, 1),
        (256 + 32, 1, 1),
        (256 + 33, 1, 2),
        (255, 1, 8),
        (100, 0, 8),  # not the last beat: all of it, whatever the running count
    ],
)
def test_pool_beat_holds_the_words_of_the_bit_count(bits: int, last: int, words: int) -> None:
    """The encoder's beat as the pool's: the final beat's word count from the packet's bits."""
    enc = Signal(beat_layout(8))
    pool = Signal(pool_beat_layout(8))
    m = Module()
    m.d.comb += pool.eq(pool_beat(enc, 8))
    found = []

    async def bench(ctx):
        ctx.set(enc.data, 0x1234 << 200)
        ctx.set(enc.bits, bits)
        ctx.set(enc.last, last)
        found.extend([ctx.get(pool.words), ctx.get(pool.last), ctx.get(pool.data)])

    sim = Simulator(m)
    sim.add_testbench(bench)
    sim.run()
    assert found == [words, last, 0x1234 << 200]
