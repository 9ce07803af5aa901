"""Tables from theory: the exponent distribution of a Gaussian tensor, no online histogram.

For x ~ N(0, sigma^2) the unbiased exponent e = floor(log2|x|) has
P(e) = 2 [Phi(2^(e+1)/sigma) - Phi(2^e/sigma)]. Real tensors are not zero mean (LayerNorm gains)
and often hold many exact zeros (embedding gradients), so sigma is the RMS of the finite non-zero
values and the zero fraction z is modelled apart: P(biased exponent 0) gains z.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from zipccl.golden.codebook import ALPHABET, Codebook
from zipccl.golden.formats import FloatFormat

ZIPCCL_TOP = 7  # exponents given 3-bit codes; prefix 0 is the escape
SAMPLE_SIZE = 65536


@dataclass(frozen=True)
class TensorStats:
    rms: float  # RMS of the finite non-zero values (0.0 if there are none)
    zero_fraction: float


def sample_indices(numel: int, size: int = SAMPLE_SIZE) -> np.ndarray:
    """The deterministic strided sample every backend draws its statistics from."""
    stride = max(1, numel // size)
    return np.arange(0, numel, stride, dtype=np.int64)[:size]


def tensor_stats(values: np.ndarray) -> TensorStats:
    """Statistics of float values (any float dtype), computed in float64."""
    v = np.asarray(values, np.float64).ravel()
    if v.size == 0:
        return TensorStats(0.0, 0.0)
    zero = v == 0
    live = v[np.isfinite(v) & ~zero]
    rms = float(np.sqrt(np.mean(live * live))) if live.size else 0.0
    return TensorStats(rms, float(zero.mean()))


def _phi(x: float) -> float:
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


def exponent_probabilities(fmt: FloatFormat, stats: TensorStats) -> np.ndarray:
    """P(biased exponent) over the 256-symbol alphabet under the Gaussian-plus-zeros model."""
    if fmt.byte_coded:
        raise TypeError(f"{fmt.name} is byte coded; exponent theory applies to BF16/FP16/FP32")
    probs = np.zeros(ALPHABET)
    top = (1 << fmt.exp_bits) - 1
    sigma = stats.rms
    if sigma > 0 and math.isfinite(sigma):
        edges = [0.0] + [2.0 ** (e - fmt.exp_bias) for e in range(1, top + 1)] + [math.inf]
        cdf = [2.0 * _phi(edge / sigma) - 1.0 for edge in edges]
        probs[: top + 1] = np.diff(cdf)
    probs *= 1.0 - stats.zero_fraction
    probs[0] += stats.zero_fraction
    return probs


def zipccl_layout(ranks: list[int], name: str) -> Codebook:
    """The ZipCCL exponent table: prefix 0 escapes (8-bit literal), 1..7 one symbol each."""
    return Codebook(widths=(8,) + (0,) * ZIPCCL_TOP, literal=0, ranks=tuple(ranks), name=name)


def top_symbols(probs: np.ndarray, k: int) -> list[int]:
    """The k most probable symbols, most probable first; ties go to the smaller symbol."""
    order = sorted(range(len(probs)), key=lambda s: (-probs[s], s))
    return order[:k]


def zipccl_table(fmt: FloatFormat, stats: TensorStats) -> Codebook:
    probs = exponent_probabilities(fmt, stats)
    name = f"zipccl-theory-{fmt.name}-rms{stats.rms:.3g}-z{stats.zero_fraction:.3g}"
    return zipccl_layout(top_symbols(probs, ZIPCCL_TOP), name)
