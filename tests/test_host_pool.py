"""zipccl.offload._host_pool: the offload's compact host memory (CPU slabs stand in for
pinned ones)."""

from __future__ import annotations

import random

import pytest
from zipccl.offload._host_pool import ALIGN, HostPool, HostRange


class FakeEvent:
    """A device event whose completion the test decides."""

    def __init__(self) -> None:
        self.done = False

    def query(self) -> bool:
        return self.done


def fill(span: HostRange, tag: int) -> None:
    span.view.fill_(tag)


def holds(span: HostRange, tag: int) -> bool:
    return bool((span.view == tag).all())


@pytest.mark.parametrize("seed", range(4))
def test_ranges_never_overlap_and_every_byte_comes_back(seed: int) -> None:
    """Random allocations, trims and frees (seeded): every live range keeps the bytes written
    to it, ranges start aligned, and once all are freed nothing is in use and every slab goes."""
    pool, rng = HostPool(pinned=False, slab_bytes=1 << 16), random.Random(seed)
    live: list[tuple[HostRange, int]] = []
    for step in range(1500):
        roll = rng.random()
        if live and roll < 0.4:
            pool.free(live.pop(rng.randrange(len(live)))[0])
        elif live and roll < 0.55:
            i = rng.randrange(len(live))
            span, tag = live[i]
            live[i] = (pool.trim(span, rng.randint(1, span.view.numel())), tag)
        else:
            span, tag = pool.alloc(rng.randint(1, 40_000)), step % 251
            fill(span, tag)
            live.append((span, tag))
        assert all(span.start % ALIGN == 0 and holds(span, tag) for span, tag in live)
    for span, _ in live:
        pool.free(span)
    assert pool.stats()[0] == 0
    pool.empty_cache()
    assert pool.stats() == (0, 0)


def test_a_range_is_reused_only_after_its_events() -> None:
    pool = HostPool(pinned=False, slab_bytes=4096)
    first = pool.alloc(4096)
    copied = FakeEvent()
    pool.free(first, [copied])
    second = pool.alloc(4096)  # the first range's copy is still in flight: a new slab
    assert second.slab != first.slab
    copied.done = True
    third = pool.alloc(4096)
    assert (third.slab, third.start) == (first.slab, first.start)


def test_a_trim_keeps_the_head_and_gives_back_the_rest_after_its_events() -> None:
    pool = HostPool(pinned=False, slab_bytes=1 << 14)
    span = pool.alloc(10_000)
    fill(span, 7)
    copied = FakeEvent()
    kept = pool.trim(span, 3000, [copied])
    assert kept.start == span.start and kept.view.numel() == 3000 and holds(kept, 7)
    assert pool.stats()[0] == span.length  # the tail is awaited
    copied.done = True
    assert pool.stats()[0] == kept.length == -(-3000 // ALIGN) * ALIGN
