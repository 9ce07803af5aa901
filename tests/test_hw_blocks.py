"""The QLC encoder, decoder and loopback in Amaranth's simulator against golden/ (fast path).

The same scenarios (sim/bench.py) run on the generated Verilog under cocotb in test_rtl_cocotb.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from amaranth import C, Module, Signal
from amaranth.sim import Simulator
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from zipccl.golden.codebook import MAX_CODE_LENGTH, MAX_WIDTH, PREFIX_BITS, Codebook
from zipccl.golden.streams import encode_codewords, pack_serial
from zipccl.hw.decoder import LENGTHS, QLCDecoder, one_hot_step
from zipccl.hw.encoder import QLCEncoder
from zipccl.hw.loopback import QLCLoopback
from zipccl.hw.tables import WORD_BITS
from zipccl.sim.amaranth_port import run_amaranth
from zipccl.sim.bench import Bench, decode_bad_padding, decode_illegal, decode_packets, serial_words
from zipccl.sim.cases import (
    CODE_LENGTHS,
    builder_sets,
    illegal_book,
    length_set,
    load_data,
    symbol_mix,
)
from zipccl.sim.suite import TOPS, reset_mid_packet, with_padding

from tests.strategies import codebooks

BLOCKS = {"qlc_encoder": QLCEncoder, "qlc_decoder": QLCDecoder, "qlc_loopback": QLCLoopback}
DATA = load_data()
SETS = builder_sets(DATA)


def _run(top: str, seed: int, rate: float, body):
    """Simulate ``top`` with a bench at ``rate`` valid/ready; body(bench, scenario) -> result."""
    t = TOPS[top]
    return run_amaranth(
        BLOCKS[top](), lambda port: body(Bench.make(port, t.inputs, seed, rate, rate), t.scenario)
    )


@pytest.mark.parametrize("top", sorted(BLOCKS))
@pytest.mark.parametrize("length", CODE_LENGTHS)
def test_one_symbol_per_clock_at_every_code_length(top: str, length: int) -> None:
    """No back-pressure: a 1024-symbol packet takes at most 1.01 cycles per symbol (fill included).
    In the loopback the decoder's source is the encoder, which completes a word only after its
    last code: the decoder then waits near word ends, so that figure gets 1.03."""
    ds = length_set(length, 1024)

    async def body(bench, scenario):
        return await scenario(bench, ds.book, [ds.symbols])

    st_ = _run(top, 0, 1.0, body)
    assert st_.symbols == 1024
    assert st_.cycles / st_.symbols <= (1.03 if top == "qlc_loopback" else 1.01), st_


@pytest.mark.parametrize("top", sorted(BLOCKS))
def test_builder_tables_with_backpressure_and_reload(top: str) -> None:
    """Every golden builder's table, loaded through the port before its packets, under random
    valid/ready on every stream: all 256 symbols, real data, 1..3-symbol packets."""
    seed = 11
    rng = np.random.default_rng(seed)

    async def body(bench, scenario):
        n = 0
        for ds in SETS:
            small = [rng.integers(0, 256, k).astype(np.uint8) for k in (1, 2, 3)]
            packets = [symbol_mix(rng, ds.symbols, 96), *small]
            n += (await scenario(bench, ds.book, packets)).symbols
        return n

    assert _run(top, seed, 0.5, body) == len(SETS) * (256 + 96 + 6), f"seed {seed}"


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(book=codebooks(), seed=st.integers(0, 2**16), rate=st.sampled_from([0.3, 0.7, 1.0]))
def test_random_codebooks_loopback(book: Codebook, seed: int, rate: float) -> None:
    """Random valid tables (empty, partial and literal regions) round-trip in hardware."""
    rng = np.random.default_rng(seed)
    packets = [rng.permutation(256).astype(np.uint8), rng.integers(0, 256, 40).astype(np.uint8)]

    async def body(bench, scenario):
        return await scenario(bench, book, packets)

    assert _run("qlc_loopback", seed, rate, body).symbols == 296


@pytest.mark.parametrize("top", ["qlc_encoder", "qlc_decoder"])
def test_blocks_match_golden_on_random_codebooks(top: str) -> None:
    seed = 5
    rng = np.random.default_rng(seed)
    books = [illegal_book(rng, f"random-{k}") for k in range(4)]

    async def body(bench, scenario):
        for book in books:
            await scenario(bench, book, [rng.permutation(256).astype(np.uint8)])

    _run(top, seed, 0.6, body)


@pytest.mark.parametrize("top", sorted(BLOCKS))
def test_reset_mid_packet_keeps_tables(top: str) -> None:
    """Reset cuts a packet; the next packet, with no table reload, still matches golden/."""

    async def body(bench, scenario):
        return await reset_mid_packet(bench, scenario, SETS[0].book, DATA["fp8_ffn1"][:400], 150)

    assert _run(top, 3, 0.7, body).symbols == 400


@pytest.mark.parametrize("seed", range(4))
def test_illegal_codeword_raises_error_and_stops(seed: int) -> None:
    """Symbols before the illegal codeword come out, then error rises and nothing more does;
    after reset the decoder works again."""
    rng = np.random.default_rng(seed)
    book = illegal_book(rng)
    symbols = symbol_mix(rng, DATA["fp8_ffn1"], 32)
    at = int(rng.integers(len(symbols)))

    async def body(bench, scenario):
        st_ = await decode_illegal(bench, book, symbols, at, rng)
        await bench.reset()
        bench.watch_error = False
        await decode_packets(bench, book, [symbols])
        return st_

    assert _run("qlc_decoder", seed, 0.7, body).symbols == at, f"seed {seed}"


def test_table_writes_wait_for_packet_end() -> None:
    """tw.ready is low inside a packet, so a reload never splits one packet over two tables."""
    book = SETS[0].book
    other = SETS[1].book

    async def body(bench, _scenario):
        port = bench.port
        port.set("i__valid", 1)
        port.set("i__payload", 7)  # not last: a packet is open
        port.set("o__ready", 1)
        await port.tick()
        port.set("i__valid", 0)
        await port.settle()
        inside = port.get("tw__ready")
        port.set("i__valid", 1)
        port.set("i__payload", 7 | 1 << 8)  # last
        await port.tick()
        port.set("i__valid", 0)
        await port.settle()
        return inside, port.get("tw__ready")

    assert _run("qlc_encoder", 0, 1.0, body) == (0, 1)
    # and both tables still code their own packets when reloaded back to back
    packets = [np.arange(256, dtype=np.uint8)]

    async def reload(bench, scenario):
        await scenario(bench, book, packets)
        await scenario(bench, other, packets)
        await scenario(bench, book, packets)

    _run("qlc_decoder", 1, 0.8, reload)


def test_decoder_rejects_stream_of_wrong_table() -> None:
    """The bench itself catches a wrong answer (the checks can fail)."""
    book, other = SETS[0].book, SETS[3].book

    async def body(bench, scenario):
        await scenario(bench, other, [np.arange(256, dtype=np.uint8)])  # loads `other`
        words = serial_words(pack_serial(encode_codewords(np.arange(256, dtype=np.uint8), book)))
        bench.sources["n"].queue.append(256)
        bench.sources["i"].queue.extend(words)
        first = len(bench.sink.got)
        bench.watch_error = True  # a misparse may also end in non-zero "padding"
        await bench.drain(first + 256)
        return [g & 0xFF for g in bench.sink.got[first:]], bench.port.get("error")

    got, error = _run("qlc_decoder", 0, 1.0, body)
    assert error or got != list(range(256))


@pytest.mark.parametrize("seed", range(4))
def test_decoder_rejects_non_zero_padding(seed: int) -> None:
    """A 1 anywhere in the last word's padding: every symbol of the packet, then error."""
    rng = np.random.default_rng(seed)
    book = SETS[seed].book
    symbols = with_padding(book, symbol_mix(rng, DATA["fp8_ffn1"], 30), WORD_BITS)

    async def body(bench, _scenario):
        return await decode_bad_padding(bench, book, symbols, rng)

    assert _run("qlc_decoder", seed, 0.7, body).symbols == len(symbols), f"seed {seed}"


@pytest.mark.parametrize("top", sorted(BLOCKS))
@pytest.mark.parametrize(("in_rate", "out_rate"), [(0.25, 1.0), (1.0, 0.25), (0.4, 0.4)])
def test_many_tiny_packets(top: str, in_rate: float, out_rate: float) -> None:
    """1..4-symbol packets back to back, a slow source or a slow sink: packet ends (padding
    skipped, the next packet's word prefetched or not) in every pipeline state."""
    seed = 21
    rng = np.random.default_rng(seed)
    book = SETS[4].book  # qlc_dynamic: 4-bit codes next to 11-bit escapes
    packets = [rng.choice(DATA["fp8_ffn2"], int(rng.integers(1, 5))) for _ in range(60)]
    t = TOPS[top]

    async def body(port):
        return await t.scenario(Bench.make(port, t.inputs, seed, in_rate, out_rate), book, packets)

    st_ = run_amaranth(BLOCKS[top](), body)
    assert st_.symbols == sum(len(p) for p in packets), f"seed {seed}"


def test_one_hot_step_moves_each_position_by_its_code_length() -> None:
    """The decoder's loop step: a set position k moves to k + 3 + the width at k, every one of
    several set positions at once (the multi-lane chain relies on it), nothing else is set."""
    rng = np.random.default_rng(4)
    n = 40
    widths = [int(w) for w in rng.integers(0, MAX_WIDTH + 1, n)]
    length_at = [  # bit k of plane n - 3: the code at k is n bits long
        C(sum(1 << k for k, w in enumerate(widths) if w == length - PREFIX_BITS), n)
        for length in LENGTHS
    ]
    at = Signal(n)
    m = Module()
    reached = Signal(n + MAX_CODE_LENGTH)
    m.d.comb += reached.eq(one_hot_step(at, length_at))
    cases = [[k] for k in range(n)] + [
        sorted(int(k) for k in rng.choice(n, 3, replace=False)) for _ in range(8)
    ]
    got = []

    async def testbench(ctx) -> None:
        for ks in cases:
            ctx.set(at, sum(1 << k for k in ks))
            got.append(ctx.get(reached))

    sim = Simulator(m)
    sim.add_testbench(testbench)
    sim.run()
    want = [sum({1 << k + PREFIX_BITS + widths[k] for k in ks}) for ks in cases]
    assert got == want
