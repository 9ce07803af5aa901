"""zipccl._lanes on host tensors: calls handed out round robin, run concurrently on their own
gloo groups, their results and errors delivered through the Work; and the ``zipccl`` backend's
calls on lanes, installed here on its host tensors (it makes them for CUDA tensors on the staged
transport: tests/test_backend_gpu_staged.py runs the same scenarios there)."""

from __future__ import annotations

import threading

import pytest
import torch
import torch.distributed as dist
from zipccl import settings
from zipccl._lanes import Lanes

from tests import _lane_scenarios as scenarios
from tests import test_backend
from tests._collectives_cluster import module_cluster

pair = module_cluster(2)
LANES = 3


def _lanes() -> Lanes:
    return Lanes([dist.new_group(backend="gloo") for _ in range(LANES)], torch.device("cpu"))


def sc_round_robin(rank: int, world: int, calls: int) -> dict[str, object]:
    """Every call issued before any is waited for: call i runs on lane i mod LANES, in order
    within its lane, and sums what every rank gave it."""
    lanes = _lanes()
    seen: list[tuple[int, str]] = []
    ts = [torch.full((1000,), float(i + rank)) for i in range(calls)]

    def call(i: int):
        def run(group: dist.ProcessGroup) -> None:
            seen.append((i, threading.current_thread().name))
            dist.all_reduce(ts[i], group=group)

        return run

    works = [lanes.submit(call(i), [ts[i]], [ts[i]]) for i in range(calls)]
    results = [w.get_future().wait() for w in works]
    names = dict(seen)
    lanes.close()
    return {
        "sums": all(bool((t == 2 * i + 1).all()) for i, t in enumerate(ts)),
        "results": all(r[0] is t for r, t in zip(results, ts, strict=True)),
        "lanes": all(names[i] == f"zipccl-lane-{i % LANES}" for i in range(calls)),
        "in_order": all(
            [i for i, name in seen if name == f"zipccl-lane-{k}"] == list(range(k, calls, LANES))
            for k in range(LANES)
        ),
        "success": all(w.is_completed() and w.is_success() for w in works),
    }


def test_calls_round_robin_exact(pair):
    for found in pair.run(sc_round_robin, 8):
        assert all(found.values()), found  # type: ignore[union-attr]


def _every_lane_serves_a_call(lanes: Lanes, world: int) -> bool:
    """One all-reduce on every lane (a failed lane's too), then the lanes closed: whether each
    summed every rank's ones."""
    t = torch.ones(10)

    def add(group: dist.ProcessGroup) -> None:
        dist.all_reduce(t, group=group)

    for _ in range(LANES):
        lanes.submit(add, [t], [t]).wait()
    lanes.close()
    return bool((t == world**LANES).all())


def sc_error_reaches_the_waiter(rank: int, world: int) -> tuple[str, bool, bool]:
    """A call that raises: wait() raises it, the Work reports no success, and its lane goes on
    to the next call."""
    lanes = _lanes()

    def fail(group: dist.ProcessGroup) -> None:
        raise ValueError(f"lane call failed on rank {rank}")

    work = lanes.submit(fail, [], [])
    try:
        work.wait()
        error = "no error"
    except ValueError as exc:
        error = str(exc)
    failed = work.is_completed() and not work.is_success()
    return error, failed, _every_lane_serves_a_call(lanes, world)


def test_error_reaches_the_waiter(pair):
    for rank, (error, failed, after) in enumerate(pair.run(sc_error_reaches_the_waiter)):
        assert error == f"lane call failed on rank {rank}"
        assert failed and after


def sc_close_joins(rank: int, world: int) -> bool:
    lanes = _lanes()
    before = {t.name for t in threading.enumerate()}
    lanes.close()
    after = {t.name for t in threading.enumerate()}
    started = {f"zipccl-lane-{k}" for k in range(LANES)}
    return started <= before and not started & after


def sc_base_exception_reaches_the_waiter(rank: int, world: int) -> tuple[str, bool]:
    """A call that raises SystemExit: the waiter gets a RuntimeError naming it, the lane lives."""
    lanes = _lanes()

    def leave(group: dist.ProcessGroup) -> None:
        raise SystemExit(3)

    try:
        lanes.submit(leave, [], []).wait()
        error = "no error"
    except RuntimeError as exc:
        error = str(exc)
    return error, _every_lane_serves_a_call(lanes, world)


def test_base_exception_reaches_the_waiter(pair):
    for error, after in pair.run(sc_base_exception_reaches_the_waiter):
        assert error == "zipccl lane: the call raised SystemExit(3)"
        assert after


def test_close_stops_and_joins_every_lane(pair):
    assert pair.run(sc_close_joins) == [True, True]


def test_no_lanes_is_an_error():
    with pytest.raises(ValueError, match="at least one lane"):
        Lanes([], torch.device("cpu"))


zipccl_pair = test_backend.pair  # 2 ranks on a zipccl default group


def sc_host_lanes(rank: int, world: int, count: int) -> int:
    """Give the zipccl default group ``count`` lanes for host tensors (0: take them away)."""
    pg = dist.group.WORLD
    if pg._lanes is not None:
        pg._lanes.close()
        pg._lanes = None
    if count:
        groups = [dist.new_group(backend="gloo") for _ in range(count)]
        for g in groups:
            settings.mark_agreed(g)
        pg._lanes = Lanes(groups, torch.device("cpu"))
    return pg.lanes


@pytest.fixture(scope="module")
def on_lanes(zipccl_pair):
    assert zipccl_pair.run(sc_host_lanes, LANES) == [LANES, LANES]
    yield zipccl_pair
    assert zipccl_pair.run(sc_host_lanes, 0) == [0, 0]


@pytest.mark.parametrize("mode", ["auto", "always"])
def test_backend_buckets_in_flight_are_exact(on_lanes, mode):
    for found in on_lanes.run(scenarios.sc_buckets_in_flight, "cpu", env={"ZIPCCL_MODE": mode}):
        assert found == {"lanes": LANES, "works": {"LaneWork"}, "exact": True}, found


@pytest.mark.parametrize("mode", ["auto", "always"])
def test_backend_every_op_in_flight_is_exact(on_lanes, mode):
    for found in on_lanes.run(scenarios.sc_every_op_in_flight, "cpu", env={"ZIPCCL_MODE": mode}):
        assert all(found.values()), found  # type: ignore[union-attr]


def test_backend_mismatch_on_a_lane_raises_on_every_rank(on_lanes):
    env = test_backend.ALWAYS
    for error, recovered in on_lanes.run(scenarios.sc_mismatch_on_a_lane, "cpu", env=env):
        assert scenarios.MISMATCH in error, error
        assert recovered
