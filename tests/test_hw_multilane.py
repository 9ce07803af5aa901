"""N-lane QLC blocks (hw/multilane.py) in Amaranth's simulator against golden/.

N = 1 (the multi-lane design at one lane), 2, 4, 8 for both blocks, and the encoder at 16 and 32
lanes; the cocotb suite (python -m zipccl.sim, test_rtl_cocotb.py) runs them on the generated
Verilog too.
"""

from __future__ import annotations

import numpy as np
import pytest
from zipccl.hw.loopback import QLCLoopback
from zipccl.hw.multilane import QLCDecoderN, QLCEncoderN, words_per_beat
from zipccl.hw.tables import WORD_BITS, Mem
from zipccl.sim.amaranth_port import run_amaranth
from zipccl.sim.bench import (
    Bench,
    Shape,
    bad_padding_stream,
    decode_bad_padding,
    decode_illegal,
    decode_packets,
    encode_packets,
    loopback_packets,
    table_beats,
)
from zipccl.sim.cases import builder_sets, illegal_book, length_set, load_data, symbol_mix
from zipccl.sim.suite import DEC_IN, ENC_IN, reset_mid_packet, with_padding

DATA = load_data()
SETS = builder_sets(DATA)
BLOCKS = {
    "encoder": (QLCEncoderN, encode_packets, ENC_IN),
    "decoder": (QLCDecoderN, decode_packets, DEC_IN),
}
CASES = [(kind, n) for n in (1, 2, 4, 8) for kind in BLOCKS] + [("encoder", 16), ("encoder", 32)]


def _run(kind: str, lanes: int, seed: int, in_rate: float, out_rate: float, body):
    make, scenario, inputs = BLOCKS[kind]
    shape = Shape(lanes, words_per_beat(lanes), counted=True)
    return run_amaranth(
        make(lanes),
        lambda port: body(Bench.make(port, inputs, seed, in_rate, out_rate, shape), scenario),
    )


def test_words_per_beat_hold_n_longest_codes() -> None:
    assert [words_per_beat(n) for n in (1, 2, 4, 8, 16, 32)] == [1, 1, 2, 4, 8, 16]
    with pytest.raises(ValueError, match="lanes"):
        words_per_beat(0)


@pytest.mark.parametrize(("kind", "lanes"), CASES)
@pytest.mark.parametrize("length", [3, 11])
def test_n_symbols_per_clock(kind: str, lanes: int, length: int) -> None:
    """No back-pressure: 128 beats of codes of one length take at most 5 % more clocks than
    beats (pipeline fill included), so N = 4 sustains well over 3.5 symbols per clock."""
    ds = length_set(length, 128 * lanes)

    async def body(bench, scenario):
        return await scenario(bench, ds.book, [ds.symbols])

    st_ = _run(kind, lanes, 0, 1.0, 1.0, body)
    assert st_.symbols / st_.cycles >= 0.95 * lanes * 128 / (128 + 6), st_


@pytest.mark.parametrize(("kind", "lanes"), CASES)
def test_backpressure_reload_and_tiny_packets(kind: str, lanes: int) -> None:
    """Builder tables reloaded between packets, random valid/ready, partial last beats."""
    seed = 7
    rng = np.random.default_rng(seed)

    tables = SETS[:5] if lanes < 8 else SETS[3:5]  # the 8-lane decoder simulates slowly

    async def body(bench, scenario):
        for ds in tables:
            tiny = [rng.choice(ds.symbols, int(rng.integers(1, lanes + 3))) for _ in range(6)]
            await scenario(bench, ds.book, [symbol_mix(rng, ds.symbols, 64), *tiny])

    _run(kind, lanes, seed, 0.4, 0.6, body)


@pytest.mark.parametrize(("kind", "lanes"), CASES)
def test_reset_mid_packet(kind: str, lanes: int) -> None:
    async def body(bench, scenario):
        return await reset_mid_packet(bench, scenario, SETS[0].book, DATA["fp8_ffn1"][:400], 8)

    assert _run(kind, lanes, 3, 0.5, 0.8, body).symbols == 400


@pytest.mark.parametrize("lanes", [1, 2, 4, 8])
@pytest.mark.parametrize("seed", range(3))
def test_illegal_codeword_partial_beat_then_error(lanes: int, seed: int) -> None:
    """Lanes before the illegal code come out (a partial beat), then error, nothing more."""
    rng = np.random.default_rng(seed)
    book = illegal_book(rng)
    symbols = symbol_mix(rng, DATA["fp8_ffn1"], 24)
    at = int(rng.integers(len(symbols)))

    async def body(bench, _scenario):
        return await decode_illegal(bench, book, symbols, at, rng)

    assert _run("decoder", lanes, seed, 0.7, 0.7, body).symbols == at, f"seed {seed}"


@pytest.mark.parametrize("lanes", [1, 2, 4, 8])
@pytest.mark.parametrize("seed", range(2))
def test_non_zero_padding_is_an_error_after_the_packet(lanes: int, seed: int) -> None:
    """A 1 anywhere in the last beat's padding: every symbol of the packet, then error."""
    rng = np.random.default_rng(seed)
    book = SETS[4].book
    beat_bits = WORD_BITS * words_per_beat(lanes)
    symbols = with_padding(book, symbol_mix(rng, DATA["fp8_ffn1"], 21), beat_bits)

    async def body(bench, _scenario):
        return await decode_bad_padding(bench, book, symbols, rng)

    assert _run("decoder", lanes, seed, 0.7, 0.7, body).symbols == len(symbols), f"seed {seed}"


@pytest.mark.parametrize("lanes", [1, 4])
def test_no_packet_taken_before_the_padding_check(lanes: int) -> None:
    """A packet with bad padding and the next packet queued right behind it: the next count
    must wait for the padding check, so none of its symbols come out before ``error``."""
    rng = np.random.default_rng(lanes)
    book = SETS[4].book
    shape = Shape(lanes, words_per_beat(lanes), counted=True)
    bad = with_padding(book, symbol_mix(rng, DATA["fp8_ffn1"], 30), shape.pad_bits)
    good = symbol_mix(rng, DATA["fp8_ffn1"], 40)

    async def body(port):
        bench = Bench.make(port, DEC_IN, lanes, 1.0, 1.0, shape)
        await bench.feed({"tw": table_beats(book, (Mem.REGION, Mem.RANK, Mem.COUNT))})
        bench.watch_error = True
        bench.sources["n"].queue.extend([len(bad), len(good)])
        bench.sources["i"].queue.extend(bad_padding_stream(book, bad, rng, shape))
        bench.sources["i"].queue.extend(shape.packet_beats(book, [good])[0])
        await bench.run_until(lambda: False, 2000)
        await bench.idle_cycles(20)
        assert bench.port.get("error"), "no error raised"
        assert [s & 0xFF for s in shape.symbols_of(bench.sink.got)] == [int(s) for s in bad]

    run_amaranth(QLCDecoderN(lanes), body)


@pytest.mark.parametrize("lanes", [2, 4])
def test_loopback_round_trip(lanes: int) -> None:
    """N-lane encoder -> N-lane decoder in hardware, table reloads, random valid/ready."""
    seed = 9
    rng = np.random.default_rng(seed)
    shape = Shape(lanes, words_per_beat(lanes), counted=True)

    async def body(port):
        bench = Bench.make(port, DEC_IN, seed, 0.6, 0.6, shape)
        for ds in (SETS[1], SETS[4], SETS[5]):
            tiny = [rng.choice(ds.symbols, int(rng.integers(1, lanes + 3))) for _ in range(4)]
            await loopback_packets(bench, ds.book, [symbol_mix(rng, ds.symbols, 48), *tiny])

    run_amaranth(QLCLoopback(lanes=lanes), body)
