"""A rank that fails inside a compressed collective makes every rank raise within seconds
(issue 18 item 2), on 2-3 gloo processes and through the ``zipccl`` backend.

Each scenario injects one fault on one rank -- a received piece corrupted in transit (its
header's CRC no longer matches), a decoder that rejects a payload, an encoder or a sample summary
that raises -- and every rank must raise at once: the rank that failed its own exception, every
other rank a PeerError naming it and what it reported, each well before the groups' own timeout
(GROUP_TIMEOUT_S, short here so that a rank left waiting fails the test instead of blocking CI).
The group must then still carry a normal call.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator

import pytest
import torch
import torch.distributed as dist
import zipccl
from zipccl import _plans, _torch, codec
from zipccl.collectives import _slots
from zipccl.golden.container import CRC_AT
from zipccl.golden.theory import SAMPLE_SIZE

from tests._collectives_cluster import Cluster, short_timeout_cluster
from tests.test_collectives import installed, lopsided

GROUP_TIMEOUT_S = 15
FAST_S = GROUP_TIMEOUT_S / 3  # every rank raises well before a waiting rank would time out
ALWAYS = {"ZIPCCL_MODE": "always"}
N = 6000  # BF16 values per rank: every piece takes the split layout (header, payload)


def _cluster(
    world: int, backend: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    yield from short_timeout_cluster(
        world, backend, str(tmp_path_factory.mktemp(backend)), GROUP_TIMEOUT_S
    )


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    yield from _cluster(2, "gloo", tmp_path_factory)


@pytest.fixture(scope="module")
def trio(tmp_path_factory):
    yield from _cluster(3, "gloo", tmp_path_factory)


@pytest.fixture(scope="module")
def zipccl_pair(tmp_path_factory):
    yield from _cluster(2, "zipccl", tmp_path_factory)


# --------------------------------------------------------------------------- faults


def _raising(exc: Exception) -> Callable[..., object]:
    def fail(*args: object, **kwargs: object) -> object:
        raise exc

    return fail


def _corrupting_unpack() -> Callable[..., object]:
    """_slots.Unpack.__call__ on a piece whose header lost a bit in transit."""
    real = _slots.Unpack.__call__

    def unpack(self: object, key: object, got: torch.Tensor, seg: object, *args: object) -> None:
        got[CRC_AT] ^= 1
        return real(self, key, got, seg, *args)

    return unpack


#  fault -> (module or class, attribute, replacement, (what the failing rank raises, what its
#  peers' PeerError says it reported))
FAULTS = {
    "corrupt_header": (
        _slots.Unpack,
        "__call__",
        _corrupting_unpack,
        ("ValueError", "corrupt compressed header", "ValueError: received a"),
    ),
    "decode": (
        _torch,
        "decode_into",
        lambda: _raising(ValueError("injected: payload rejected")),
        ("ValueError", "injected: payload rejected", "ValueError: injected"),
    ),
    "encode": (
        _torch,
        "encode_into",
        lambda: _raising(RuntimeError("injected encode failure")),
        ("RuntimeError", "injected encode failure", "RuntimeError: injected"),
    ),
    "summary": (
        codec,
        "sample_summary",
        lambda: _raising(RuntimeError("injected summary")),
        ("RuntimeError", "injected summary", "its sample summary or its packed pieces raised"),
    ),
}
SENDING = {"encode", "summary"}  # faults of the side that sends (a broadcast's source)


@contextlib.contextmanager
def injected(fault: str, here: bool) -> Iterator[None]:
    owner, name, make, _ = FAULTS[fault]
    real = getattr(owner, name)
    if here:
        setattr(owner, name, make())
    try:
        yield
    finally:
        setattr(owner, name, real)


# --------------------------------------------------------------------------- scenarios


def data(rank: int) -> torch.Tensor:
    return torch.randn(N, generator=torch.Generator().manual_seed(rank)).bfloat16()


def _call(lib: object, op: str, rank: int, world: int, src: int) -> None:
    """One compressed call of ``op`` through ``lib`` (zipccl, or torch.distributed on a zipccl
    group: the same signatures)."""
    x = data(rank)
    if op == "all_gather":
        lib.all_gather_into_tensor(torch.empty(world * N, dtype=x.dtype), x)
    elif op == "all_to_all":
        lib.all_to_all_single(torch.empty_like(x), x)
    elif op == "reduce_scatter":
        lib.reduce_scatter_tensor(torch.empty(N // world, dtype=x.dtype), x)
    elif op == "all_reduce":
        bucket = _BUCKET.setdefault(N, torch.empty(N, dtype=x.dtype))  # one buffer, as DDP's
        lib.all_reduce(bucket.copy_(x))
    elif op == "broadcast":
        lib.broadcast(x, src=src)
    else:
        raise ValueError(op)


_BUCKET: dict[int, torch.Tensor] = {}  # an all-reduce's plan is keyed by its buffer


def sc_fault(
    rank: int, world: int, op: str, fault: str, culprit: int, backend: bool, cached: bool = False
) -> dict[str, object]:
    """``op`` with ``fault`` on rank ``culprit`` -- in the call's first call, or with ``cached``
    in its second, which runs on the plan the first left (zipccl._plans) -- : what each rank
    raised and after how long, then whether a normal all-gather on the same group still gives
    every rank's data."""
    lib = dist if backend else zipccl
    src = culprit if fault in SENDING else (culprit + 1) % world
    _plans.forget()
    if cached:
        _call(lib, op, rank, world, src)

    def faulty() -> None:
        with injected(fault, rank == culprit):
            _call(lib, op, rank, world, src)

    return _outcome(faulty, rank, world, lib.all_gather_into_tensor)


def _outcome(
    call: Callable[[], object], rank: int, world: int, gather: Callable[..., object]
) -> dict[str, object]:
    """What ``call`` raised on this rank and after how long, then whether a plain all-gather
    (``gather``) on the same group still gives every rank's data."""
    start = time.monotonic()
    try:
        call()
        raised = message = None
    except Exception as exc:
        raised, message = type(exc).__name__, str(exc)
    seconds = time.monotonic() - start
    out = torch.empty(world * N, dtype=torch.bfloat16)
    gather(out, data(rank))
    after = torch.equal(
        out.view(torch.int16), torch.cat([data(r) for r in range(world)]).view(torch.int16)
    )
    return {"raised": raised, "message": message, "seconds": seconds, "after": after}


def check(results: list[dict[str, object]], fault: str, culprit: int, in_row: bool = False) -> None:
    """Every rank raised within FAST_S -- the culprit its own exception, the others a PeerError
    naming it and what it reported (``in_row``: a failure while filling its descriptor row) --
    and the group still works."""
    own_type, own_text, reported = FAULTS[fault][3]
    if in_row:
        reported = FAULTS["summary"][3][2]
    for rank, r in enumerate(results):
        assert r["seconds"] < FAST_S, (rank, results)
        if rank == culprit:
            assert r["raised"] == own_type and own_text in r["message"], (rank, results)
        else:
            assert r["raised"] == "PeerError", (rank, results)
            assert f"rank {culprit} failed" in r["message"] and reported in r["message"], r
        assert r["after"], (rank, results)


OPS = ["all_gather", "all_to_all", "reduce_scatter", "all_reduce", "broadcast"]


@pytest.mark.parametrize("fault", list(FAULTS))
@pytest.mark.parametrize("op", OPS)
def test_a_failure_on_one_rank_raises_on_every_rank(pair, op, fault):
    check(pair.run(sc_fault, op, fault, 1, False, env=ALWAYS), fault, 1)


@pytest.mark.parametrize("fault", sorted(set(FAULTS) - {"summary"}))  # a plan takes no sample
@pytest.mark.parametrize("op", OPS)
def test_a_failure_in_a_planned_call_raises_on_every_rank(pair, op, fault):
    """The same on a key's second call, whose pieces are sized by what its first measured or,
    packed (an all-gather, two ranks' all-reduce), encoded before its exchange: an encode that
    fails there is reported in the row, as a failed summary is."""
    packed = fault == "encode" and op in ("all_gather", "all_reduce")
    check(pair.run(sc_fault, op, fault, 1, False, True, env=ALWAYS), fault, 1, packed)


@pytest.mark.parametrize("fault", ["corrupt_header", "encode"])
@pytest.mark.parametrize("op", ["all_to_all", "reduce_scatter"])
def test_three_ranks(trio, op, fault):
    """Between three ranks the pieces travel by an all-to-all (two: an all-gather)."""
    check(trio.run(sc_fault, op, fault, 2, False, env=ALWAYS), fault, 2)


@pytest.mark.parametrize("fault", ["corrupt_header", "encode"])
@pytest.mark.parametrize("op", ["all_gather", "reduce_scatter"])
def test_through_the_zipccl_backend(zipccl_pair, op, fault):
    """torch.distributed's own calls on a ``zipccl`` group raise the same exceptions."""
    check(zipccl_pair.run(sc_fault, op, fault, 0, True, env=ALWAYS), fault, 0)


def sc_one_pair_overflows(rank: int, world: int) -> bool:
    """Only rank 0's piece for rank 1 outgrows its room (:func:`lopsided` values there, tame
    ones elsewhere): the raw resend is an all-to-all of the whole group, rank 2 included,
    though it neither sent nor received an overflowed piece."""
    numel = 2 * world * SAMPLE_SIZE
    x = torch.randn(numel, generator=torch.Generator().manual_seed(rank)).bfloat16()
    if rank == 0:
        share = numel // world
        x[share : 2 * share] = lopsided(7, numel)[share : 2 * share]
    got, want = torch.empty_like(x), torch.empty_like(x)
    zipccl.all_to_all_single(got, x)
    dist.all_to_all_single(want, x)
    return torch.equal(got.view(torch.int16), want.view(torch.int16))


def test_a_resend_between_two_ranks_reaches_every_rank(trio):
    env = {**ALWAYS, "ZIPCCL_CHUNK_BYTES": str(1 << 20)}
    assert trio.run(sc_one_pair_overflows, env=env) == [True] * 3


# --------------------------------------------------------------------------- mismatched calls


def _mismatched(case: str, rank: int, world: int) -> None:
    """Rank 1 calls differently from the others, in ways where one side's call may go native
    while the other's compresses (issue 37 item 1)."""
    odd = rank == 1
    if case == "int32_vs_fp32":  # same bytes: int32 is never compressed, fp32 is
        x = torch.ones(N, dtype=torch.float32 if odd else torch.int32)
        zipccl.all_gather_into_tensor(torch.empty(world * N, dtype=x.dtype), x)
    elif case == "empty_vs_full":
        x = data(rank)[: N if odd else 0]
        zipccl.all_gather_into_tensor(torch.empty(world * x.numel(), dtype=x.dtype), x)
    elif case in ("premul_sum", "band"):  # native-only reduce ops against SUM
        other = dist.ReduceOp.PREMUL_SUM if case == "premul_sum" else dist.ReduceOp.BAND
        zipccl.all_reduce(data(rank).float(), op=dist.ReduceOp.SUM if odd else other)
    elif case == "band_vs_bor":
        ops = (dist.ReduceOp.BAND, dist.ReduceOp.BOR)
        zipccl.all_reduce(torch.ones(N, dtype=torch.int32), op=ops[odd])
    elif case == "list_entry_shape":
        x = data(rank)
        outs = [torch.empty_like(x) for _ in range(world)]
        if odd:
            outs[0] = torch.empty(N // 2, 2, dtype=x.dtype)
        zipccl.all_gather(outs, x)
    elif case == "all_reduce_numel":
        zipccl.all_reduce(torch.ones(2000 if odd else 1000))
    else:
        raise ValueError(case)


def sc_mismatched(rank: int, world: int, case: str, profile: str | None) -> dict[str, object]:
    """What each rank raised for a mismatched call and after how long, and whether the group
    then still carries a plain torch all-gather."""
    _plans.forget()

    def mismatched() -> None:
        with installed(profile):
            _mismatched(case, rank, world)

    return _outcome(mismatched, rank, world, dist.all_gather_into_tensor)


MISMATCHES = {
    "int32_vs_fp32": "disagree on the dtype (rank 0: int32, rank 1: float32",
    "empty_vs_full": "disagree on the input numel (rank 0: 0, rank 1: 6000",
    "premul_sum": "disagree on the reduce op (rank 0: PREMUL_SUM, rank 1: SUM",
    "band": "disagree on the reduce op (rank 0: BAND, rank 1: SUM",
    "band_vs_bor": "disagree on the reduce op (rank 0: BAND, rank 1: BOR",
    "list_entry_shape": "rank 1: an entry of the output list differs from the input",
    "all_reduce_numel": "disagree on the tensor numel (rank 0: 1000, rank 1: 2000",
}


@pytest.mark.parametrize(
    ("env", "profile"),
    [(ALWAYS, None), ({"ZIPCCL_MODE": "auto"}, "native"), ({"ZIPCCL_MODE": "auto"}, None)],
    ids=["always", "auto_native", "auto_unprofiled"],
)
@pytest.mark.parametrize("case", list(MISMATCHES))
def test_a_mismatched_call_raises_on_every_rank_by_default(pair, trio, case, env, profile):
    """Under the default ZIPCCL_VERIFY, every rank raises the same CollectiveMismatchError at
    once -- also where one rank's call would go native and another's compress (gloo crashed or
    returned wrong data), or both native (gloo aborted on sizes that differ) -- and the group
    still works. ``auto_unprofiled``: no profile yet, whose loading (a collective) must not
    precede the agreement."""
    for ranks in (pair, trio) if case == "int32_vs_fp32" else (pair,):
        results = ranks.run(sc_mismatched, case, profile, env=env)
        for rank, r in enumerate(results):
            assert r["seconds"] < FAST_S, (rank, results)
            assert r["raised"] == "CollectiveMismatchError", (rank, results)
            assert MISMATCHES[case] in str(r["message"]), (rank, results)
            assert r["after"], (rank, results)


@pytest.fixture
def doomed_pair(tmp_path_factory):
    """Two workers of which a test may end one."""
    yield from _cluster(2, "gloo", tmp_path_factory)


def sc_first_call_after_a_peer_left(rank: int, world: int) -> dict[str, object]:
    """Rank 1 ends its process just after a new group is made; rank 0 then makes the group's
    first zipccl call: what it raised and after how long."""
    group = dist.new_group(list(range(world)))
    if rank == 1:
        threading.Timer(1.0, os._exit, (0,)).start()  # once this result is on its way
        return {}
    time.sleep(3.0)
    start = time.monotonic()
    try:
        out = torch.empty(world * N, dtype=torch.bfloat16)
        zipccl.all_gather_into_tensor(out, data(rank), group=group)
        raised = None
    except Exception as exc:
        raised = type(exc).__name__
    return {"raised": raised, "seconds": time.monotonic() - start}


def test_a_peer_gone_before_a_groups_first_call_fails_it_at_once(doomed_pair):
    """The group's settings agreement runs on the group (gloo notices the closed connection)
    instead of waiting in its store for the group's timeout (issue 37 item 3)."""
    result = doomed_pair.run(sc_first_call_after_a_peer_left, env=ALWAYS)[0]
    assert result["raised"] is not None and result["seconds"] < FAST_S, result
