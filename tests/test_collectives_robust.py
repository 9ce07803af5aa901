"""Collectives on inputs an adversary or an edge case supplies (issue 18 item 8): empty FP8
reductions on gloo, and a peer's corrupt sample summary -- an error on every rank, never a
hang or a crash on one."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import zipccl
from zipccl import codec
from zipccl.collectives import _slots
from zipccl.golden.theory import SAMPLE_SIZE

from tests._collectives_cluster import Cluster

FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


@pytest.fixture(scope="module")
def pair():
    cluster = Cluster(2)
    yield cluster
    cluster.close()


def _summary(seed: int = 0) -> np.ndarray:
    x = torch.randn(5000, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)
    return codec.sample_summary(x).numpy()


def _corrupt(edit) -> np.ndarray:
    row = _summary().copy()
    edit(row)
    return row


def _sums(row: np.ndarray, value: float, at: int = 0) -> None:
    row[at] = np.array([value]).view(np.int64)[0]


@pytest.mark.parametrize(
    "edit",
    [
        lambda r: r.__setitem__(3 + 126, -1),
        lambda r: r.__setitem__(3 + 7, SAMPLE_SIZE + 1),
        lambda r: r.__setitem__(slice(3, None), 1 << 62),  # sums would wrap int64
        lambda r: _sums(r, float("nan")),
        lambda r: _sums(r, float("inf")),
        lambda r: _sums(r, -1.0),
        lambda r: _sums(r, 1e9, at=1),  # more live values than the sample holds
    ],
)
def test_an_impossible_peer_summary_is_an_error_naming_the_rank(edit) -> None:
    rows = np.stack([_summary(), _corrupt(edit)])
    with pytest.raises(ValueError, match="rank 1 sent a corrupt sample summary"):
        _slots.sources(torch.bfloat16, rows, None)


def test_real_and_empty_summaries_are_accepted() -> None:
    rows = np.stack([_summary(), np.zeros_like(_summary())])
    assert len(_slots.sources(torch.bfloat16, rows, None)) == 2


def sc_empty_fp8_reductions(rank: int, world: int) -> list[str]:
    """Before: the empty call went to gloo's own reduction, which has no fp8 (Invalid scalar
    type)."""
    done = []
    for dtype in FP8:
        t = torch.zeros(0, dtype=dtype)
        zipccl.all_reduce(t)
        zipccl.reduce_scatter_tensor(torch.zeros(0, dtype=dtype), t)
        done.append(str(dtype))
    return done


@pytest.mark.parametrize("mode", ["auto", "always"])
def test_empty_fp8_reductions_on_gloo(pair, mode: str) -> None:
    assert (
        pair.run(sc_empty_fp8_reductions, env={"ZIPCCL_MODE": mode}) == [[str(d) for d in FP8]] * 2
    )


def sc_corrupt_summary_from_rank_1(rank: int, world: int) -> str:
    """Rank 1's summaries claim a negative count; every rank must raise, none may hang."""
    honest = codec.sample_summary

    def lying(sample: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        out = honest(sample, out)
        out[3 + 126] = -5
        return out

    if rank == 1:
        codec.sample_summary = lying
    try:
        x = torch.randn(4096, generator=torch.Generator().manual_seed(rank)).to(torch.bfloat16)
        zipccl.all_gather_into_tensor(torch.empty(world * 4096, dtype=x.dtype), x)
    except ValueError as exc:
        return str(exc)
    finally:
        codec.sample_summary = honest
    return "no error"


def test_a_corrupt_peer_summary_raises_on_every_rank(pair) -> None:
    errors = pair.run(sc_corrupt_summary_from_rank_1, env={"ZIPCCL_MODE": "always"})
    assert all("rank 1 sent a corrupt sample summary" in e for e in errors), errors
