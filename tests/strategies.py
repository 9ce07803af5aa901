"""Tables and hypothesis strategies shared by the test files."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st
from zipccl.golden.codebook import ALPHABET, MAX_WIDTH, NUM_REGIONS, Codebook

# The QLC paper's static layout (code lengths 6/7/8/11) and the ZipCCL table for RMS 1.0.
QLC = Codebook((3, 3, 3, 4, 4, 4, 5, 8), None, tuple(range(ALPHABET)), name="qlc")
ZIPCCL = Codebook((8, 0, 0, 0, 0, 0, 0, 0), 0, (126, 127, 125, 124, 123, 128, 122), name="zipccl")


@st.composite
def codebooks(draw: st.DrawFn) -> Codebook:
    """Any complete table: with or without a literal region, with empty and partial regions."""
    widths = draw(st.lists(st.integers(0, MAX_WIDTH), min_size=NUM_REGIONS, max_size=NUM_REGIONS))
    literal = draw(st.one_of(st.none(), st.integers(0, NUM_REGIONS - 1)))
    if literal is not None:
        widths[literal] = MAX_WIDTH
    capacity = sum(1 << w for p, w in enumerate(widths) if p != literal)
    if literal is None and capacity < ALPHABET:
        widths[draw(st.integers(0, NUM_REGIONS - 1))] = MAX_WIDTH
        capacity = sum(1 << w for w in widths)
    low = 0 if literal is not None else ALPHABET
    n = draw(st.integers(low, min(capacity, ALPHABET)))
    seed = draw(st.integers(0, 2**32 - 1))
    ranks = np.random.default_rng(seed).permutation(ALPHABET)[:n]
    return Codebook(tuple(widths), literal, tuple(int(s) for s in ranks), name="random")


def symbol_arrays(max_size: int = 3000) -> st.SearchStrategy[np.ndarray]:
    """Symbol arrays skewed like real data (a few frequent symbols) or uniform."""

    @st.composite
    def build(draw: st.DrawFn) -> np.ndarray:
        n = draw(st.integers(0, max_size))
        seed = draw(st.integers(0, 2**32 - 1))
        rng = np.random.default_rng(seed)
        if draw(st.booleans()):
            return rng.integers(0, ALPHABET, n).astype(np.uint8)
        centre = draw(st.integers(0, 255))
        return ((centre + rng.geometric(0.3, n) * rng.choice([-1, 1], n)) % ALPHABET).astype(
            np.uint8
        )

    return build()
