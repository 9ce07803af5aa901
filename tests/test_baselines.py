"""Baselines: entropy, Huffman, Exp-Golomb against hand values and independent constructions."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from zipccl.golden import baselines as bl
from zipccl.golden.builders import best_table
from zipccl.golden.codebook import ALPHABET

from tests.test_builders import histograms


def _hist(counts: dict[int, int]) -> np.ndarray:
    h = np.zeros(ALPHABET, np.int64)
    for s, c in counts.items():
        h[s] = c
    return h


def test_entropy_hand_values():
    assert bl.entropy_bits(np.ones(ALPHABET, np.int64)) == pytest.approx(8.0)
    assert bl.entropy_bits(_hist({3: 7, 9: 7})) == pytest.approx(1.0)
    assert bl.entropy_bits(_hist({42: 5})) == 0.0
    assert bl.entropy_bits(_hist({0: 2, 1: 1, 2: 1})) == pytest.approx(1.5)


def test_raw_is_the_symbol_width_and_bounds_huffman():
    h = _hist({0: 1, 1: 1, 2: 1})
    assert bl.raw_bits(h) == 8.0 >= bl.huffman_bits(h)
    assert bl.huffman_bits(np.ones(ALPHABET, np.int64)) == bl.raw_bits(np.ones(ALPHABET, np.int64))


def test_huffman_textbook_example():
    """CLRS: f:5 e:9 c:12 b:13 d:16 a:45 -> lengths 4 4 3 3 3 1 (224 bits per 100 symbols)."""
    h = _hist({0: 45, 1: 13, 2: 12, 3: 16, 4: 9, 5: 5})
    lengths = bl.huffman_lengths(h)
    assert lengths[:6].tolist() == [1, 3, 3, 3, 4, 4]
    assert not lengths[6:].any()
    assert bl.huffman_bits(h) == pytest.approx(2.24)


def test_huffman_single_symbol_costs_one_bit():
    assert bl.huffman_lengths(_hist({7: 10})).tolist() == [0] * 7 + [1] + [0] * 248
    assert bl.huffman_bits(_hist({7: 10})) == 1.0


@settings(max_examples=150, deadline=None)
@given(histograms())
def test_huffman_is_a_complete_prefix_code_within_one_bit_of_entropy(hist):
    lengths = bl.huffman_lengths(hist)
    present = hist > 0
    assert (lengths[present] > 0).all() and not lengths[~present].any()
    if present.sum() > 1:
        assert np.sum(2.0 ** -lengths[present]) == pytest.approx(1.0)  # Kraft equality
    h, huff = bl.entropy_bits(hist), bl.huffman_bits(hist)
    assert h - 1e-9 <= huff < h + 1 + 1e-9
    # the region code is a prefix code too: Huffman can never lose to it
    assert huff <= best_table(hist).expected_bits(hist) + 1e-9


def _exp_golomb_string(v: int, k: int) -> str:
    """Textbook order-k Exp-Golomb: write v + 2^k in binary, preceded by (its length - k - 1) 0s."""
    body = bin(v + (1 << k))[2:]
    return "0" * (len(body) - k - 1) + body


def test_exp_golomb_lengths_match_the_textbook_code():
    v = np.arange(5000)
    for k in range(9):
        want = [len(_exp_golomb_string(int(x), k)) for x in v]
        assert bl.exp_golomb_lengths(v, k).tolist() == want
    assert _exp_golomb_string(3, 0) == "00100" and _exp_golomb_string(0, 1) == "10"


@settings(max_examples=60, deadline=None)
@given(histograms())
def test_exp_golomb_picks_the_best_order(hist):
    ranks = bl.rank_mapping(hist)
    bits, k = bl.exp_golomb_bits(hist)
    per_k = [(hist * bl.exp_golomb_lengths(ranks, j)).sum() / hist.sum() for j in range(9)]
    assert bits == pytest.approx(min(per_k)) and per_k[k] == pytest.approx(bits)
    # the frequency-rank mapping is the best any mapping can do for a fixed k
    other, _ = bl.exp_golomb_bits(hist, bl.sign_magnitude_mapping())
    assert bits <= other + 1e-9


def test_mappings_are_permutations():
    rng = np.random.default_rng(3)
    h = rng.integers(0, 100, ALPHABET)
    h[0] = 1000
    assert sorted(bl.rank_mapping(h).tolist()) == list(range(ALPHABET))
    assert bl.rank_mapping(h)[0] == 0
    sm = bl.sign_magnitude_mapping()
    assert sorted(sm.tolist()) == list(range(ALPHABET))
    assert sm[0x00] == 0 and sm[0x80] == 1 and sm[0x01] == 2 and sm[0xFF] == 255


def test_histogram_and_bad_input():
    assert bl.histogram(np.array([1, 1, 255], np.uint8))[[1, 255]].tolist() == [2, 1]
    with pytest.raises(TypeError, match="uint8"):
        bl.histogram(np.array([1, 2], np.int32))
    with pytest.raises(ValueError, match="order"):
        bl.exp_golomb_lengths(np.arange(3), -1)
    with pytest.raises(ValueError, match="non-negative"):
        bl.exp_golomb_lengths(np.array([-1]), 0)
    with pytest.raises(ValueError, match="256 entries"):
        bl.exp_golomb_bits(np.ones(ALPHABET, np.int64), np.arange(10))
    with pytest.raises(ValueError, match="empty"):
        bl.huffman_bits(np.zeros(ALPHABET, np.int64))
