"""Compact host memory for offloaded tensors (zipccl.offload).

A tensor's host copy takes its compressed size rounded up to ``ALIGN`` bytes, not the power of two
that torch's pinned-memory cache rounds every allocation up to (which would hand back most of what
compression saved). The pool takes slabs from that cache (pinned for CUDA, plain memory for CPU
tensors) and hands out first-fit ranges of them. A range is returned with the device events its
last copies recorded: it is reused only once they have completed, so a copy still in flight never
finds its memory handed to another tensor. Frees may come from any thread, a garbage collector's
included: they are queued and taken in under the pool's lock by the next call that needs them.
"""

from __future__ import annotations

import bisect
import collections
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

ALIGN = 512  # bytes; ranges start on this boundary (the copy engines' fast path)
SLAB_BYTES = 256 << 20  # the smallest slab taken from torch's cache (a power of two, as it rounds)


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _power_of_two_at_least(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


@dataclass(eq=False)
class HostRange:
    """``length`` bytes at ``start`` in slab ``slab``; ``view`` is that memory as a uint8 tensor."""

    slab: int
    start: int
    length: int
    view: torch.Tensor


@dataclass(eq=False)
class _Slab:
    memory: torch.Tensor
    free: list[tuple[int, int]] = field(default_factory=list)  # sorted (start, end) spans

    def __post_init__(self) -> None:
        self.free.append((0, self.memory.numel()))

    def take(self, size: int) -> int | None:
        """The start of a first-fit ``size``-byte span, removed from the free list; or None."""
        for i, (start, end) in enumerate(self.free):
            if end - start >= size:
                if end - start == size:
                    del self.free[i]
                else:
                    self.free[i] = (start + size, end)
                return start
        return None

    def give(self, start: int, end: int) -> None:
        """Return a span, merged with its free neighbours."""
        i = bisect.bisect(self.free, (start, end))
        if i < len(self.free) and self.free[i][0] == end:
            end = self.free.pop(i)[1]
        if i > 0 and self.free[i - 1][1] == start:
            start = self.free.pop(i - 1)[0]
            i -= 1
        self.free.insert(i, (start, end))

    @property
    def idle(self) -> bool:
        return self.free == [(0, self.memory.numel())]


class HostPool:
    """Host memory in slabs, ranges handed out first-fit; pinned when ``pinned``."""

    def __init__(self, pinned: bool, slab_bytes: int = SLAB_BYTES) -> None:
        self.pinned, self.slab_bytes = pinned, slab_bytes
        self._slabs: dict[int, _Slab] = {}
        self._next_slab = 0
        self._lock = threading.Lock()
        self._returned: collections.deque[tuple[HostRange, Sequence[object]]] = (
            collections.deque()
        )  # appended without the lock (a finaliser may run anywhere), taken in under it
        self._waiting: list[tuple[HostRange, Sequence[object]]] = []
        self._in_use = 0

    def alloc(self, nbytes: int) -> HostRange:
        """A range of at least ``nbytes`` bytes (``view`` is exactly ``nbytes`` long)."""
        size = _aligned(max(nbytes, 1))
        with self._lock:
            found = self._first_fit(size, nbytes)
            if found is None:  # (returns are taken in only then: each costs an event query)
                self._take_in_returns()
                found = self._first_fit(size, nbytes)
            if found is not None:
                return found
            key, self._next_slab = self._next_slab, self._next_slab + 1
            length = _power_of_two_at_least(max(size, self.slab_bytes))
            slab = self._slabs[key] = _Slab(
                torch.empty(length, dtype=torch.uint8, pin_memory=self.pinned)
            )
            start = slab.take(size)
            assert start == 0
            return self._range(key, slab, start, size, nbytes)

    def _first_fit(self, size: int, nbytes: int) -> HostRange | None:
        for key, slab in self._slabs.items():
            start = slab.take(size)
            if start is not None:
                return self._range(key, slab, start, size, nbytes)
        return None

    def _range(self, key: int, slab: _Slab, start: int, size: int, nbytes: int) -> HostRange:
        self._in_use += size
        return HostRange(key, start, size, slab.memory[start : start + nbytes])

    def trim(self, span: HostRange, nbytes: int, after: Sequence[object] = ()) -> HostRange:
        """The first ``nbytes`` of ``span`` (at most its length) as a range of their own; the
        rest is given back once every event in ``after`` has completed, as :meth:`free` does."""
        keep = min(_aligned(max(nbytes, 1)), span.length)
        if keep < span.length:
            tail = span.view[:0]  # (a tail's view is never read)
            self.free(HostRange(span.slab, span.start + keep, span.length - keep, tail), after)
        return HostRange(span.slab, span.start, keep, span.view[:nbytes])

    def free(self, span: HostRange, after: Sequence[object] = ()) -> None:
        """Give ``span`` back once every event in ``after`` (``torch.cuda.Event``) has completed.
        Lock-free: safe from finalisers and any thread."""
        self._returned.append((span, after))

    def _take_in_returns(self) -> None:
        while self._returned:
            self._waiting.append(self._returned.popleft())
        still = []
        for span, after in self._waiting:
            if all(event.query() for event in after):  # type: ignore[attr-defined]
                self._slabs[span.slab].give(span.start, span.start + span.length)
                self._in_use -= span.length
            else:
                still.append((span, after))
        self._waiting = still

    def stats(self) -> tuple[int, int]:
        """(bytes in ranges not yet given back or still awaited, bytes held in slabs)."""
        with self._lock:
            self._take_in_returns()
            return self._in_use, sum(s.memory.numel() for s in self._slabs.values())

    def empty_cache(self) -> None:
        """Hand slabs with no range in use back to torch's host cache."""
        with self._lock:
            self._take_in_returns()
            for key in [k for k, s in self._slabs.items() if s.idle]:
                del self._slabs[key]
