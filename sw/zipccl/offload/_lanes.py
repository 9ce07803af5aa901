"""One device's offload machinery -- its side streams, host memory pool, worker thread and
staging ring -- and the stream helpers every copy uses (CUDA streams and events; on CPU each is a
no-op: every copy has already run)."""

from __future__ import annotations

import atexit
import collections
import contextlib
import queue
import threading
from collections.abc import Callable
from typing import NamedTuple

import torch

from zipccl import _streams
from zipccl.offload._host_pool import HostPool

SLOT_GRAIN = 1 << 20  # staging slots grow in steps of this (a chunk is at least as large)
STAGING_SLOTS = 2  # device buffers that compressed chunks land in before they are decoded
KINDS_KEPT = 4096  # tensor kinds (dtype, size, chunking) whose latest compressed ratio is kept
Kind = tuple[torch.dtype, int, int]


class Lanes:
    """One device's side streams, host pool, worker thread (which runs jobs in order) and
    staging ring: compressed chunks coming up land in one of ``STAGING_SLOTS`` device buffers,
    each reused once the decode of its previous chunk has run (the copy waits for it on the
    device), so loads in flight hold no per-chunk buffers. A load holds ``ring`` while it queues
    (the worker's, after a prefetch, or a caller's). ``ratios``: each tensor kind's latest
    compressed ratio, which the next tensor of that kind is copied down for."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        make = (lambda: torch.cuda.Stream(device)) if self.cuda else (lambda: None)
        self.d2h, self.h2d, self.decode = make(), make(), make()
        self.pool = HostPool(pinned=self.cuda)
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self.ring = threading.Lock()  # held by whichever thread queues a load
        self.ratios: collections.OrderedDict[Kind, float] = collections.OrderedDict()
        self._ratios_lock = threading.Lock()
        self._slots: list[torch.Tensor | None] = [None] * STAGING_SLOTS
        self._slot_free: list[torch.cuda.Event | None] = [None] * STAGING_SLOTS
        self._next_slot = 0
        name = f"zipccl-offload-{device}"
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    def _work(self) -> None:
        if self.cuda:
            torch.cuda.set_device(self.device)
        with torch.no_grad():
            for job in iter(self._jobs.get, None):
                job()  # a job records its own errors

    def stop(self) -> None:
        """Run the jobs queued so far, then end the worker (at interpreter exit: a worker still
        inside torch when the process ends aborts it)."""
        self._jobs.put(None)
        self._thread.join(timeout=60)  # (a device that never finishes must not hang the exit)

    def remember(self, kind: Kind, ratio: float) -> None:
        """The worst chunk ratio of the latest tensor of ``kind`` (the next one's copies are
        queued for it before its size is known); the ``KINDS_KEPT`` latest kinds are kept."""
        with self._ratios_lock:
            self.ratios[kind] = ratio
            self.ratios.move_to_end(kind)
            while len(self.ratios) > KINDS_KEPT:
                self.ratios.popitem(last=False)

    def submit(self, job: Callable[[], None]) -> None:
        self._jobs.put(job)

    def drain(self) -> None:
        """Wait until the worker has run (and let go of) every job queued so far."""
        done = threading.Event()
        self.submit(done.set)
        done.wait()

    def on(self, stream: torch.cuda.Stream | None) -> contextlib.AbstractContextManager[None]:
        return _streams.on(stream)

    def mark(self, stream: torch.cuda.Stream | None) -> torch.cuda.Event | None:
        """An event recorded on ``stream`` (None on CPU, where every copy is already done)."""
        if stream is None:
            return None
        event = torch.cuda.Event()
        event.record(stream)
        return event

    def marks(self, stream: torch.cuda.Stream | None) -> list[torch.cuda.Event]:
        """:meth:`mark` as a list of the events a host range is given back after."""
        event = self.mark(stream)
        return [] if event is None else [event]

    def current(self) -> torch.cuda.Stream | None:
        return torch.cuda.current_stream(self.device) if self.cuda else None

    def stage(self, parts: list[torch.Tensor]) -> tuple[torch.Tensor, int]:
        """Queue the copy of the host bytes ``parts``, end to end, into the next staging slot (on
        the h2d stream, after that slot's last decode); returns the device copy and the slot,
        for :meth:`staged`."""
        index, self._next_slot = self._next_slot, (self._next_slot + 1) % STAGING_SLOTS
        slot, nbytes = self._slots[index], sum(part.numel() for part in parts)
        if slot is None or slot.numel() < nbytes:  # (made on the decode stream, written on h2d)
            size = -(-nbytes // SLOT_GRAIN) * SLOT_GRAIN
            slot = self._slots[index] = torch.empty(size, dtype=torch.uint8, device=self.device)
            used_on(slot, self.h2d)
            self._slot_free[index] = self.mark(self.decode)  # see _fresh
        with self.on(self.h2d):
            wait(self.h2d, self._slot_free[index])
            copy_parts(slot[:nbytes], parts)
        wait(self.decode, self.mark(self.h2d))
        return slot[:nbytes], index

    def staged(self, index: int) -> None:
        """The decode reading slot ``index`` is queued (on the decode stream)."""
        self._slot_free[index] = self.mark(self.decode)


LANES: dict[torch.device, Lanes] = {}
_LANES_LOCK = threading.Lock()


@atexit.register
def _stop_workers() -> None:
    with _LANES_LOCK:
        lanes = list(LANES.values())
        LANES.clear()
    for each in lanes:
        each.stop()


def of(device: torch.device) -> Lanes:
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    lanes = LANES.get(device)
    if lanes is None:
        with _LANES_LOCK:
            lanes = LANES.get(device) or LANES.setdefault(device, Lanes(device))
    return lanes


# _fresh: memory a load allocates (on the decode stream, current while it queues) and the h2d
# stream writes is written only after the decode stream has run what it had queued when it was made:
# with deterministic algorithms on, torch fills new memory (NaN, or the largest integer) with a
# kernel on the allocating stream, which would otherwise land after the copy, over it; and the
# allocator hands memory freed on the decode stream on to the next allocation there at once.


def wait(stream: torch.cuda.Stream | None, event: torch.cuda.Event | None) -> None:
    if stream is not None and event is not None:
        stream.wait_event(event)


def used_on(tensor: torch.Tensor, stream: torch.cuda.Stream | None) -> None:
    """Tell the caching allocator that ``stream`` uses ``tensor`` (no-op on CPU and for empty
    tensors, which own no memory)."""
    if stream is not None and tensor.numel():
        tensor.record_stream(stream)


def copy_parts(into: torch.Tensor, parts: list[torch.Tensor]) -> None:
    """Queue the copies of ``parts``, end to end, into the flat ``into`` (current stream)."""
    offset = 0
    for part in parts:
        into[offset : offset + part.numel()].copy_(part, non_blocking=True)
        offset += part.numel()


def landed(copied: torch.cuda.Event | None) -> bool:
    return copied is None or copied.query()


class HostMemory(NamedTuple):
    """Host memory of one device's offloads: ``in_use`` bytes in host copies (and in ranges whose
    last copies have not yet completed), ``reserved`` bytes held in the pool's slabs."""

    in_use: int
    reserved: int


def host_memory(device: torch.device | str = "cuda") -> HostMemory:
    """The host memory that offloads of ``device``'s tensors hold (see :class:`HostMemory`)."""
    return HostMemory(*of(torch.device(device)).pool.stats())


def empty_host_cache() -> None:
    """Hand the pools' idle slabs (no host copy in them) back to torch's host memory cache
    (pinned memory: ``torch._C._host_emptyCache()`` then releases it to the system)."""
    for lanes in list(LANES.values()):
        lanes.pool.empty_cache()
