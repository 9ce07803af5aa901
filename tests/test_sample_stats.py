"""codec.sample_stats (the theory table's statistics on the tensor's device) equals golden's.

On CPU the match must be exact: the default table, and so the compressed bytes, must be golden's.
The device path (codec._device_stats, used on CUDA) runs here on CPU tensors: its counts must be
exact and its RMS within float64 rounding of golden's (it sums in another order).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from zipccl import codec
from zipccl.golden import theory
from zipccl.golden.formats import get_format

DTYPES = [torch.bfloat16, torch.float16, torch.float32]


def golden_stats(x: torch.Tensor) -> theory.TensorStats:
    values = x.reshape(-1).to(torch.float64).numpy()
    return theory.tensor_stats(values[theory.sample_indices(values.size)])


def specials(numel: int, dtype: torch.dtype) -> torch.Tensor:
    """N(0, 1) with zeros, +-0, +-inf, NaN, subnormals and huge values mixed in."""
    gen = torch.Generator().manual_seed(numel)
    x = torch.randn(numel, generator=gen).to(dtype)
    tiny, big = torch.finfo(dtype).smallest_normal, torch.finfo(dtype).max
    odd = torch.tensor(
        [0.0, -0.0, float("inf"), -float("inf"), float("nan"), tiny / 4, -tiny / 2, big, -big],
        dtype=dtype,
    )
    at = torch.randint(0, numel, (numel // 10 + 1,), generator=gen)
    x[at] = odd[torch.arange(at.numel()) % odd.numel()]
    x[::3] = 0
    return x


CASES = {
    "empty": lambda d: torch.empty(0, dtype=d),
    "one": lambda d: torch.ones(1, dtype=d),
    "zeros": lambda d: torch.zeros(5000, dtype=d),
    "non_finite_only": lambda d: torch.tensor(
        [float("nan"), float("inf"), -float("inf")] * 7, dtype=d
    ),
    "subnormals": lambda d: torch.full((300,), torch.finfo(d).smallest_normal / 8, dtype=d),
    "specials": lambda d: specials(9001, d),
    "strided_sample": lambda d: specials(300001, d),  # > SAMPLE_SIZE: every 4th value
    "matrix": lambda d: specials(6000, d).view(60, 100).t(),  # non-contiguous input
}


def device_stats(x: torch.Tensor) -> theory.TensorStats:
    return codec._device_stats(codec._sample(x).to(torch.float64))


def same_up_to_summation_order(got: theory.TensorStats, want: theory.TensorStats) -> bool:
    return got.zero_fraction == want.zero_fraction and got.rms == pytest.approx(want.rms, rel=1e-13)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", list(CASES))
def test_sample_stats_equal_golden(case: str, dtype: torch.dtype) -> None:
    x = CASES[case](dtype)
    want = golden_stats(x)
    assert codec.sample_stats(x) == want
    assert same_up_to_summation_order(device_stats(x), want)


@pytest.mark.parametrize("stats", [codec.sample_stats, device_stats])
def test_special_cases_have_the_expected_statistics(stats) -> None:
    """Guards the golden side too: zeros count, non-finite values are ignored."""
    assert stats(torch.zeros(10)) == theory.TensorStats(0.0, 1.0)
    assert stats(torch.tensor([float("nan"), 2.0, 0.0, float("inf")])) == theory.TensorStats(
        2.0, 0.25
    )
    assert stats(torch.tensor([float("nan"), -float("inf")])) == theory.TensorStats(0.0, 0.0)
    assert stats(torch.empty(0, dtype=torch.bfloat16)) == theory.TensorStats(0, 0)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 70000), st.sampled_from(DTYPES))
def test_random_bit_patterns(seed: int, numel: int, dtype: torch.dtype) -> None:
    """Any bits at all (NaN payloads, subnormals, every exponent), any length."""
    bits = np.random.default_rng(seed).integers(
        0, 256, numel * torch.finfo(dtype).bits // 8, dtype=np.uint8
    )
    x = torch.from_numpy(bits).view(dtype)
    want = golden_stats(x)
    assert codec.sample_stats(x) == want
    assert same_up_to_summation_order(device_stats(x), want)


def test_default_table_uses_the_statistics() -> None:
    x = specials(70000, torch.bfloat16)
    want = theory.zipccl_table(codec._fmt(x.dtype), golden_stats(x))
    assert codec.default_table(x) == want


FORMATS = [get_format(name) for name in ("bfloat16", "float16", "float32")]


@settings(max_examples=300, deadline=None)
@given(
    st.floats(-46, 39),
    st.one_of(st.sampled_from([0.0, 1.0]), st.floats(0, 1)),
    st.sampled_from(FORMATS),
)
def test_theory_table_equals_golden(log_sigma: float, zeros: float, fmt) -> None:
    """The windowed table computation gives golden's table for any statistics (or defers)."""
    stats = theory.TensorStats(10.0**log_sigma, zeros)
    assert codec._theory_table.__wrapped__(fmt, stats) == theory.zipccl_table(fmt, stats)


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_theory_table_window_used_for_ordinary_statistics(fmt) -> None:
    """Weights, activations and gradients (some zeros; RMS 1e-6..300, FP16: 0.01..300 -- below
    that its mode nears the subnormals, where the window holds too few bins) take the short
    path; degenerate statistics defer to golden."""
    sigmas = (1e-6, 1e-4, 0.02, 1.0, 300.0) if fmt.exp_bits == 8 else (0.01, 1.0, 300.0)
    for sigma in sigmas:
        for zeros in (0.0, 0.3, 0.9):
            assert codec._top_exponents(fmt, theory.TensorStats(sigma, zeros)) is not None
    for sigma in (0.0, float("inf"), float("nan")):
        assert codec._top_exponents(fmt, theory.TensorStats(sigma, 0.0)) is None
    assert codec._top_exponents(fmt, theory.TensorStats(1.0, 1.0)) is None  # all zeros


def summary_parts(summary: torch.Tensor) -> tuple[list[float], np.ndarray]:
    words = summary.cpu().numpy()
    return words[:3].view(np.float64).tolist(), words[3:]


def golden_symbols(x: torch.Tensor) -> np.ndarray:
    """The symbol of every sampled value (golden's sample and golden's symbols)."""
    fmt = get_format(str(x.dtype).removeprefix("torch."))
    bits = x.reshape(-1).contiguous().view(
        {8: torch.uint8, 16: torch.int16, 32: torch.int32}[fmt.bits]
    ).numpy().astype(np.int64) & ((1 << fmt.bits) - 1)
    picked = bits[theory.sample_indices(bits.size)]
    return picked if fmt.byte_coded else (picked >> fmt.mant_bits) & ((1 << fmt.exp_bits) - 1)


@pytest.mark.parametrize("dtype", [*DTYPES, torch.float8_e4m3fn], ids=str)
@pytest.mark.parametrize("case", list(CASES))
def test_sample_summary_holds_the_statistics_and_the_histogram(case: str, dtype) -> None:
    """What a collective exchanges: golden's statistics (up to summation order; none for FP8)
    and the histogram of golden's sample's symbols, from which every rank builds the table."""
    x = CASES[case](torch.float32 if dtype == torch.float8_e4m3fn else dtype).to(dtype)
    sums, hist = summary_parts(codec.sample_summary(x))
    assert np.array_equal(hist, np.bincount(golden_symbols(x), minlength=256))
    if dtype == torch.float8_e4m3fn:
        assert sums == [0.0, 0.0, 0.0]
        return
    got = codec._stats_of(sums, max(1, int(hist.sum())))
    assert same_up_to_summation_order(got, golden_stats(x))
    table = codec.summary_table(dtype, codec.sample_summary(x).numpy())
    assert table == codec._theory_table(codec._fmt(dtype), got)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [*DTYPES, torch.float8_e4m3fn, torch.float8_e5m2], ids=str)
@pytest.mark.parametrize("case", list(CASES))
def test_cuda_sample_summary_equals_the_torch_one(case: str, dtype) -> None:
    """The summary kernel: the torch path's histogram exactly, its sums up to summation order."""
    x = CASES[case](torch.float32 if dtype.itemsize == 1 else dtype).to(dtype)
    want_sums, want_hist = summary_parts(codec.sample_summary(x))
    got_sums, got_hist = summary_parts(codec.sample_summary(x.cuda()))
    assert np.array_equal(got_hist, want_hist)
    assert got_sums[1:] == want_sums[1:] and got_sums[0] == pytest.approx(want_sums[0], rel=1e-13)


@pytest.mark.parametrize(
    "device",
    [
        "cpu",
        pytest.param(
            "cuda",
            marks=[
                pytest.mark.gpu,
                (pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")),
            ],
        ),
    ],
)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn], ids=str)
@pytest.mark.parametrize("case", ["strided_sample", "empty"])
def test_sample_summary_into_a_dirty_row_writes_every_word(case: str, dtype, device: str) -> None:
    """A collective writes the summary into its reused descriptor row: whatever was there
    before, the words are the freshly allocated summary's."""
    x = CASES[case](torch.float32).to(dtype).to(device)
    row = torch.full((codec.SUMMARY_WORDS + 4,), -7, dtype=torch.int64, device=device)
    got = codec.sample_summary(x, row[2:-2])
    assert got.data_ptr() == row[2:].data_ptr()
    assert torch.equal(row[2:-2].cpu(), codec.sample_summary(x).cpu())
    assert row[:2].tolist() == [-7, -7] and row[-2:].tolist() == [-7, -7]


@pytest.mark.parametrize(
    "out",
    [
        torch.zeros(codec.SUMMARY_WORDS - 1, dtype=torch.int64),
        torch.zeros(codec.SUMMARY_WORDS, dtype=torch.int32),
        torch.zeros(2 * codec.SUMMARY_WORDS, dtype=torch.int64)[::2],
    ],
    ids=["short", "int32", "strided"],
)
def test_sample_summary_rejects_a_bad_out(out: torch.Tensor) -> None:
    with pytest.raises(ValueError, match="contiguous int64"):
        codec.sample_summary(torch.ones(8, dtype=torch.bfloat16), out)
