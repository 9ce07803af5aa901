"""The tables and data the hardware is checked with.

* the built-in data set: real MiniLM tensors (sim/data/minilm.npz, made by sim/make_data.py);
* tables from every golden builder (histogram search, QLC heuristic, dynamic variant, ZipCCL
  from a histogram and from theory) over that data;
* one table per code length 3..11 whose test symbols all take that length (throughput);
* random valid codebooks, and tables with illegal codewords (empty regions, ranks past the table).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from zipccl.golden import builders, presets
from zipccl.golden.codebook import ALPHABET, MAX_WIDTH, NUM_REGIONS, Codebook
from zipccl.golden.data import histogram
from zipccl.golden.formats import BF16
from zipccl.golden.theory import tensor_stats, zipccl_table

DATA_PATH = Path(__file__).parent / "data" / "minilm.npz"
CODE_LENGTHS = range(3, 12)


@dataclass(frozen=True)
class DataSet:
    """A named symbol stream and the table built for it."""

    name: str
    symbols: np.ndarray
    book: Codebook


def load_data() -> dict[str, np.ndarray]:
    """The built-in tensors: FP8 bytes and BF16 bit patterns, plus the BF16 exponent symbols."""
    with np.load(DATA_PATH) as z:
        out = {k: z[k] for k in z.files}
    out["bf16_grad_exp"] = BF16.symbols(out["bf16_grad"])
    return out


def _bf16_values(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def builder_sets(data: dict[str, np.ndarray]) -> list[DataSet]:
    """Each golden builder's table over the data it is meant for."""
    ffn1, ffn2, exp = data["fp8_ffn1"], data["fp8_ffn2"], data["bf16_grad_exp"]
    h1, h2, he = histogram(ffn1), histogram(ffn2), histogram(exp)
    stats = tensor_stats(_bf16_values(data["bf16_grad"]))
    return [
        DataSet("fp8-ffn1/best", ffn1, builders.best_table(h1, name="best-ffn1")),
        DataSet("fp8-ffn1/qlc-heuristic", ffn1, builders.qlc_heuristic(h1)),
        DataSet("fp8-ffn1/preset-qlc-e4m3", ffn1, presets.qlc_e4m3()),
        DataSet("fp8-ffn2/best", ffn2, builders.best_table(h2, name="best-ffn2")),
        DataSet("fp8-ffn2/qlc-dynamic", ffn2, builders.qlc_dynamic(h2)),
        DataSet("bf16-grad-exp/zipccl-histogram", exp, builders.zipccl_histogram_table(he)),
        DataSet("bf16-grad-exp/zipccl-theory", exp, zipccl_table(BF16, stats)),
        DataSet("bf16-grad-exp/preset-zipccl", exp, presets.zipccl_exponent()),
    ]


def length_set(length: int, count: int, seed: int = 0) -> DataSet:
    """``count`` symbols that all take ``length``-bit codes (11: the literal escape)."""
    rng = np.random.default_rng(seed + length)
    order = rng.permutation(ALPHABET)
    if length == 3 + MAX_WIDTH:
        book = Codebook((0,) * (NUM_REGIONS - 1) + (MAX_WIDTH,), NUM_REGIONS - 1, order[:7])
        pool = order[7:]
    else:
        w = length - 3
        book = Codebook((w, MAX_WIDTH) + (0,) * (NUM_REGIONS - 2), None, order)
        pool = order[: 1 << w]
    named = Codebook(book.widths, book.literal, book.ranks, name=f"length-{length}")
    return DataSet(f"length-{length}", rng.choice(pool, count).astype(np.uint8), named)


def random_book(rng: np.random.Generator, name: str = "random") -> Codebook:
    """A random valid table: random widths, an escape region half of the time, random ranks."""
    while True:
        widths = [int(w) for w in rng.integers(0, MAX_WIDTH + 1, NUM_REGIONS)]
        literal = int(rng.integers(NUM_REGIONS)) if rng.random() < 0.5 else None
        if literal is not None:
            widths[literal] = MAX_WIDTH
        capacity = sum(1 << w for p, w in enumerate(widths) if p != literal)
        if literal is None and capacity < ALPHABET:
            continue
        n = ALPHABET if literal is None else int(rng.integers(0, min(capacity, ALPHABET) + 1))
        ranks = rng.permutation(ALPHABET)[:n]
        return Codebook(widths, literal, ranks, name=name)


def illegal_book(rng: np.random.Generator, name: str = "with-illegal") -> Codebook:
    """A random valid table that still has illegal codewords (ranks past the table)."""
    while True:
        book = random_book(rng, name)
        if book.capacity > book.num_ranked:
            return book


def symbol_mix(rng: np.random.Generator, data: np.ndarray, count: int) -> np.ndarray:
    """All 256 symbols once (shuffled), then a random slice of real data."""
    start = int(rng.integers(0, max(1, len(data) - count)))
    return np.concatenate([rng.permutation(ALPHABET), data[start : start + count]]).astype(np.uint8)
