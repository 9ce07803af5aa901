"""Table builders: valid complete tables, exhaustive search optimal, the QLC heuristic's reading."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from zipccl.golden import builders as B
from zipccl.golden.baselines import entropy_bits, huffman_bits
from zipccl.golden.codebook import ALPHABET, MAX_CODE_LENGTH, Codebook
from zipccl.golden.container import decode, encode
from zipccl.golden.formats import BF16, E4M3
from zipccl.golden.streams import (
    decode_serial,
    decode_split,
    encode_codewords,
    encode_serial,
    encode_split,
    parse_serial,
    parse_split,
)

from tests.strategies import codebooks

ALL_BYTES = np.arange(ALPHABET, dtype=np.uint8)


def _dynamic_searched(hist: np.ndarray) -> Codebook:
    return B.qlc_dynamic(hist, middle=None)


BUILDERS = [
    B.best_table,
    B.qlc_heuristic,
    B.qlc_dynamic,
    _dynamic_searched,
    B.zipccl_histogram_table,
]


@st.composite
def histograms(draw: st.DrawFn) -> np.ndarray:
    """Skewed (geometric around a centre), sparse, uniform-ish or one-symbol histograms."""
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    kind = draw(st.sampled_from(["geometric", "sparse", "uniform", "single", "zipf"]))
    if kind == "geometric":
        centre, p = rng.integers(0, ALPHABET), draw(st.floats(0.02, 0.9))
        sym = (centre + rng.geometric(p, 5000) * rng.choice([-1, 1], 5000)) % ALPHABET
        h = np.bincount(sym, minlength=ALPHABET)
    elif kind == "sparse":
        h = np.zeros(ALPHABET, np.int64)
        k = draw(st.integers(1, 40))
        h[rng.choice(ALPHABET, k, replace=False)] = rng.integers(1, 10**6, k)
    elif kind == "uniform":
        h = rng.integers(draw(st.integers(0, 100)), 1000, ALPHABET)
    elif kind == "single":
        h = np.zeros(ALPHABET, np.int64)
        h[rng.integers(0, ALPHABET)] = draw(st.integers(1, 10**9))
    else:
        h = (1e6 / np.arange(1, ALPHABET + 1) ** draw(st.floats(0.3, 2.5))).astype(np.int64)
        h = h[rng.permutation(ALPHABET)]
    if h.sum() == 0:
        h[0] = 1
    return h.astype(np.int64)


def _round_trips(book: Codebook, symbols: np.ndarray) -> None:
    serial = encode_serial(symbols, book)
    assert np.array_equal(decode_serial(serial, len(symbols), book), symbols)
    for block in (64, 4096):
        split = encode_split(symbols, book, block)
        assert np.array_equal(decode_split(split, len(symbols), book, block), symbols)
        same = parse_split(split, len(symbols), book, block)
        assert same.same_as(parse_serial(serial, len(symbols), book))
        assert same.same_as(encode_codewords(symbols, book))


@settings(max_examples=150, deadline=None)
@given(histograms())
def test_every_builder_gives_a_complete_table_that_beats_raw(hist):
    best = B.best_table(hist)
    for build in BUILDERS:
        book = build(hist)
        assert isinstance(book, Codebook) and book.name
        assert book.literal is not None or book.num_ranked == ALPHABET  # complete
        bits = book.expected_bits(hist)
        assert bits <= MAX_CODE_LENGTH + 1e-12  # never worse than 3 + 8 raw
        assert best.expected_bits(hist) <= bits + 1e-12
    # no prefix code beats Huffman, and no code beats the entropy
    assert best.expected_bits(hist) >= huffman_bits(hist) - 1e-9 >= entropy_bits(hist) - 1e-9


@settings(max_examples=200, deadline=None)
@given(histograms(), codebooks())
def test_best_table_beats_any_table(hist, other):
    """Optimal over the whole format: any valid table, in any rank order, is no shorter."""
    assert B.best_table(hist).expected_bits(hist) <= other.expected_bits(hist) + 1e-12


@settings(max_examples=60, deadline=None)
@given(histograms())
def test_restricted_search_is_optimal_among_its_widths(hist):
    free = B.best_table(hist).expected_bits(hist)
    qlc = B.best_table(hist, widths=(3, 4, 5, 8))
    assert set(qlc.widths) <= {3, 4, 5, 8}
    assert free <= qlc.expected_bits(hist) + 1e-12
    lit = B.best_table(hist, literal=True)
    ranked = B.best_table(hist, literal=False)
    assert lit.literal == 7 and ranked.literal is None and ranked.num_ranked == ALPHABET
    assert free == pytest.approx(min(lit.expected_bits(hist), ranked.expected_bits(hist)))


def test_best_table_matches_brute_force_over_ordered_vectors():
    """Every ordered width vector over {1, 8}, with and without an escape, built as a Codebook."""
    rng = np.random.default_rng(7)
    hist = np.bincount(rng.geometric(0.08, 20000) % ALPHABET, minlength=ALPHABET)
    order = B.ranks_by_frequency(hist)
    lengths = []
    for widths in itertools.product((1, 8), repeat=8):
        for literal in [None, *[p for p in range(8) if widths[p] == 8]]:
            cap = sum(1 << w for p, w in enumerate(widths) if p != literal)
            if literal is None and cap < ALPHABET:
                continue
            book = Codebook(widths, literal, tuple(order[: min(cap, ALPHABET)]))
            lengths.append(book.expected_bits(hist))
    got = B.best_table(hist, widths=(1, 8)).expected_bits(hist)
    assert got == pytest.approx(min(lengths))


@pytest.mark.parametrize("build", BUILDERS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_all_bytes_round_trip_under_each_builder(build, seed):
    rng = np.random.default_rng(seed)
    hist = np.bincount(rng.geometric(0.05 * (seed + 1), 30000) % ALPHABET, minlength=ALPHABET)
    book = build(hist)
    _round_trips(book, ALL_BYTES)
    _round_trips(book, rng.permutation(np.repeat(ALL_BYTES, 3)))
    assert np.array_equal(decode(encode(ALL_BYTES, E4M3, book))[1], ALL_BYTES)


@pytest.mark.parametrize("build", BUILDERS, ids=lambda f: f.__name__)
def test_all_bf16_patterns_round_trip_under_each_builder(build):
    patterns = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    hist = np.bincount(BF16.symbols(patterns[::7]) ^ 0x80, minlength=ALPHABET)
    hist[120:130] += 1000  # skew it like real exponents
    fmt, back = decode(encode(patterns, BF16, build(hist)))
    assert fmt == BF16 and np.array_equal(back, patterns)


def test_uniform_histogram_under_the_heuristic():
    """2 % of 256 equal symbols is 5.12 symbols: every zone needs 6, rounds to w=3 (8 symbols)."""
    hist = np.full(ALPHABET, 10)
    book = B.qlc_heuristic(hist)
    assert book.widths == (3, 3, 3, 3, 3, 3, 3, 8) and book.literal == 7
    assert book.num_ranked == 56
    assert book.expected_bits(hist) == pytest.approx((56 * 6 + 200 * 11) / 256)


def test_heuristic_widens_zones_for_a_flat_tail():
    """Three big symbols, then a flat tail: the tail zones need more than 8 symbols for 2 %."""
    hist = np.zeros(ALPHABET, np.int64)
    hist[:3] = 200_000
    hist[3:] = 1000  # 253 * 1000 of 853,000 total: 2 % needs 18 tail symbols
    book = B.qlc_heuristic(hist)
    assert book.widths[:3] == (3, 5, 5)
    for p, w in enumerate(book.widths[:-1]):
        if w:
            lo, hi = book.bases[p], min(book.bases[p] + (1 << w), book.num_ranked)
            zone = np.asarray(book.ranks[lo:hi])
            assert hist[zone].sum() >= 0.02 * hist.sum()


@settings(max_examples=100, deadline=None)
@given(histograms(), st.floats(0.005, 0.5))
def test_heuristic_zones_follow_the_rule(hist, threshold):
    book = B.qlc_heuristic(hist, threshold=threshold)
    assert book.literal == 7 and book.widths[7] == 8
    used = [w for w in book.widths[:7] if w]
    assert set(used) <= {3, 4, 5}
    assert book.widths[: len(used)] == tuple(used)  # the unused regions come last, empty
    assert book.num_ranked == min(sum(1 << w for w in used), ALPHABET)
    # every used zone but the last reached the threshold on its own
    cap = np.cumsum([0] + [1 << w for w in used])
    order = B.ranks_by_frequency(hist)
    for i in range(len(used) - 1):
        assert hist[order[cap[i] : cap[i + 1]]].sum() >= threshold * hist.sum()


def test_optimize_zones_is_the_papers_function():
    hist = np.zeros(ALPHABET, np.int64)
    hist[[9, 4, 200]] = [500, 300, 150]  # 95 % in three symbols
    hist[10:60] = 1  # 50 more, 1 each (total 1000; 2 % = 20)
    ends = B.optimize_zones(hist)
    # zones: {9}, {4}, {200}, then 20 singles per zone, then the rest
    assert ends == [1, 2, 3, 23, 43, 256]
    assert B.optimize_zones(np.ones(ALPHABET, np.int64), max_zones=3) == [6, 12, 256]


def test_dynamic_gives_the_two_most_frequent_four_bit_codes():
    hist = np.ones(ALPHABET, np.int64)
    hist[[0, 128]] = 10_000  # +0 and -0 in e4m3
    book = B.qlc_dynamic(hist)
    lengths = book.code_lengths()
    assert book.widths == (1, 5, 5, 5, 5, 5, 5, 8) and book.literal == 7
    assert lengths[0] == lengths[128] == 4
    assert sorted(set(lengths.tolist())) == [4, 8, 11]
    assert (lengths == 8).sum() == 192


@settings(max_examples=60, deadline=None)
@given(histograms())
def test_searched_dynamic_is_optimal_given_its_head(hist):
    fixed, searched = B.qlc_dynamic(hist), B.qlc_dynamic(hist, middle=None)
    assert searched.widths[0] == 1 and searched.literal == 7
    assert set(searched.widths[1:7]) <= {3, 4, 5}
    assert searched.expected_bits(hist) <= fixed.expected_bits(hist) + 1e-12
    order = B.ranks_by_frequency(hist)
    assert searched.ranks[:2] == tuple(order[:2])


def test_zipccl_histogram_table_takes_the_top_seven():
    hist = np.zeros(ALPHABET, np.int64)
    hist[[120, 121, 122, 123, 124, 125, 126, 127]] = [5, 60, 70, 80, 90, 100, 110, 4]
    book = B.zipccl_histogram_table(hist)
    assert book.literal == 0 and book.widths == (8, 0, 0, 0, 0, 0, 0, 0)
    assert book.ranks == (126, 125, 124, 123, 122, 121, 120)


def test_ties_are_broken_by_symbol():
    hist = np.zeros(ALPHABET, np.int64)
    hist[[200, 3, 77]] = 5
    assert B.ranks_by_frequency(hist)[:3] == [3, 77, 200]
    assert B.best_table(hist) == B.best_table(hist.copy())


@pytest.mark.parametrize(
    ("hist", "error", "match"),
    [
        (np.ones(255), ValueError, "256 bins"),
        (np.zeros(ALPHABET), ValueError, "empty"),
        (np.full(ALPHABET, -1), ValueError, "non-negative"),
        (np.full(ALPHABET, 0.5), ValueError, "integers"),
        (np.full(ALPHABET, np.nan), ValueError, "integers"),
        (np.array(["x"] * ALPHABET), TypeError, "numbers"),
    ],
)
def test_bad_histograms_are_rejected(hist, error, match):
    for build in BUILDERS:
        with pytest.raises(error, match=match):
            build(hist)


def test_bad_parameters_are_rejected():
    hist = np.ones(ALPHABET, np.int64)
    with pytest.raises(ValueError, match=r"subset of 0\.\.8"):
        B.best_table(hist, widths=(3, 9))
    with pytest.raises(ValueError, match="without an escape"):
        B.best_table(hist, widths=(3, 4), literal=False)
    with pytest.raises(ValueError, match="head"):
        B.best_table(hist, head=(1,) * 7)
    with pytest.raises(ValueError, match="head"):
        B.best_table(hist, head=(9,))
    with pytest.raises(ValueError, match="threshold"):
        B.qlc_heuristic(hist, threshold=0.0)
    with pytest.raises(ValueError, match="threshold"):
        B.optimize_zones(hist, threshold=2.0)
