"""FP8 through the compressed collectives on 2 gloo processes: absmax-scaled weights all-gathered
and tokens all-to-all'd with uneven splits are bit-identical to torch.distributed's, and the
pieces travel compressed (the CPU default, the staircase table every rank builds from each
rank's exchanged sample, fits absmax-scaled FP8). Run with ``-s`` for the wire ratios."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import zipccl
from zipccl import switch
from zipccl.collectives import STATS

from tests._collectives_cluster import module_cluster

FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]
ALWAYS = {"ZIPCCL_MODE": "always"}
HIDDEN = 512
# tokens rank i sends rank j: uneven, and each rank keeps a different share for itself
ROWS = [[30, 100], [96, 170]]


pair = module_cluster(2)


def absmax_scaled(
    seed: int, shape: tuple[int, ...], dtype: torch.dtype, std: float
) -> torch.Tensor:
    """N(0, std^2) scaled so that max|x| is the format's largest finite value (FP8 recipe)."""
    x = torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * std
    return (x * (torch.finfo(dtype).max / x.abs().max())).to(dtype)


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def sc_all_gather_weights(
    rank: int, world: int, dtype: torch.dtype, numel: int
) -> tuple[bool, str, float]:
    """(bit-identical, strategy, bytes this rank sent / its raw bytes)."""
    x = absmax_scaled(10 + rank, (numel,), dtype, std=0.02)
    got = torch.empty(world * numel, dtype=dtype)
    STATS.reset()
    zipccl.all_gather_into_tensor(got, x)
    strategy, sent = STATS.strategy, STATS.sent
    want = torch.empty(world * numel, dtype=torch.uint8)
    dist.all_gather_into_tensor(want, x.view(torch.uint8))
    return same_bytes(got, want.view(dtype)), strategy, sent / numel


def sc_all_to_all_tokens(rank: int, world: int, dtype: torch.dtype) -> tuple[bool, str, float]:
    """(bit-identical, strategy, bytes this rank sent / the raw bytes of its pieces to peers)."""
    ins, outs = ROWS[rank], [ROWS[i][rank] for i in range(world)]
    x = absmax_scaled(20 + rank, (sum(ins), HIDDEN), dtype, std=1.0)
    got = torch.empty(sum(outs), HIDDEN, dtype=dtype)
    STATS.reset()
    zipccl.all_to_all_single(got, x, outs, ins)
    strategy, sent = STATS.strategy, STATS.sent
    want = torch.empty(sum(outs), HIDDEN, dtype=torch.uint8)
    dist.all_to_all_single(want, x.view(torch.uint8), outs, ins)
    to_peers = sum(n for j, n in enumerate(ins) if j != rank) * HIDDEN
    return same_bytes(got, want.view(dtype)), strategy, sent / to_peers


def _check(results: list[tuple[bool, str, float]], what: str, bound: float) -> None:
    print(
        f"\n{what}: wire bytes / raw bytes per rank " + ", ".join(f"{r:.4f}" for _, _, r in results)
    )
    for exact, strategy, ratio in results:
        assert exact and strategy == switch.COMPRESSED and ratio <= bound, results


@pytest.mark.parametrize(("dtype", "bound"), [(FP8[0], 0.92), (FP8[1], 0.8)], ids=str)
def test_all_gather_of_fp8_weights(pair, dtype: torch.dtype, bound: float) -> None:
    _check(
        pair.run(sc_all_gather_weights, dtype, 1 << 17, env=ALWAYS),
        f"all_gather_into_tensor {dtype}",
        bound,
    )


@pytest.mark.parametrize(("dtype", "bound"), [(FP8[0], 0.92), (FP8[1], 0.8)], ids=str)
def test_all_to_all_of_fp8_tokens_uneven(pair, dtype: torch.dtype, bound: float) -> None:
    _check(
        pair.run(sc_all_to_all_tokens, dtype, env=ALWAYS),
        f"all_to_all_single {dtype} splits {ROWS}",
        bound,
    )
