"""Baselines the region code is measured against, in bits per symbol of an 8-bit alphabet.

All functions take a 256-bin count histogram (see :func:`histogram`) and describe an *ideal static*
code built on that same histogram: no table, header or padding is charged, so they are lower
bounds on what a real codec with that code would send.

* Shannon entropy -- the order-0 bound.
* Huffman -- real integer code lengths from the classic heap construction (a single present
  symbol still costs 1 bit).
* Exp-Golomb -- the universal code the QLC paper compares against, with the best order ``k`` in
  0..8. A universal code needs the symbols mapped to integers where small means likely:
  :func:`rank_mapping` (rank by frequency, the best any mapping can do; the same 256-entry LUT the
  region code uses) or :func:`sign_magnitude_mapping` (FP8 bytes as ``2 * |byte| + sign``, a
  table-free mapping that favours small magnitudes).
* raw -- the symbol width.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable

import numpy as np
from zipccl.golden.builders import check_histogram, ranks_by_frequency
from zipccl.golden.codebook import ALPHABET

EXP_GOLOMB_ORDERS = range(9)


def histogram(symbols: np.ndarray) -> np.ndarray:
    """256-bin count histogram (int64) of 8-bit symbols."""
    s = np.asarray(symbols)
    if s.dtype != np.uint8:
        raise TypeError(f"symbols must be a uint8 array, got {s.dtype}")
    return np.bincount(s.ravel(), minlength=ALPHABET).astype(np.int64)


def raw_bits(hist: np.ndarray) -> float:
    """Bits per symbol stored uncompressed: the 8-bit symbol itself."""
    check_histogram(hist)
    return 8.0


def _mean(hist: np.ndarray, lengths: np.ndarray) -> float:
    return float((hist * lengths).sum() / hist.sum())


def entropy_bits(hist: np.ndarray) -> float:
    """Shannon entropy in bits per symbol."""
    h = check_histogram(hist)
    p = h[h > 0] / h.sum()
    return float(-(p * np.log2(p)).sum())


def huffman_lengths(hist: np.ndarray) -> np.ndarray:
    """Huffman code length of each symbol (0 for symbols with no count)."""
    h = check_histogram(hist)
    lengths = np.zeros(ALPHABET, np.int64)
    # (weight, tie-break id, symbols under the node); merging deepens every symbol below by 1
    heap = [(int(c), s, [s]) for s, c in enumerate(h) if c > 0]
    heapq.heapify(heap)
    if len(heap) == 1:
        lengths[heap[0][2]] = 1
        return lengths
    next_id = ALPHABET
    while len(heap) > 1:
        w1, _, s1 = heapq.heappop(heap)
        w2, _, s2 = heapq.heappop(heap)
        merged = s1 + s2
        lengths[merged] += 1
        heapq.heappush(heap, (w1 + w2, next_id, merged))
        next_id += 1
    return lengths


def huffman_bits(hist: np.ndarray) -> float:
    """Mean Huffman code length in bits per symbol."""
    return _mean(check_histogram(hist), huffman_lengths(hist))


def exp_golomb_lengths(values: np.ndarray, k: int) -> np.ndarray:
    """Order-k Exp-Golomb code length of non-negative integers: 2*floor(log2(v + 2^k)) - k + 1."""
    if not 0 <= k <= 30:
        raise ValueError(f"Exp-Golomb order must be in 0..30, got {k}")
    v = np.asarray(values, np.int64)
    if (v < 0).any():
        raise ValueError("Exp-Golomb codes non-negative integers")
    top = np.floor(np.log2(v + (1 << k))).astype(np.int64)
    return 2 * top - k + 1


def rank_mapping(hist: np.ndarray) -> np.ndarray:
    """symbol -> its rank by frequency (0 = most frequent)."""
    out = np.empty(ALPHABET, np.int64)
    out[ranks_by_frequency(hist)] = np.arange(ALPHABET)
    return out


def sign_magnitude_mapping() -> np.ndarray:
    """FP8 byte -> 2 * (byte & 0x7f) + sign: both signs of a magnitude side by side."""
    b = np.arange(ALPHABET, dtype=np.int64)
    return 2 * (b & 0x7F) + (b >> 7)


def exp_golomb_bits(
    hist: np.ndarray, mapping: np.ndarray | None = None, orders: Iterable[int] = EXP_GOLOMB_ORDERS
) -> tuple[float, int]:
    """(mean bits per symbol, order k) of the best-order Exp-Golomb code.

    ``mapping`` sends each symbol to the integer that gets coded; the default is
    :func:`rank_mapping` of the same histogram.
    """
    h = check_histogram(hist)
    m = rank_mapping(h) if mapping is None else np.asarray(mapping, np.int64)
    if m.shape != (ALPHABET,):
        raise ValueError(f"a mapping has {ALPHABET} entries, got shape {m.shape}")
    results = [(_mean(h, exp_golomb_lengths(m, k)), k) for k in orders]
    if not results:
        raise ValueError("no Exp-Golomb order to try")
    return min(results)
