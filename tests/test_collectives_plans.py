"""Planned calls on 2-3 gloo processes (issue 15): a key's later calls run on the plan its first
call left (zipccl._plans).

Their descriptor exchange carries the plan's tag instead of a sample summary -- no summary, no
theory table, no prediction -- and their pieces are sized by the payloads the previous call
measured. They must stay bit-exact (reductions: the rank-order reference), a payload that
outgrows its measured room must still arrive through the raw resend, and a rank whose call no
longer fits the plan must make every rank raise CollectiveMismatchError within seconds (where
the calls still fit together -- one rank lost its plans -- the ranks exchange afresh instead).
The groups time out after GROUP_TIMEOUT_S, so a rank left waiting fails the test.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from collections.abc import Callable, Iterator

import pytest
import torch
import torch.distributed as dist
import zipccl
from zipccl import _groups, _plans, codec, settings
from zipccl.collectives import STATS, _exchange, _protocols, _slots

from tests._collectives_cluster import Cluster, short_timeout_cluster
from tests.test_collectives import same_bits, same_reduction

GROUP_TIMEOUT_S = 15
FAST_S = GROUP_TIMEOUT_S / 3
ALWAYS = {"ZIPCCL_MODE": "always"}
OPS = ["all_gather", "all_to_all", "reduce_scatter", "all_reduce", "broadcast"]
DTYPES = [torch.bfloat16, torch.float8_e4m3fn]
PER_RANK = 16384  # values per rank and rank of the group: pieces large enough for the split layout
ROW = 8192  # all-to-all: rank i sends (i + j) % 3 + 1 rows of ROW values to rank j


def _cluster(world: int, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    yield from short_timeout_cluster(
        world, "gloo", str(tmp_path_factory.mktemp("plans")), GROUP_TIMEOUT_S
    )


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    yield from _cluster(2, tmp_path_factory)


@pytest.fixture(scope="module")
def trio(tmp_path_factory):
    yield from _cluster(3, tmp_path_factory)


# --------------------------------------------------------------------------- calls


def values(kind: str, rank: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
    """Rank ``rank``'s data of one ``kind``: "zeros", "bits" (uniform random bit patterns, NaNs
    included: nothing compresses them) or any other name, N(0, 1) seeded by the name."""
    if kind == "zeros":
        return torch.zeros(numel, dtype=dtype)
    gen = torch.Generator().manual_seed(int.from_bytes(kind.encode(), "little") * 31 + rank)
    if kind == "bits":
        raw = torch.randint(0, 256, (numel * dtype.itemsize,), dtype=torch.uint8, generator=gen)
        return raw.view(dtype)
    return torch.randn(numel, generator=gen).clamp(-448, 448).to(dtype)


def _splits(rank: int, world: int) -> list[int]:
    return [(rank + j) % 3 + 1 for j in range(world)]


_BUCKETS: dict[tuple[int, torch.dtype], torch.Tensor] = {}


def bucket(n: int, dtype: torch.dtype) -> torch.Tensor:
    """This process's one buffer of ``n`` values of ``dtype``, reused by every call."""
    return _BUCKETS.setdefault((n, dtype), torch.empty(n, dtype=dtype))


def call(
    op: str, rank: int, world: int, dtype: torch.dtype, kind: str, lib: object = zipccl
) -> tuple[torch.Tensor, torch.Tensor]:
    """One call of ``op`` through ``lib`` on ``kind`` data: (its result, the expected one,
    computed from every rank's data)."""
    n = world * PER_RANK

    def data(r: int) -> torch.Tensor:
        return values(kind, r, n, dtype)

    if op == "all_gather":
        got = torch.empty(world * n, dtype=dtype)
        lib.all_gather_into_tensor(got, data(rank))
        return got, torch.cat([data(r) for r in range(world)])
    if op == "broadcast":
        got = data(rank)
        lib.broadcast(got, src=0)
        return got, data(0)
    if op == "reduce_scatter":
        got = torch.empty(n // world, dtype=dtype)
        lib.reduce_scatter_tensor(got, data(rank))
        return got, zipccl.reference_reduce([data(r).view(world, -1)[rank] for r in range(world)])
    if op == "all_reduce":
        got = bucket(n, dtype)  # one buffer per call site, as DDP's buckets: the plan's key
        got.copy_(data(rank))
        lib.all_reduce(got)
        return got, zipccl.reference_reduce([data(r) for r in range(world)])
    rows = [_splits(r, world) for r in range(world)]  # rows[i][j]: i -> j

    def a2a_data(r: int) -> torch.Tensor:
        return values(kind, r, sum(rows[r]) * ROW, dtype).view(-1, ROW)

    outs = [rows[i][rank] for i in range(world)]
    got = torch.empty(sum(outs), ROW, dtype=dtype)
    lib.all_to_all_single(got, a2a_data(rank), outs, rows[rank])
    want = torch.cat(
        [a2a_data(i)[sum(rows[i][:rank]) : sum(rows[i][: rank + 1])] for i in range(world)]
    )
    return got, want


COUNTED = {  # what a call's counts count: the functions it calls
    "exchanges": [(_exchange, "exchange")],
    "summaries": [(codec, "sample_summary")],
    "tables": [(codec, "summary_table")],
    "resends": [(_protocols, "resend"), (_protocols, "resend_pairs")],
    "packed": [(_slots.Packed, "fill")],
}


@contextlib.contextmanager
def counting() -> Iterator[dict[str, int]]:
    """How often each COUNTED entry's functions are called inside the block."""
    counts = dict.fromkeys(COUNTED, 0)
    saved = [
        (name, owner, attr, getattr(owner, attr))
        for name, targets in COUNTED.items()
        for owner, attr in targets
    ]

    def counted(name: str, fn: Callable) -> Callable:
        def run(*args: object, **kwargs: object) -> object:
            counts[name] += 1
            return fn(*args, **kwargs)

        return run

    for name, owner, attr, fn in saved:
        setattr(owner, attr, counted(name, fn))
    try:
        yield counts
    finally:
        for _, owner, attr, fn in saved:
            setattr(owner, attr, fn)


def sc_calls(
    rank: int, world: int, op: str, dtype: torch.dtype, kinds: list[str]
) -> list[dict[str, object]]:
    """Calls of one key from no plans, the c-th on ``kinds[c]`` data: per call whether it is
    exact, a digest of its result, what it counted, its strategy and the bytes it sent."""
    _plans.forget()
    out = []
    for kind in kinds:
        STATS.reset()
        with counting() as counts:
            got, want = call(op, rank, world, dtype, kind)
        same = same_reduction if op in ("reduce_scatter", "all_reduce") else same_bits
        out.append(
            {
                "exact": same(got, want),
                "digest": hashlib.sha1(
                    got.contiguous().view(torch.uint8).numpy().tobytes()
                ).hexdigest(),
                **counts,
                "strategy": STATS.strategy,
                "sent": STATS.sent,
            }
        )
    return out


# --------------------------------------------------------------------------- steady state


def first_call_counts(op: str, rank: int, world: int) -> dict[str, int]:
    """A key's first call: one exchange of every rank's summary (a broadcast: the source's) and
    a table per rank -- an all-reduce of more than two ranks twice, its all-gather half
    exchanging the reduced shards' summaries (two ranks gather the whole tensors)."""
    halves = 2 if op == "all_reduce" and world > 2 else 1
    summaries = int(rank == 0) if op == "broadcast" else halves
    return {"exchanges": halves, "summaries": summaries, "tables": halves * world}


PLANNED = {"exchanges": 1, "summaries": 0, "tables": 0, "resends": 0, "packed": 0}


def packs(op: str, world: int) -> bool:
    """Whether a planned call of ``op`` on gloo is packed (_slots.Packed): an all-gather, and
    an all-reduce of two ranks (one all-gather of the whole tensors)."""
    return op == "all_gather" or (op == "all_reduce" and world == 2)


def planned_counts(op: str, world: int) -> dict[str, int]:
    """A planned call: one exchange (the tag); a packed one also its own summary and every
    rank's table from the summaries the exchange carried (its own twice: before and after)."""
    if not packs(op, world):
        return PLANNED
    return {**PLANNED, "summaries": 1, "tables": 1 + world, "packed": 1}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op", OPS)
def test_planned_calls_are_exact_and_run_on_the_plan(pair, op, dtype):
    """The second and third calls of a key exchange the descriptor once -- its tag, no summary
    unless packed --, stay exact and compressed, and the third, on the first one's data, gives
    the first one's bits."""
    for rank, calls in enumerate(pair.run(sc_calls, op, dtype, ["a", "b", "a"], env=ALWAYS)):
        first, *planned = calls
        assert all(c["exact"] and c["strategy"] == "compressed" for c in calls), calls
        want = first_call_counts(op, rank, 2)
        assert {k: first[k] for k in want} == want, calls
        for c in planned:
            assert {k: c[k] for k in PLANNED} == planned_counts(op, 2), calls
        assert calls[2]["digest"] == first["digest"], calls
        assert all(c["sent"] <= first["sent"] for c in planned), calls  # no wider


@pytest.mark.parametrize("op", ["all_to_all", "reduce_scatter", "all_reduce"])
def test_planned_calls_three_ranks(trio, op):
    """Between three ranks an all-to-all's pieces travel by all_to_all_single, each one's width
    computed by its two ends alone from the header both read."""
    for calls in trio.run(sc_calls, op, torch.bfloat16, ["a", "b", "a"], env=ALWAYS):
        assert all(c["exact"] for c in calls), calls
        for c in calls[1:]:
            assert {k: c[k] for k in PLANNED} == planned_counts(op, 3), calls


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op", [op for op in OPS if not packs(op, 2)])
def test_overflow_on_a_plan_is_resent_raw_and_drops_the_plan(pair, op, dtype):
    """N(0, 1), N(0, 1) of another seed, random bits, the first again: the third call's
    payloads outgrow the room the plan measured and go again raw (the dynamic phase after the
    main collective); its plan's tables no longer fit the data, so the fourth call agrees
    afresh -- a fresh sample, new tables -- and sends what the first one sent, bit for bit
    alike. Every call is exact."""
    kinds = ["a", "b", "bits", "a"]
    for rank, calls in enumerate(pair.run(sc_calls, op, dtype, kinds, env=ALWAYS)):
        assert all(c["exact"] for c in calls), calls
        assert calls[2]["resends"] >= 1 and calls[2]["summaries"] == 0, calls
        want = first_call_counts(op, rank, 2)
        assert {k: calls[3][k] for k in want} == want and calls[3]["resends"] == 0, calls
        assert calls[3]["sent"] == calls[0]["sent"], calls
        assert calls[3]["digest"] == calls[0]["digest"], calls


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op", [op for op in OPS if packs(op, 2)])
def test_a_packed_call_never_overflows(pair, op, dtype):
    """N(0, 1), N(0, 1) of another seed, random bits, the first again, on one plan: a packed
    call codes each with tables from its own sample and sends each piece in exactly its width
    -- random bits travel raw, nothing goes again -- and the plan serves every call, exact."""
    kinds = ["a", "b", "bits", "a"]
    for calls in pair.run(sc_calls, op, dtype, kinds, env=ALWAYS):
        assert all(c["exact"] for c in calls), calls
        assert [c["packed"] for c in calls] == [0, 1, 1, 1], calls
        assert all(c["resends"] == 0 for c in calls), calls
        assert calls[3]["digest"] == calls[0]["digest"], calls
        assert calls[3]["sent"] <= calls[0]["sent"] < calls[2]["sent"], calls


def sc_buckets(rank: int, world: int) -> list[dict[str, int]]:
    """DDP's pattern: two gradient buckets of one size, in their own buffers, whose values lie
    2^20 apart, all-reduced in turn, twice; what each call counted."""
    scales = [1.0, 2.0**-20]
    buckets = [torch.empty(world * PER_RANK, dtype=torch.bfloat16) for _ in scales]
    _plans.forget()
    out = []
    for _ in range(2):
        for b, scale in zip(buckets, scales, strict=True):
            b.copy_(values("a", rank, b.numel(), torch.float32) * scale)
            with counting() as counts:
                zipccl.all_reduce(b)
            out.append(counts)
    return out


def test_buffers_of_one_size_keep_their_own_plans(trio):
    """Each buffer an all-reduce runs in keys its own plan: the second round of calls runs on
    them (no summary) and no piece outgrows its room, where one shared plan would code one
    bucket's values with the other's tables and resend them raw (three ranks: an all-reduce of
    two halves, not packed)."""
    for calls in trio.run(sc_buckets, env=ALWAYS):
        assert [c["summaries"] for c in calls] == [2, 2, 0, 0], calls
        assert all(c["resends"] == 0 for c in calls), calls


def test_three_ranks_overflow(trio):
    for calls in trio.run(
        sc_calls, "all_to_all", torch.bfloat16, ["zeros", "bits", "a"], env=ALWAYS
    ):
        assert all(c["exact"] for c in calls) and calls[1]["resends"] == 1, calls


# --------------------------------------------------------------------------- mismatches

#  case -> (what ranks other than 1 call, what rank 1 calls, text every rank's error contains);
#  a call is (op, dtype, reduce op); every rank first makes both calls twice, so both are
#  planned everywhere (rank 1's "numel" call alone is new)
MISMATCHES = {
    "dtype": (("all_gather", torch.bfloat16), ("all_gather", torch.float16), "the dtype"),
    "op": (
        ("all_gather", torch.bfloat16),
        ("all_reduce", torch.bfloat16),
        "ranks called different collectives",
    ),
    "numel": (
        ("all_gather", torch.bfloat16),
        ("all_gather_long", torch.bfloat16),
        "the input numel",
    ),
    "splits": (
        ("all_to_all", torch.bfloat16),
        ("all_to_all_shifted", torch.bfloat16),
        "mismatched pairs",
    ),
    "reduce_op": (
        ("all_reduce", torch.bfloat16),
        ("all_reduce_max", torch.bfloat16),
        "the reduce op",
    ),
}


def _odd_call(name: str, rank: int, world: int, dtype: torch.dtype) -> None:
    """The calls MISMATCHES names beyond :func:`call`'s ops."""
    x = values("a", rank, world * PER_RANK, dtype)
    if name == "all_gather_long":
        zipccl.all_gather_into_tensor(
            torch.empty(world * (x.numel() + 8), dtype=dtype), torch.cat([x, x[:8]])
        )
    elif name == "all_reduce_max":
        zipccl.all_reduce(x, op=dist.ReduceOp.MAX)
    elif name == "all_to_all_shifted":  # every rank sends one row more to rank 0, one less to 1
        rows = [_splits(r, world) for r in range(world)]
        for split in rows:
            split[0], split[1] = split[0] + 1, split[1] - 1
        ins, outs = rows[rank], [rows[i][rank] for i in range(world)]
        x = values("a", rank, sum(ins) * ROW, dtype).view(-1, ROW)
        zipccl.all_to_all_single(torch.empty(sum(outs), ROW, dtype=dtype), x, outs, ins)
    else:
        call(name, rank, world, dtype, "a")


def sc_mismatch(rank: int, world: int, case: str) -> dict[str, object]:
    """After both calls of ``case`` are planned, rank 1 makes the odd one while the others repeat
    theirs: what each rank raised and how fast; then whether the others' call still runs, exact
    and on its plan (:func:`planned_counts`)."""
    (op, dtype), (odd, odd_dtype), _ = MISMATCHES[case]
    _plans.forget()
    for _ in range(2):
        call(op, rank, world, dtype, "a")
        if case != "numel":
            _odd_call(odd, rank, world, odd_dtype)
    start = time.monotonic()
    try:
        if rank == 1:
            _odd_call(odd, rank, world, odd_dtype)
        else:
            call(op, rank, world, dtype, "a")
        raised = message = None
    except Exception as exc:
        raised, message = type(exc).__name__, str(exc)
    seconds = time.monotonic() - start
    with counting() as counts:
        got, want = call(op, rank, world, dtype, "b")
    same = same_reduction if op == "all_reduce" else same_bits
    return {
        "raised": raised,
        "message": message,
        "seconds": seconds,
        "after": same(got, want) and {k: counts[k] for k in PLANNED} == planned_counts(op, world),
    }


@pytest.mark.parametrize("case", list(MISMATCHES))
def test_mismatch_after_a_plan_raises_on_every_rank(pair, trio, case):
    """Whether rank 1's call is planned too (another tag) or new (a summary where the others
    send a tag), every rank raises the exchange's CollectiveMismatchError at once; the plans
    survive, and the next matching call runs on them."""
    needle = MISMATCHES[case][2]
    for ranks in (pair, trio):
        for rank, r in enumerate(ranks.run(sc_mismatch, case, env=ALWAYS)):
            assert r["raised"] == "CollectiveMismatchError" and needle in r["message"], (rank, r)
            assert r["seconds"] < FAST_S and r["after"], (rank, r)


def sc_lost_plans(rank: int, world: int, loser: int) -> list[dict[str, object]]:
    """Rank ``loser`` forgets its plans between a key's first and second calls."""
    _plans.forget()
    out = []
    for c, kind in enumerate(["a", "b", "c"]):
        if c == 1 and rank == loser:
            _plans.forget()
        with counting() as counts:
            got, want = call("reduce_scatter", rank, world, torch.bfloat16, kind)
        out.append({"exact": same_reduction(got, want), **counts})
    return out


def test_a_rank_without_the_plan_makes_every_rank_exchange_afresh(pair, trio):
    """Calls that still fit together need no error: the ranks whose tags differ from the others'
    all exchange once more, with summaries (the rank without the plan sent its summary in the
    first exchange too), and agree on a new plan, which the next call runs on."""
    for ranks in (pair, trio):
        for rank, calls in enumerate(ranks.run(sc_lost_plans, 1, env=ALWAYS)):
            assert all(c["exact"] for c in calls), calls
            assert [c["exchanges"] for c in calls] == [1, 2, 1], calls
            assert [c["summaries"] for c in calls] == [1, 1 + (rank == 1), 0], calls


# --------------------------------------------------------------------------- the setting


@pytest.mark.parametrize(
    ("calls", "summaries"), [("0", [1, 1, 1, 1]), ("2", [1, 0, 1, 0]), ("", [1, 0, 0, 0])]
)
def test_plan_calls_setting(pair, calls, summaries):
    """ZIPCCL_PLAN_CALLS: how many calls a plan serves before its key is agreed afresh (a fresh
    sample, new tables); 0 turns plans off."""
    env = {**ALWAYS, "ZIPCCL_PLAN_CALLS": calls}
    kinds = ["a", "b", "c", "d"]
    for got in pair.run(sc_calls, "reduce_scatter", torch.bfloat16, kinds, env=env):
        assert [c["summaries"] for c in got] == summaries and all(c["exact"] for c in got), got


def test_plan_calls_parsing(monkeypatch):
    for raw, want in [("", 64), ("0", 0), (" 7 ", 7)]:
        monkeypatch.setenv("ZIPCCL_PLAN_CALLS", raw)
        assert settings.value("ZIPCCL_PLAN_CALLS") == want
    for raw in ("-1", "x", "1.5"):
        monkeypatch.setenv("ZIPCCL_PLAN_CALLS", raw)
        with pytest.raises(ValueError, match="ZIPCCL_PLAN_CALLS"):
            settings.value("ZIPCCL_PLAN_CALLS")


def test_plan_tags_follow_the_plans_state(monkeypatch):
    """A plan's tag is the same for the same exchange and uses, and changes with either; a plan
    is dropped once it has served ZIPCCL_PLAN_CALLS calls; forgetting the plans keeps the
    group's exchange count, which every rank shares whatever its plans."""
    monkeypatch.setenv("ZIPCCL_PLAN_CALLS", "2")
    group, key = _groups.GroupKey(), ("all_gather", 1)
    first = _plans.Ticket(group, key, digest=_plans.digest(_plans.exchanged(group), b"rows"))
    _plans.keep(first, "outcome")
    plan = _plans.find(group, key)
    assert plan is not None and plan.uses == 1 and plan.agreed == "outcome" and plan.tag
    again = _plans.Plan(key, _plans.digest(1, b"rows"), 1, "other")
    assert again.tag == plan.tag
    assert _plans.Plan(key, _plans.digest(2, b"rows"), 1, "outcome").tag != plan.tag
    _plans.keep(_plans.Ticket(group, key, previous=plan), "next")
    assert _plans.find(group, key) is None  # served its two calls
    _plans.keep(first, "outcome")
    _plans.forget()
    assert _plans.find(group, key) is None and _plans.exchanged(group) == 2


def test_a_plan_sizes_each_piece_by_the_largest_payload_it_measured() -> None:
    """A piece's payload varies from call to call (a sparse gradient's zeros); sizing the next
    call by the last one alone would overflow, and resend raw, whenever it grew again."""
    planned = _slots.Agreed(None, "all_gather", "compressed", None, 1, sizes={"x": 100, "y": 50})  # type: ignore[arg-type]
    after = planned.measured(_slots.Measured({"x": 80, "y": 70, "z": 5}, False))
    assert after.sizes == {"x": 100, "y": 70, "z": 5} and not after.overflowed
    assert planned.measured(_slots.Measured({"x": 1}, True)).overflowed
