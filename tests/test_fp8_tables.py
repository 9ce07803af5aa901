"""The FP8 default table (golden.builders.staircase_table): its fixed family, and the ratios it
reaches through zipccl.compress on CPU against the exhaustive search and the old preset.

Run with ``-s`` to see the measured ratios (one line per case).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
import zipccl
from hypothesis import given, settings
from zipccl.golden import builders, data, presets
from zipccl.golden.codebook import ALPHABET, NUM_REGIONS, Codebook
from zipccl.golden.container import HEADER_BYTES

from tests.test_builders import histograms

FP8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
PRESET = {"e4m3": presets.qlc_e4m3, "e5m2": presets.qlc_e5m2}
NUMEL = 1 << 20


def absmax_scaled(x: torch.Tensor, fmt: str) -> torch.Tensor:
    """The usual FP8 recipe: scale so that max|x| is the format's largest finite value."""
    dtype = FP8[fmt]
    return (x * (torch.finfo(dtype).max / x.abs().max())).to(dtype)


def gaussian(seed: int, zeros: float = 0.0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(NUMEL, generator=gen)
    x[torch.rand(NUMEL, generator=gen) < zeros] = 0.0
    return x


def ratios(x: torch.Tensor, fmt: str) -> dict[str, float]:
    """compress ratios (container bytes / raw bytes) under the default, best and preset tables."""
    return {
        "default": zipccl.compress(x).ratio,
        "best": zipccl.compress(x, "histogram").ratio,
        "preset": zipccl.compress(x, PRESET[fmt]()).ratio,
    }


# --------------------------------------------------------------------------- the family
def test_the_family_is_fixed_and_complete() -> None:
    rows = builders.staircase_layouts()
    assert rows.shape == (666, NUM_REGIONS) and not rows.flags.writeable
    as_tuples = [tuple(map(int, r)) for r in rows]
    assert as_tuples == sorted(set(as_tuples))  # unique, in lexicographic order
    for r in as_tuples:
        head = sum(1 << w for w in r[:-1])  # region 7: the narrowest width that ranks all 256
        assert head + (1 << r[-1]) >= ALPHABET
        assert r[-1] == r[-2] or head + (1 << (r[-1] - 1)) < ALPHABET
        rises = itertools.pairwise(r[:-1])  # by 0 or 1, by any amount out of w=0
        assert r[0] <= 5 and all(0 <= b - a <= 1 or a == 0 for a, b in rises)
    for layout in [
        (5,) * 8,
        (0, 3, 3, 3, 3, 4, 5, 8),
        (0, 0, 3, 3, 4, 4, 5, 8),
        (2, 2, 2, 2, 3, 3, 4, 8),
    ]:
        assert layout in as_tuples


def _first_best_by_codebooks(hist: np.ndarray) -> tuple[int, ...]:
    """The first row of least expected length, each row built as a Codebook (slow, exact)."""
    order = builders.ranks_by_frequency(hist)
    bits = [
        Codebook(tuple(map(int, r)), None, tuple(order)).expected_bits(hist)
        for r in builders.staircase_layouts()
    ]
    return tuple(map(int, builders.staircase_layouts()[int(np.argmin(bits))]))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_vectorised_score_picks_the_first_best_row(seed: int) -> None:
    rng = np.random.default_rng(seed)
    hist = np.bincount(
        np.clip(rng.laplace(128, 6 + 10 * seed, 20000), 0, 255).astype(int), minlength=ALPHABET
    )
    book = builders.staircase_table(hist)
    assert book.widths == _first_best_by_codebooks(hist) and book.literal is None
    assert book.ranks == tuple(builders.ranks_by_frequency(hist))


def test_ties_go_to_the_smaller_symbol() -> None:
    book = builders.staircase_table(np.ones(ALPHABET, np.int64))
    assert book.ranks == tuple(range(ALPHABET)) and book.expected_bits(np.ones(ALPHABET)) == 8.0
    hist = np.zeros(ALPHABET, np.int64)
    hist[[200, 7]] = 5
    assert builders.staircase_table(hist).ranks[:3] == (7, 200, 0)


@settings(max_examples=120, deadline=None)
@given(histograms())
def test_never_longer_than_raw_nor_shorter_than_the_search(hist: np.ndarray) -> None:
    book = builders.staircase_table(hist)
    assert book.num_ranked == ALPHABET  # complete without an escape
    bits = book.expected_bits(hist)
    assert builders.best_table(hist).expected_bits(hist) - 1e-12 <= bits <= 8.0 + 1e-12
    assert builders.staircase_table(hist.copy()).to_bytes() == book.to_bytes()


# --------------------------------------------------------------------------- the ratios
@pytest.mark.parametrize(
    ("case", "fmt", "zeros", "target"),
    [
        ("absmax N(0,1)", "e4m3", 0.0, 0.84),
        ("absmax N(0,1)", "e5m2", 0.0, 0.73),
        ("absmax N(0,1), 60% zeros", "e4m3", 0.6, 0.60),
    ],
)
def test_default_ratio_on_absmax_scaled_tensors(
    case: str, fmt: str, zeros: float, target: float
) -> None:
    x = absmax_scaled(gaussian(17, zeros), fmt)
    got = ratios(x, fmt)
    print(
        f"\n{fmt} {case}, {NUMEL} elements: default {got['default']:.4f} (target <= {target}), "
        f"best_table {got['best']:.4f}, preset {got['preset']:.4f}"
    )
    assert got["default"] <= target
    assert got["default"] <= got["best"] + 0.002


@pytest.mark.parametrize("fmt", sorted(FP8))
def test_minilm_activations_within_a_hundredth_of_the_search(fmt: str) -> None:
    """Every MiniLM linear-layer input, absmax scaled per tensor: the default table (from the
    65,536-value sample) against best_table of the whole tensor, ratio by ratio."""
    gaps = {}
    for name, raw in data.fp8_activations(fmt).items():
        x = torch.from_numpy(raw.ravel().copy()).view(FP8[fmt])
        got = ratios(x, fmt)
        gaps[name] = (got["default"] - got["best"], got["default"], got["best"], got["preset"])
    worst = max(gaps, key=lambda n: gaps[n][0])
    mean = {
        k: np.mean([g[i] for g in gaps.values()])
        for i, k in enumerate(("gap", "default", "best", "preset"))
    }
    print(
        f"\nMiniLM {fmt}, {len(gaps)} tensors: mean default {mean['default']:.4f}, best_table "
        f"{mean['best']:.4f}, preset {mean['preset']:.4f}; worst gap {gaps[worst][0]:.4f} "
        f"({worst}: {gaps[worst][1]:.4f} vs {gaps[worst][2]:.4f})"
    )
    assert gaps[worst][0] <= 0.01


@pytest.mark.parametrize("fmt", sorted(FP8))
def test_random_bytes_cost_at_most_the_header(fmt: str) -> None:
    gen = torch.Generator().manual_seed(5)
    x = torch.randint(0, ALPHABET, (NUMEL,), generator=gen, dtype=torch.uint8).view(FP8[fmt])
    c = zipccl.compress(x)
    print(f"\n{fmt} random bytes: {c.layout}, ratio {c.ratio:.4f}")
    assert c.nbytes <= NUMEL + HEADER_BYTES
    assert torch.equal(zipccl.decompress(c).view(torch.uint8), x.view(torch.uint8))


@pytest.mark.parametrize("fmt", sorted(FP8))
def test_decompress_reads_the_fitted_table_from_the_header(fmt: str) -> None:
    x = absmax_scaled(gaussian(23, 0.3)[:50000], fmt)
    c = zipccl.compress(x)
    parsed = zipccl.Compressed.from_buffer(c.buffer.clone())
    assert c.layout == "split" and parsed.table == zipccl.default_table(x) != PRESET[fmt]()
    assert torch.equal(zipccl.decompress(c.buffer.clone()).view(torch.uint8), x.view(torch.uint8))
