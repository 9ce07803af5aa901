"""A call that repeats an uncompressed call (the same op, group, tensor shapes, dtypes and layouts,
arguments, policy and settings) skips building and routing its descriptor (_agree.Repeat) but not
the exchange: its results are still torch's bits, a mismatch on a repeat still raises on every
rank, and a rank that takes the whole way (its repeats forgotten) still meets one that repeats.

2 and 3 gloo ranks, ``ZIPCCL_MODE=auto`` with a profile that keeps every call native.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import pytest
import torch
import torch.distributed as dist
import zipccl
from zipccl import CollectiveMismatchError
from zipccl.collectives import _agree, _slots

from tests._collectives_cluster import module_cluster
from tests.test_collectives import installed, same_bits

AUTO = {"ZIPCCL_MODE": "auto"}


pair = module_cluster(2)


trio = module_cluster(3)


@contextlib.contextmanager
def whole_ways() -> Iterator[list[str]]:
    """Log the op of every call that takes the whole way (_agree.agree) instead of a repeat."""
    log: list[str] = []
    real = _agree.agree

    def agree(g: object, name: str, *args: object, **kwargs: object) -> object:
        log.append(name)
        return real(g, name, *args, **kwargs)  # type: ignore[arg-type]

    _agree.agree = agree  # type: ignore[assignment]
    try:
        yield log
    finally:
        _agree.agree = real


def _ops(rank: int, world: int, numel: int) -> dict[str, Callable[[object, int], torch.Tensor]]:
    """Each op as ``run(lib, seed) -> its output``, on fresh seeded inputs of ``numel`` values:
    ``lib`` is zipccl or torch.distributed."""

    def data(seed: int, n: int = numel) -> torch.Tensor:
        gen = torch.Generator().manual_seed(1000 * seed + rank)
        return torch.randn(n, generator=gen).to(torch.bfloat16)

    def all_gather(lib: object, seed: int) -> torch.Tensor:
        out = torch.empty(world * numel, dtype=torch.bfloat16)
        lib.all_gather_into_tensor(out, data(seed))  # type: ignore[attr-defined]
        return out

    def all_to_all(lib: object, seed: int) -> torch.Tensor:
        out = torch.empty(world * numel, dtype=torch.bfloat16)
        lib.all_to_all_single(out, data(seed, world * numel))  # type: ignore[attr-defined]
        return out

    def reduce_scatter(lib: object, seed: int) -> torch.Tensor:
        out = torch.empty(numel, dtype=torch.bfloat16)
        x = data(seed, world * numel)
        if lib is dist:
            dist.reduce_scatter_tensor(out, x)
        else:
            zipccl.reduce_scatter_tensor(out, x)
        return out

    def all_reduce(lib: object, seed: int) -> torch.Tensor:
        x = data(seed)
        lib.all_reduce(x)  # type: ignore[attr-defined]
        return x

    def broadcast(lib: object, seed: int) -> torch.Tensor:
        x = data(seed)
        lib.broadcast(x, world - 1)  # type: ignore[attr-defined]
        return x

    return {
        "all_gather": all_gather,
        "all_to_all": all_to_all,
        "reduce_scatter": reduce_scatter,
        "all_reduce": all_reduce,
        "broadcast": broadcast,
    }


def sc_repeats(rank: int, world: int, numel: int) -> list[str]:
    """Three calls of each op on fresh inputs, against the same calls each taking the whole way
    (its repeats forgotten on every rank) and, for the ops that move data, torch's call: what
    differs, and which calls took the whole way."""
    bad = []
    with installed("native"):
        for name, run in _ops(rank, world, numel).items():
            with whole_ways() as log:
                got = [run(zipccl, seed) for seed in range(3)]
            want = []
            for seed in range(3):
                _agree.REPEATS.clear()
                want.append(run(zipccl, seed))
            if "reduce" not in name:  # a reduction of more than two ranks: zipccl's rank order
                want += [run(dist, seed) for seed in range(3)]
            bad += [f"{name} call {i}" for i, w in enumerate(want) if not same_bits(got[i % 3], w)]
            if log != [name]:
                bad.append(f"{name}: whole ways {log}")
    return bad


@pytest.mark.parametrize("numel", [64, 3000])  # in the exchange; beyond it, torch's call after
def test_repeats_skip_the_whole_way_and_give_torchs_bits(pair, trio, numel):
    for ranks in (pair, trio):
        for bad in ranks.run(sc_repeats, numel, env=AUTO):
            assert not bad, (ranks.world, bad)


MISMATCHES = {
    "size": lambda rank: zipccl.all_reduce(torch.zeros(100 + 100 * (rank == 1))),
    "dtype": lambda rank: zipccl.all_reduce(
        torch.zeros(100, dtype=torch.int32 if rank == 1 else torch.float32)
    ),
    "op": lambda rank: (
        zipccl.all_reduce(torch.zeros(100)) if rank != 1 else zipccl.broadcast(torch.zeros(100), 0)
    ),
    "reduce op": lambda rank: zipccl.all_reduce(
        torch.zeros(100), dist.ReduceOp.MAX if rank == 1 else dist.ReduceOp.SUM
    ),
    "src": lambda rank: zipccl.broadcast(torch.zeros(100), int(rank == 1)),
}


def sc_mismatch_on_a_repeat(rank: int, world: int, case: str) -> str:
    """Every rank repeats a correct call, then rank 1 calls differently while the others
    repeat: what this rank raised; then a correct call still works."""
    with installed("native"):
        for _ in range(2):
            zipccl.all_reduce(torch.zeros(100))
            zipccl.broadcast(torch.zeros(100), 0)
        try:
            MISMATCHES[case](rank)
            raised = "nothing"
        except CollectiveMismatchError as exc:
            raised = f"CollectiveMismatchError: {exc}"
        x = torch.full((100,), float(rank))
        zipccl.all_reduce(x)
        assert torch.equal(x, torch.full((100,), float(sum(range(world)))))
    return raised


@pytest.mark.parametrize("case", sorted(MISMATCHES))
def test_a_mismatch_on_a_repeat_raises_on_every_rank(pair, trio, case):
    for ranks in (pair, trio):
        raised = ranks.run(sc_mismatch_on_a_repeat, case, env=AUTO)
        assert all(r.startswith("CollectiveMismatchError") for r in raised), raised


def sc_uneven_repeats(rank: int, world: int, scale: int) -> list[str]:
    """Three all-to-alls with explicit splits (each rank its own) on fresh inputs, against
    torch's, then one with other splits: what differs, and which calls took the whole way."""
    bad = []
    with installed("native"), whole_ways() as log:
        for seed, more in ((0, 0), (1, 0), (2, 0), (3, 1)):
            ins = [scale * (1 + rank + 2 * j + more) for j in range(world)]
            outs = [scale * (1 + i + 2 * rank + more) for i in range(world)]
            gen = torch.Generator().manual_seed(1000 * seed + rank)
            x = torch.randn(sum(ins), 3, generator=gen).to(torch.bfloat16)
            got, want = (torch.empty(sum(outs), 3, dtype=x.dtype) for _ in range(2))
            zipccl.all_to_all_single(got, x, outs, ins)
            dist.all_to_all_single(want, x, outs, ins)
            if not same_bits(got, want):
                bad.append(f"call {seed}")
    return bad + ([] if log == ["all_to_all"] * 2 else [f"whole ways {log}"])


@pytest.mark.parametrize("scale", [1, 2000])  # in the exchange; beyond it, torch's call after
def test_uneven_all_to_alls_repeat_and_give_torchs_bits(pair, trio, scale):
    for ranks in (pair, trio):
        for bad in ranks.run(sc_uneven_repeats, scale, env=AUTO):
            assert not bad, (ranks.world, bad)


def sc_uneven_mismatch_on_a_repeat(rank: int, world: int) -> str:
    """Every rank repeats an all-to-all with explicit splits, then rank 1 sends rank 0 a row
    more than rank 0 expects while the others repeat: what this rank raised; then a correct
    call still works."""
    even = [1] * world
    with installed("native"):
        for _ in range(2):
            zipccl.all_to_all_single(torch.empty(world), torch.zeros(world), even, even)
        ins = [2, *even[1:]] if rank == 1 else even
        try:
            zipccl.all_to_all_single(torch.empty(world), torch.zeros(sum(ins)), even, ins)
            raised = "nothing"
        except CollectiveMismatchError as exc:
            raised = f"CollectiveMismatchError: {exc}"
        out = torch.empty(world)
        zipccl.all_to_all_single(out, torch.full((world,), float(rank)), even, even)
        assert torch.equal(out, torch.arange(world, dtype=out.dtype))
    return raised


def test_an_uneven_mismatch_on_a_repeat_raises_on_every_rank(pair, trio):
    for ranks in (pair, trio):
        raised = ranks.run(sc_uneven_mismatch_on_a_repeat, env=AUTO)
        assert all(r.startswith("CollectiveMismatchError") for r in raised), raised


def sc_one_rank_forgets(rank: int, world: int) -> tuple[list[str], bool]:
    """Every rank repeats an all-reduce; rank 0 forgets its repeats (it takes the whole way, its
    peers repeat): which way this rank took, and whether the sum is right."""
    with installed("native"):
        zipccl.all_reduce(torch.ones(50))
        if rank == 0:
            _agree.REPEATS.clear()
        x = torch.ones(50)
        with whole_ways() as log:
            zipccl.all_reduce(x)
    return log, torch.equal(x, torch.full((50,), float(world)))


def test_a_rank_that_forgot_its_repeats_meets_those_that_repeat(pair, trio):
    for ranks in (pair, trio):
        results = ranks.run(sc_one_rank_forgets, env=AUTO)
        assert [log for log, _ in results] == [["all_reduce"]] + [[]] * (ranks.world - 1)
        assert all(right for _, right in results)


def sc_settings_and_profiles(rank: int, world: int) -> list[str]:
    """The strategy of an all-gather repeated under auto, under ZIPCCL_MODE=always (every
    rank), and after a new profile."""
    import os

    x, out = torch.randn(2048), torch.empty(world * 2048)
    seen = []
    with installed("native"):
        for mode in ("auto", "auto", "always", "auto"):
            os.environ["ZIPCCL_MODE"] = mode
            zipccl.all_gather_into_tensor(out, x)
            seen.append(_slots.STATS.strategy)
        kept = len(_agree.REPEATS)
    seen.append(f"kept {kept}, after a new profile {len(_agree.REPEATS)}")
    return seen


def test_settings_and_profiles_are_part_of_a_repeat(pair):
    for seen in pair.run(sc_settings_and_profiles, env=AUTO):
        assert seen[:4] == ["native", "native", "compressed", "native"], seen
        assert seen[4].endswith("after a new profile 0") and not seen[4].startswith("kept 0")
