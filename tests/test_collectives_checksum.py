"""``ZIPCCL_CHECKSUM=1``: compressed pieces carry the values checksum, on 2 gloo processes.

Every op stays bit-exact with it, first and planned calls alike; a piece whose sign or mantissa
bit flips in transit (a legal code, which decodes silently without a checksum) raises on the
receiving rank and a PeerError on the other, within seconds. (Ranks that disagree on the setting
raise CollectiveMismatchError: tests/test_backend.py, with the other settings.)
"""

from __future__ import annotations

import time

import pytest
import torch
import zipccl
from zipccl import _plans
from zipccl.collectives import _slots
from zipccl.golden.container import HEADER_BYTES

from tests._collectives_cluster import short_timeout_cluster
from tests.test_collectives_failures import FAST_S, GROUP_TIMEOUT_S, OPS, N, _call, data

CHECKED = {"ZIPCCL_MODE": "always", "ZIPCCL_CHECKSUM": "1"}


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    yield from short_timeout_cluster(
        2, "gloo", str(tmp_path_factory.mktemp("checksum")), GROUP_TIMEOUT_S
    )


def _expected(op: str, rank: int, world: int) -> torch.Tensor:
    every = [data(r) for r in range(world)]
    if op == "all_gather":
        return torch.cat(every)
    if op == "all_to_all":
        return torch.cat([x.chunk(world)[rank] for x in every])
    total = sum(x.float() for x in every)
    if op == "reduce_scatter":
        return total.bfloat16().chunk(world)[rank]
    return total.bfloat16()  # all_reduce


def sc_exact(rank: int, world: int, op: str) -> bool:
    """Two calls of ``op`` (the second on the first's plan) give torch's results."""
    _plans.forget()
    x = data(rank)
    results = []
    for _ in range(2):
        if op == "all_gather":
            out = torch.empty(world * N, dtype=x.dtype)
            zipccl.all_gather_into_tensor(out, x)
        elif op == "all_to_all":
            out = torch.empty_like(x)
            zipccl.all_to_all_single(out, x)
        elif op == "reduce_scatter":
            out = torch.empty(N // world, dtype=x.dtype)
            zipccl.reduce_scatter_tensor(out, x)
        else:
            out = x.clone()
            zipccl.all_reduce(out)
        want = _expected(op, rank, world)
        results.append(torch.equal(out.view(torch.int16), want.view(torch.int16)))
    return all(results)


@pytest.mark.parametrize("op", ["all_gather", "all_to_all", "reduce_scatter", "all_reduce"])
def test_checked_collectives_are_exact(pair, op):
    assert pair.run(sc_exact, op, env=CHECKED) == [True, True]


def sc_flip_in_transit(rank: int, world: int, op: str, culprit: int) -> dict[str, object]:
    """Rank ``culprit`` receives its pieces with one mantissa bit flipped (the first raw byte
    plane starts right after the header)."""
    real = _slots.Unpack.__call__

    def unpack(self, key, got, seg, *args):
        if not seg.raw:
            got[HEADER_BYTES + 7] ^= 1
        return real(self, key, got, seg, *args)

    _plans.forget()
    if rank == culprit:
        _slots.Unpack.__call__ = unpack
    start = time.monotonic()
    try:
        _call(zipccl, op, rank, world, (culprit + 1) % world)
        raised = message = None
    except Exception as exc:
        raised, message = type(exc).__name__, str(exc)
    finally:
        _slots.Unpack.__call__ = real
    return {"raised": raised, "message": message, "seconds": time.monotonic() - start}


@pytest.mark.parametrize("op", OPS)
def test_a_flip_in_transit_raises_on_every_rank(pair, op):
    results = pair.run(sc_flip_in_transit, op, 1, env=CHECKED)
    culprit, other = results[1], results[0]
    assert culprit["raised"] == "ValueError" and "checksum" in culprit["message"], results
    assert other["raised"] == "PeerError" and "rank 1 failed" in other["message"], results
    assert all(r["seconds"] < FAST_S for r in results), results


def test_without_the_checksum_the_same_flip_passes_silently(pair):
    """What the setting is for: the same flip, unchecked, decodes to other values unnoticed."""
    results = pair.run(sc_flip_in_transit, "broadcast", 1, env={"ZIPCCL_MODE": "always"})
    assert [r["raised"] for r in results] == [None, None], results
