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

from tests._collectives_cluster import module_cluster

FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


pair = module_cluster(2)


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


# --------------------------------------------------------------------------- issue 37


def _outcome(call) -> str:  # type: ignore[no-untyped-def]
    """What a call raised on this rank, as "Type: message" ("no error" if nothing)."""
    try:
        call()
    except BaseException as exc:  # a KeyboardInterrupt too: the scenarios inject one
        return f"{type(exc).__name__}: {exc}"
    return "no error"


def sc_one_rank_bad_argument(rank: int, world: int, case: str) -> str:
    """Rank 1 passes an argument that used to raise on it alone, before the descriptor
    exchange (its peer then waited for the group's timeout)."""
    import torch.distributed as dist

    x = torch.randn(6000).to(torch.bfloat16)
    bad = rank == 1
    if case == "table":
        out = torch.empty(world * x.numel(), dtype=x.dtype)
        table = "theory" if bad else None
        return _outcome(lambda: zipccl.all_gather_into_tensor(out, x, table=table))  # type: ignore[arg-type]
    if case == "float_splits":
        rows = [3000.0, 3000.0] if bad else [3000, 3000]
        out = torch.empty_like(x)
        return _outcome(lambda: zipccl.all_to_all_single(out, x, rows, rows))  # type: ignore[arg-type]
    group = dist.new_group([0, 1])
    return _outcome(lambda: zipccl.broadcast(x, src=7 if bad else 0, group=group))


@pytest.mark.parametrize(
    ("case", "needle"),
    [
        ("table", "rank 1: table is neither a golden Codebook nor None"),
        ("float_splits", "rank 1: split sizes do not add up"),
        ("src", "rank 1: src is not a rank of the group"),
    ],
)
def test_a_bad_argument_on_one_rank_raises_on_every_rank(pair, case, needle) -> None:
    """In ``always`` and, on gloo, under the default settings (where the call may stay native)."""
    for env in ({"ZIPCCL_MODE": "always"}, {}):
        msgs = pair.run(sc_one_rank_bad_argument, case, env=env)
        assert all(m.startswith("CollectiveMismatchError") and needle in m for m in msgs), msgs


def sc_interrupted_decode(rank: int, world: int) -> str:
    """A KeyboardInterrupt in rank 1's decode still lets the call's collectives complete: rank
    1 raises it, rank 0 a PeerError naming it."""
    real = _slots.Unpack.__call__

    def interrupted(self, *args):  # type: ignore[no-untyped-def]
        if rank == 1:
            raise KeyboardInterrupt("injected")
        return real(self, *args)

    _slots.Unpack.__call__ = interrupted  # type: ignore[method-assign]
    try:
        x = torch.randn(20_000).to(torch.bfloat16)
        out = torch.empty(world * x.numel(), dtype=x.dtype)
        return _outcome(lambda: zipccl.all_gather_into_tensor(out, x))
    finally:
        _slots.Unpack.__call__ = real  # type: ignore[method-assign]


def test_an_interrupt_inside_a_call_reaches_every_rank(pair) -> None:
    msgs = pair.run(sc_interrupted_decode, env={"ZIPCCL_MODE": "always"})
    assert msgs[1] == "KeyboardInterrupt: injected", msgs
    assert msgs[0].startswith("PeerError") and "KeyboardInterrupt" in msgs[0], msgs


@pytest.mark.parametrize("claim", [1 << 40, 1 << 62, 6000 * 2 + 2, -2])
def test_a_byte_count_that_disagrees_with_the_fields_is_refused(claim: int) -> None:
    """A peer's descriptor is not trusted: its byte count must be its element count times the
    agreed dtype's size before any chunk is planned (a claim of 2^40 planned 268 M chunks)."""
    from zipccl.collectives import _agree

    world = 2
    rows = np.zeros((world, _agree._FIELDS + _agree._extra_fields(world)), dtype=np.int64)
    rows[:, 6], rows[:, _agree._FIELDS] = 12000, 6000
    _agree._check_sizes(rows, "all_gather", world, 2)  # honest rows pass
    rows[1, 6] = claim
    with pytest.raises(zipccl.CollectiveMismatchError, match="rank 1 reported"):
        _agree._check_sizes(rows, "all_gather", world, 2)
    a2a = np.zeros_like(rows)
    a2a[:, _agree._FIELDS : _agree._FIELDS + world] = 3  # 3 rows to each rank
    a2a[:, _agree._FIELDS + 2 * world] = 1000  # of 1000 values
    a2a[:, 6] = 6 * 1000 * 2
    _agree._check_sizes(a2a, "all_to_all", world, 2)
    a2a[0, 6] = claim
    with pytest.raises(zipccl.CollectiveMismatchError, match="rank 0 reported"):
        _agree._check_sizes(a2a, "all_to_all", world, 2)


def sc_destroyed_group_is_freed(rank: int, world: int) -> list[bool]:
    """zipccl's calls on a new gloo group in every mode (native, compressed, the switch), a
    repeat of each too (plans, routes, resolved groups, row rooms); then the group destroyed:
    whether nothing of zipccl's kept it alive."""
    import gc
    import os
    import weakref

    import torch.distributed as dist

    group = dist.new_group(backend="gloo")
    x = torch.randn(4096, generator=torch.Generator().manual_seed(rank)).to(torch.bfloat16)
    out = torch.empty(world * x.numel(), dtype=x.dtype)
    for mode in ("never", "always", "auto"):
        os.environ["ZIPCCL_MODE"] = mode
        for _ in range(2):
            zipccl.all_gather_into_tensor(out, x, group)
            zipccl.all_reduce(x.clone(), group=group)
            zipccl.all_to_all_single(torch.empty_like(x), x, group=group)
    freed = weakref.ref(group)
    dist.destroy_process_group(group)
    del group
    gc.collect()
    return [freed() is None]


def test_a_destroyed_group_is_freed(pair) -> None:
    """zipccl's caches hold groups weakly (zipccl._groups): a group the script destroys is freed,
    its gloo threads stopped, as without zipccl (held into interpreter shutdown, gloo can abort
    the process there: 'terminate called without an active exception')."""
    assert pair.run(sc_destroyed_group_is_freed) == [[True], [True]]
