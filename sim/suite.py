"""The verification suite of one hardware block, run by cocotb (Verilog) or Amaranth's simulator.

Per block (``qlc_encoder``, ``qlc_decoder``, ``qlc_loopback``, their N-lane forms and the decoder
pools: the names of hw.generate's Verilog modules), in order:

1. **throughput** -- one packet per code length 3..11 (a decoder pool: 4 E packets, so that its
   E engines are busy), no back-pressure: cycles per symbol;
2. **data set** -- the built-in MiniLM tensors under every golden builder's table, in 4096-symbol
   packets, no back-pressure: stream bits (compression ratio) and cycles per symbol;
3. **back-pressure + reload** -- random valid/ready on every stream, a new table loaded through
   the port before each table's packets: builder tables and random codebooks, all 256 symbols,
   real data, 1..3-symbol packets;
4. **tiny packets** -- 1..4-symbol packets back to back from a slow source;
5. **reset mid-packet** -- a packet cut by reset, then the next one decoded/encoded with the
   table that survived the reset;
6. **illegal streams** (decoder) -- error raised, only the symbols before the bad codeword out,
   and the decoder recovers after reset; a 1 in a packet's padding: the packet's symbols out,
   then error, and again recovery.

Every output beat is compared with golden/ (sim/bench.py); any mismatch raises.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import numpy as np
from zipccl.golden.codebook import Codebook
from zipccl.golden.streams import encode_codewords
from zipccl.hw.loopback import LOOPBACK_POOL
from zipccl.hw.multilane import ENCODER_ONLY_LANES, MULTI_LANES, words_per_beat
from zipccl.hw.pool import POOL_ENGINES
from zipccl.sim.bench import (
    SINGLE,
    Aborted,
    Bench,
    Port,
    Shape,
    Stats,
    decode_bad_padding,
    decode_illegal,
    decode_packets,
    encode_packets,
    loopback_packets,
)
from zipccl.sim.cases import (
    CODE_LENGTHS,
    builder_sets,
    illegal_book,
    length_set,
    load_data,
    random_book,
    symbol_mix,
)

Scenario = Callable[..., Awaitable[Stats]]


@dataclass(frozen=True)
class Top:
    """A block under test (keyed by its Verilog top's name in hw.generate.TOPS): how to drive it."""

    scenario: Scenario
    inputs: tuple[str, ...]
    shape: Shape
    cap: str = "full"  # the highest level of a whole run (--level): lower when slow under Icarus
    packets: int = 1  # packets per code length in the throughput stage (a pool needs many)
    out: Shape | None = None  # the output's beats where they differ from the input's

    @property
    def decodes_streams(self) -> bool:
        return self.scenario is decode_packets


ENC_IN, DEC_IN = ("tw", "i"), ("tw", "n", "i")


def _tops() -> dict[str, Top]:
    tops = {
        "qlc_encoder": Top(encode_packets, ENC_IN, SINGLE),
        "qlc_decoder": Top(decode_packets, DEC_IN, SINGLE),
        "qlc_loopback": Top(loopback_packets, DEC_IN, SINGLE),
    }
    for n in (*MULTI_LANES, *ENCODER_ONLY_LANES):
        shape = Shape(n, words_per_beat(n), counted=True)
        tops[f"qlc_encoder_x{n}"] = Top(encode_packets, ENC_IN, shape)
        if n not in ENCODER_ONLY_LANES:  # the per-offset logic of N lanes is slow under Icarus
            slow = "smoke" if n >= 8 else "quick"
            tops[f"qlc_decoder_x{n}"] = Top(decode_packets, DEC_IN, shape, slow)
            # covered by its two blocks
            tops[f"qlc_loopback_x{n}"] = Top(loopback_packets, DEC_IN, shape, "smoke")
    lanes, engines = LOOPBACK_POOL  # the encoder into a pool: 16 symbols a beat in, 13 out
    tops["qlc_loopback_pool"] = Top(
        loopback_packets,
        DEC_IN,
        Shape(lanes, words_per_beat(lanes), counted=True),
        "smoke",
        packets=4 * engines,
        out=Shape.pool(engines),
    )
    for n in POOL_ENGINES:  # E whole packets at once: the throughput stage gives it 4 E of them
        slow = "smoke" if n >= 8 else "quick"
        tops[f"qlc_decoder_pool_x{n}"] = Top(
            decode_packets, DEC_IN, Shape.pool(n), slow, packets=4 * n
        )
    return tops


TOPS = _tops()
PACKET = 4096
BACKPRESSURE_RATE = 0.6


@dataclass(frozen=True)
class Level:
    length_symbols: int  # per code length, throughput packet
    dataset_symbols: int  # per data set (at most the whole set)
    mix_symbols: int  # real symbols per table in the back-pressure stage
    random_books: int
    illegal_books: int
    tiny_packets: int  # 1..4 symbols each, from a slow source


LEVELS = {
    "smoke": Level(256, 1024, 64, 1, 1, 10),
    "quick": Level(1024, 4096, 128, 3, 2, 40),
    "full": Level(4096, 1 << 20, 512, 12, 6, 200),
}


def capped(level: str, top: str) -> str:
    """``level``, lowered to ``top``'s cap: what a whole run (every block) gives that block."""
    order = list(LEVELS)
    return order[min(order.index(level), order.index(TOPS[top].cap))]


def packets_of(symbols: np.ndarray, size: int = PACKET) -> list[np.ndarray]:
    return [symbols[i : i + size] for i in range(0, len(symbols), size)]


async def reset_mid_packet(
    bench: Bench, run: Scenario, book: Codebook, packet: np.ndarray, after: int
) -> Stats:
    """Cut a packet by reset ``after`` cycles into it; the next packet must still be right."""
    await run(bench, book, [packet[:64]])
    bench.abort_at = bench.cycles + after
    try:
        await run(bench, book, [packet], load=False)
    except Aborted:
        pass
    else:
        raise AssertionError(f"packet of {len(packet)} finished within {after} cycles")
    bench.abort_at = None
    await bench.reset()
    return await run(bench, book, [packet], load=False)


async def run_suite(top: str, port: Port, level: str = "quick", seed: int = 1) -> dict:
    """Run every stage on ``top`` through ``port``; returns the figures (raises on mismatch)."""
    top_ = TOPS[top]
    run, inputs, shape = top_.scenario, top_.inputs, top_.shape
    lv = LEVELS[level]
    rng = np.random.default_rng(seed)
    data = load_data()
    sets = builder_sets(data)
    total = Stats()
    report: dict = {
        "top": top,
        "lanes": shape.lanes,
        "level": level,
        "seed": seed,
        "lengths": {},
        "datasets": {},
    }

    bench = Bench.make(port, inputs, seed, 1.0, 1.0, shape, top_.out)
    for length in CODE_LENGTHS:
        ds = length_set(length, lv.length_symbols * top_.packets, seed)
        st = await run(bench, ds.book, packets_of(ds.symbols, lv.length_symbols))
        report["lengths"][length] = st.cycles / st.symbols
        total.add(st)
    for ds in sets:
        st = await run(bench, ds.book, packets_of(ds.symbols[: lv.dataset_symbols]))
        report["datasets"][ds.name] = {
            "table": ds.book.describe(),
            "symbols": st.symbols,
            "bits": st.bits,
            "cycles": st.cycles,
        }
        total.add(st)

    bench = Bench.make(
        port, inputs, seed + 1, BACKPRESSURE_RATE, BACKPRESSURE_RATE, shape, top_.out
    )
    books = [ds.book for ds in sets] + [random_book(rng) for _ in range(lv.random_books)]
    real = data["fp8_ffn1"]
    for book in books:
        small = [rng.integers(0, 256, k).astype(np.uint8) for k in (1, 2, 3)]
        total.add(await run(bench, book, [symbol_mix(rng, real, lv.mix_symbols), *small]))

    bench = Bench.make(port, inputs, seed + 2, 0.3, 0.9, shape, top_.out)  # slow source
    tiny = [rng.choice(data["fp8_ffn2"], int(rng.integers(1, 5))) for _ in range(lv.tiny_packets)]
    total.add(await run(bench, sets[4].book, tiny))

    cut = max(6, 200 // shape.lanes)  # cycles into the packet
    total.add(await reset_mid_packet(bench, run, sets[0].book, real[:600], after=cut))
    if top_.decodes_streams:
        total.add(await illegal_streams(bench, lv.illegal_books, real, rng))
    report["symbols"] = total.symbols
    report["notes"] = total.notes
    return report


async def illegal_streams(
    bench: Bench, count: int, real: np.ndarray, rng: np.random.Generator
) -> Stats:
    total = Stats()
    for k in range(count):
        book = illegal_book(rng, name=f"illegal-{k}")
        symbols = symbol_mix(rng, real, 64)
        total.add(await decode_illegal(bench, book, symbols, int(rng.integers(len(symbols))), rng))
        await bench.reset()
        bench.watch_error = False
        total.add(await decode_packets(bench, book, [symbols]))
        symbols = with_padding(book, symbol_mix(rng, real, 40), bench.shape.pad_bits)
        total.add(await decode_bad_padding(bench, book, symbols, rng))
        await bench.reset()
        bench.watch_error = False
        total.add(await decode_packets(bench, book, [symbols]))
    return total


def with_padding(book: Codebook, symbols: np.ndarray, pad_bits: int) -> np.ndarray:
    """``symbols``, shortened until their codes leave padding before a ``pad_bits`` boundary."""
    while encode_codewords(symbols, book).total_bits % pad_bits == 0:
        symbols = symbols[:-1]
    return symbols


def summary_lines(reports: Sequence[dict]) -> list[str]:
    """Human-readable figures of several blocks' reports."""
    lines = []
    for r in reports:
        if r["lanes"] > 1:
            rates = {k: 1 / v for k, v in r["lengths"].items()}
            per_len = " ".join(f"{k}:{v:.3f}" for k, v in rates.items())
            worst = min(rates.values())
            lines.append(
                f"{r['top']} [{r['level']}]: {r['symbols']} symbols checked; "
                f"symbols/clock by code length {per_len} (worst {worst:.3f})"
            )
            if r["top"].startswith("qlc_loopback"):
                lines.append("  (loopback figures include the encoder's word buffering latency)")
            continue
        worst = max(r["lengths"].values())
        per_len = " ".join(f"{k}:{v:.4f}" for k, v in r["lengths"].items())
        lines.append(
            f"{r['top']} [{r['level']}]: {r['symbols']} symbols checked; cycles/symbol "
            f"by code length {per_len} (worst {worst:.4f})"
        )
        if r["top"].startswith("qlc_loopback"):
            lines.append("  (loopback cycles include the encoder's word buffering latency)")
        for name, d in r["datasets"].items():
            ratio = d["bits"] / (8 * d["symbols"])
            lines.append(
                f"  {name:34s} {d['symbols']:6d} symbols  ratio {ratio:.4f}  "
                f"{d['cycles'] / d['symbols']:.4f} cycles/symbol  [{d['table']}]"
            )
        lines += [f"  {n}" for n in r["notes"]]
    return lines
