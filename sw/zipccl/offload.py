"""Compressed offload to host memory: tensors and saved activations moved over PCIe coded.

:func:`offload_tensor` compresses a tensor on its device (the codec, :mod:`zipccl.codec`) and
copies only the compressed bytes into host memory; :meth:`HostCopy.load` copies them back and
decompresses. :func:`offload_activations` does that to the tensors autograd saves for backward
(``torch.autograd.graph.saved_tensors_hooks``), bringing them back ahead of the backward pass.

How a CUDA tensor travels (docs/offload.md has the whole story):

* down: the caller's thread queues, on the caller's stream, the compression of each chunk of the
  tensor (``chunk_bytes``) into a device buffer and, where a tensor of the same kind (dtype, size,
  chunking) went down before, the chunk's copy on a device-to-host stream into pinned host memory
  (zipccl._host_pool) for that tensor's worst chunk ratio plus a margin: the compressed size is
  only known on the device, and the caller's thread never waits for it. A worker thread per
  device copies a tensor of a new kind: it waits for the first chunk's 512-byte header (copied on
  that stream) and guesses the later chunks from it. Each guessed copy is settled once it has
  landed, by the worker in the background or by whichever call needs it first: the chunk's
  header is read from its host copy, the unused end of its host memory given back, or, where
  the guess was short, the bytes past it copied into a tail of their own. Chunk k is copied
  while chunk k+1 is compressed, and nothing but the codec runs on the caller's stream.
* up: :meth:`HostCopy.load` queues each chunk's copy on a host-to-device stream and its
  decompression on a decode stream (the worker does, after :meth:`HostCopy.prefetch`), so chunk
  k decodes while chunk k+1 crosses the link; the caller's stream waits for the result with an
  event, not the caller's thread.
* raw: dtypes the codec does not code and ``compress=False`` are copied as they are, on the same
  streams (their copy queued by the caller's thread: their size is known); so are chunks the codec
  stores in its raw layout (compression would not shrink them).

On CPU the same code runs without streams or events (the host copy is a compact CPU buffer),
which is what the CPU tests exercise.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import functools
import queue
import threading
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import NamedTuple

import torch

from zipccl import _streams
from zipccl._host_pool import HostPool, HostRange
from zipccl.codec import (
    Compressed,
    _expected_size,
    compress_into,
    decompress,
    max_compressed_bytes,
)
from zipccl.golden.container import HEADER_BYTES, LAYOUT_RAW, Header

__all__ = [
    "ActivationOffload",
    "HostCopy",
    "HostMemory",
    "empty_host_cache",
    "host_memory",
    "offload_activations",
    "offload_tensor",
]

CODED = frozenset(
    {torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn, torch.float8_e5m2}
)
CHUNK_BYTES = 64 << 20  # a chunk is compressed while the one before it is copied
MIN_CHUNK_BYTES = 1 << 20
_CHUNK_ELEMENTS = 4096  # chunks hold whole codec blocks (codec.DEFAULT_BLOCK)


# ---------------------------------------------------------------------- per-device machinery
STAGING_SLOTS = 2  # device buffers that compressed chunks land in before they are decoded
KINDS_KEPT = 4096  # tensor kinds (dtype, size, chunking) whose latest compressed ratio is kept
_Kind = tuple[torch.dtype, int, int]


class _Lanes:
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
        self.ratios: collections.OrderedDict[_Kind, float] = collections.OrderedDict()
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

    def remember(self, kind: _Kind, ratio: float) -> None:
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
            size = -(-nbytes // MIN_CHUNK_BYTES) * MIN_CHUNK_BYTES
            slot = self._slots[index] = torch.empty(size, dtype=torch.uint8, device=self.device)
            _used_on(slot, self.h2d)
            self._slot_free[index] = self.mark(self.decode)  # see _fresh
        with self.on(self.h2d):
            _wait(self.h2d, self._slot_free[index])
            _copy_parts(slot[:nbytes], parts)
        _wait(self.decode, self.mark(self.h2d))
        return slot[:nbytes], index

    def staged(self, index: int) -> None:
        """The decode reading slot ``index`` is queued (on the decode stream)."""
        self._slot_free[index] = self.mark(self.decode)


_LANES: dict[torch.device, _Lanes] = {}
_LANES_LOCK = threading.Lock()


@atexit.register
def _stop_workers() -> None:
    with _LANES_LOCK:
        lanes = list(_LANES.values())
        _LANES.clear()
    for each in lanes:
        each.stop()


def _lanes(device: torch.device) -> _Lanes:
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    lanes = _LANES.get(device)
    if lanes is None:
        with _LANES_LOCK:
            lanes = _LANES.get(device) or _LANES.setdefault(device, _Lanes(device))
    return lanes


# _fresh: memory a load allocates (on the decode stream, current while it queues) and the h2d
# stream writes is written only after the decode stream has run what it had queued when it was made:
# with deterministic algorithms on, torch fills new memory (NaN, or the largest integer) with a
# kernel on the allocating stream, which would otherwise land after the copy, over it; and the
# allocator hands memory freed on the decode stream on to the next allocation there at once.


def _wait(stream: torch.cuda.Stream | None, event: torch.cuda.Event | None) -> None:
    if stream is not None and event is not None:
        stream.wait_event(event)


def _used_on(tensor: torch.Tensor, stream: torch.cuda.Stream | None) -> None:
    """Tell the caching allocator that ``stream`` uses ``tensor`` (no-op on CPU and for empty
    tensors, which own no memory)."""
    if stream is not None and tensor.numel():
        tensor.record_stream(stream)


# ---------------------------------------------------------------------- one tensor's host copy
def _dense_order(t: torch.Tensor) -> list[int] | None:
    """A permutation of ``t``'s dims under which it is contiguous (so it can travel as it lies in
    memory and come back with its strides), or None for views with gaps or overlaps."""
    strides, sizes = t.stride(), t.shape
    order = sorted(range(t.dim()), key=lambda d: (-strides[d], -sizes[d]))
    return order if t.permute(order).is_contiguous() else None


@dataclass(eq=False)
class _Piece:
    """A chunk of the flattened tensor: elements [start, stop). ``source`` is what the worker
    copies down: the compressed device buffer (``coded``) or the chunk's own bytes; after the
    store, ``host`` holds the bytes and ``head`` the parsed header (None: raw bytes, no
    header)."""

    start: int
    stop: int
    source: torch.Tensor | None
    ready: torch.cuda.Event | None  # on the caller's stream, after ``source`` is written
    coded: bool = False
    landing: HostRange | None = None  # a copy queued before the size was known, unsettled
    tail: HostRange | None = None  # the bytes past a guessed copy that fell short of the chunk
    copied: torch.cuda.Event | None = None  # on the d2h stream, after the chunk's last copy
    host: HostRange | None = None
    head: Header | None = None
    ratio: float = 1.0  # its compressed size over its capacity, once known

    def parts(self) -> list[torch.Tensor]:
        """The stored bytes, in order: the host range and, where there is one, the tail."""
        return [span.view for span in (self.host, self.tail) if span is not None]

    def read_header(self, host: torch.Tensor) -> int:
        """Take the chunk's header (``head``, and its ``ratio``) from its first bytes in host
        memory; returns the chunk's compressed size."""
        self.head = Header.unpack(bytes(host[:HEADER_BYTES].numpy()))
        nbytes = _expected_size(self.head)
        self.ratio = nbytes / _source(self).numel()
        return nbytes


@dataclass(eq=False)
class _Ticket:
    """One load in flight: the worker fills ``tensor`` and ``done`` (or ``error``), then sets
    ``issued``."""

    issued: threading.Event
    tensor: torch.Tensor | None = None
    done: torch.cuda.Event | None = None
    error: BaseException | None = None


class HostCopy:
    """A tensor's copy in host memory, compressed where the codec codes its dtype; made by
    :func:`offload_tensor` (not constructed directly).

    The copy is queued, not finished, when :func:`offload_tensor` returns; :meth:`wait` waits for
    it. :meth:`load` (or :meth:`prefetch` then :meth:`load`) brings the tensor back, bit-exact,
    on its device. The host memory is given back when the HostCopy is garbage collected (after the
    copies that use it have run).

    Attributes:
        dtype (torch.dtype), shape (torch.Size), device (torch.device): the tensor's.
        nbytes (int): the tensor's own size in bytes.
        compressed (bool): whether the codec coded it (its dtype is one of the five the codec
            codes and ``compress=True``); chunks that compression would not shrink are still
            stored raw.

    Example::

        >>> x = torch.randn(256, 1024, dtype=torch.bfloat16)
        >>> h = zipccl.offload_tensor(x)  # queued: compressed, then copied down
        >>> h.prefetch()  # start the copy up early (optional)
        >>> y = h.load()
        >>> torch.equal(y, x), h.compressed, h.host_bytes < h.nbytes
        (True, True, True)
    """

    def __init__(self, tensor: torch.Tensor, compress: bool, chunk_bytes: int) -> None:
        self._pieces: list[_Piece] = []
        if tensor.is_cuda and torch.cuda.is_current_stream_capturing():
            raise ValueError("offload waits on events, which a CUDA graph capture cannot hold")
        self._queued = threading.Event()  # every chunk's copy down is queued (or one failed)
        self._settling = threading.Lock()  # the worker and wait()/load() both settle chunks
        self._remembered = False  # the kind's ratio was taken from this tensor
        self._last_use: torch.cuda.Event | None = None  # after the latest load's copies
        self._error: BaseException | None = None
        self._ticket: _Ticket | None = None
        self.dtype, self.shape, self.device = tensor.dtype, tensor.shape, tensor.device
        self.nbytes = tensor.numel() * tensor.element_size()
        self.compressed = compress and tensor.dtype in CODED and tensor.numel() > 0
        self._lanes = _lanes(tensor.device)
        self._order = _dense_order(tensor)
        self._strides = tensor.stride() if self._order is not None else None
        memory_order = tensor.permute(self._order) if self._order is not None else tensor
        flat = memory_order.contiguous().view(-1)
        if not self.compressed:  # its size is known: the caller's thread queues its copy
            self._pieces = [self._raw(flat)]
            self._queued.set()
            return
        step = _chunk_elements(flat, chunk_bytes)
        self._kind = (flat.dtype, flat.numel(), step)
        ratio = self._lanes.ratios.get(self._kind)
        feed: queue.SimpleQueue[_Piece | None] = queue.SimpleQueue()
        store = functools.partial(self._lanes.submit, lambda: self._store(iter(feed.get, None)))
        if ratio is None:  # the worker copies the first chunk, as soon as it is queued
            store()
        try:
            self._compress(flat, step, ratio, feed)
        finally:
            feed.put(None)
            if ratio is not None:  # woken only now, the worker cannot slow the caller's loop
                store()

    # ------------------------------------------------------------ down (caller's thread)
    def _compress(
        self,
        flat: torch.Tensor,
        step: int,
        ratio: float | None,
        feed: queue.SimpleQueue[_Piece | None],
    ) -> None:
        """Queue each chunk's compression on the caller's stream and, where a tensor of this
        kind was offloaded before (``ratio``: its worst chunk's), the chunk's copy down for that
        ratio, handing each chunk to the worker as soon as it is queued."""
        lanes = self._lanes
        for start in range(0, flat.numel(), step):
            chunk = flat[start : start + step]
            out = torch.empty(
                max_compressed_bytes(chunk.dtype, chunk.numel()),
                dtype=torch.uint8,
                device=flat.device,
            )
            compress_into(chunk, out)
            ready = lanes.mark(lanes.current())
            piece = _Piece(start, start + chunk.numel(), out, ready, coded=True)
            self._pieces.append(piece)
            guessed = functools.partial(self._copy_guessed, piece, ratio) if ratio else None
            if guessed is not None and not self._try_queue(guessed):
                return  # (the worker stores nothing after a failure; wait() raises it)
            feed.put(piece)

    def _raw(self, flat: torch.Tensor) -> _Piece:
        """The tensor's bytes as one piece, its copy queued (a failure is kept for wait())."""
        lanes = self._lanes
        piece = _Piece(0, flat.numel(), flat.view(torch.uint8), lanes.mark(lanes.current()))

        def store() -> None:
            piece.host = self._copy_down(piece, flat.numel() * flat.element_size())
            piece.copied, piece.source = lanes.mark(lanes.d2h), None

        self._try_queue(store)
        return piece

    def _try_queue(self, queue_copy: Callable[[], None]) -> bool:
        """Run ``queue_copy`` on the caller's thread; an error (host memory exhausted, say) is
        kept to be raised by :meth:`wait` and :meth:`load`, as the worker's are. Returns
        whether it succeeded."""
        try:
            queue_copy()
        except Exception as exc:
            self._error = exc
            return False
        return True

    # ------------------------------------------------------------ down (worker)
    def _store(self, pieces: Iterator[_Piece]) -> None:
        """Queue the copies down the caller's thread did not, taking the chunks as it queues
        them, settling those that have landed meanwhile (:meth:`_settle`); the others are
        settled by the first call that needs them. A chunk that fails ends the store:
        :meth:`wait` and :meth:`load` raise its error."""
        ratio = None
        try:
            for piece in pieces:
                if piece.landing is not None or piece.host is not None:
                    pass  # queued by the caller's thread (and maybe settled)
                elif ratio is None:
                    ratio = self._store_exactly(piece)
                else:
                    self._copy_guessed(piece, ratio)
                self._settle(block=False)
        except BaseException as exc:  # raised to the caller by wait() and load()
            self._error = exc
        finally:
            for _ in pieces:  # the caller's thread is done with the tensor
                pass
            self._queued.set()

    def _store_exactly(self, piece: _Piece) -> float:
        """Queue a compressed chunk's copy of exactly its size, read from its header, copied on
        the d2h stream and waited for (the first chunk of a tensor of a kind not seen before,
        which has no ratio to guess from). Returns its compressed ratio."""
        lanes, source = self._lanes, _source(piece)
        header = torch.empty(HEADER_BYTES, dtype=torch.uint8, pin_memory=lanes.cuda)
        with lanes.on(lanes.d2h):
            _wait(lanes.d2h, piece.ready)
            header.copy_(source[:HEADER_BYTES], non_blocking=True)
            sized = lanes.mark(lanes.d2h)
        if sized is not None:
            sized.synchronize()  # the GIL is released while it waits
        piece.host = self._copy_down(piece, piece.read_header(header))
        piece.copied, piece.source = lanes.mark(lanes.d2h), None
        return piece.ratio

    # ------------------------------------------------------------ down (either thread)
    def _copy_guessed(self, piece: _Piece, ratio: float) -> None:
        """Queue a compressed chunk's copy for ``ratio`` plus ``GUESS_MARGIN`` before its size
        is known: waiting for each chunk's header before queuing its copy would leave the link
        idle while the header crossed behind the previous chunk's copy and the worker reacted."""
        piece.landing = self._copy_down(piece, _guess(ratio, _source(piece).numel()))
        piece.copied = self._lanes.mark(self._lanes.d2h)

    def _copy_down(self, piece: _Piece, nbytes: int, start: int = 0) -> HostRange:
        """Queue the copy of bytes ``start`` to ``nbytes`` of the chunk into new host memory."""
        lanes, source = self._lanes, _source(piece)
        host = lanes.pool.alloc(nbytes - start)
        with lanes.on(lanes.d2h):
            _wait(lanes.d2h, piece.ready)
            host.view.copy_(source[start:nbytes], non_blocking=True)
            _used_on(source, lanes.d2h)
        return host

    def _settle(self, block: bool) -> None:
        """Settle the guessed copies that have landed (``block``: all of them, waiting), in
        order: read each chunk's header from its host copy; the unused end of its host memory
        is given back or, where the guess was short, the bytes past it are copied into a tail
        of their own (one more small copy, not the chunk again). Once every chunk is settled,
        the tensor's worst chunk ratio is remembered for the next tensor of its kind.

        Whichever thread needs a chunk settles it: the worker while it queues, :meth:`wait`,
        :meth:`landed` and :meth:`load` on the caller's thread. The worker does not wait for
        copies to land: a caller waiting on the same copy would then wake with it and wait
        for the worker's turn with the GIL."""
        self._settle_landed(block)
        if self.compressed and not self._remembered and self._queued.is_set():
            with self._settling:
                if all(p.landing is None and p.head is not None for p in self._pieces):
                    self._lanes.remember(self._kind, max(p.ratio for p in self._pieces))
                    self._remembered = True

    def _settle_landed(self, block: bool) -> None:
        lanes = self._lanes
        for piece in list(self._pieces):
            copied = piece.copied
            if piece.landing is None:
                continue
            if not _landed(copied):
                if not block:
                    return
                assert copied is not None
                copied.synchronize()  # (outside the lock: the other thread may settle it)
            with self._settling:
                landing = piece.landing
                if landing is None:  # the other thread settled it meanwhile
                    continue
                nbytes = piece.read_header(landing.view)
                if nbytes > landing.view.numel():
                    piece.host = landing
                    piece.tail = self._copy_down(piece, nbytes, landing.view.numel())
                    piece.copied = lanes.mark(lanes.d2h)
                else:
                    piece.host = lanes.pool.trim(landing, nbytes, lanes.marks(lanes.d2h))
                piece.landing, piece.source = None, None

    # ------------------------------------------------------------ the caller's view
    def _check(self) -> None:
        """Wait until every chunk's copy is queued and settled (its size known); raise the
        store's error."""
        self._queued.wait()
        if self._error is not None:
            raise RuntimeError(f"offload of a {self.dtype} tensor failed") from self._error
        self._settle(block=True)

    def wait(self) -> None:
        """Block until the host copy is complete (its bytes are in host memory).

        Raises:
            RuntimeError: the copy failed (e.g. host memory could not be allocated); its cause
                is chained.
        """
        self._check()
        for piece in self._pieces:
            if piece.copied is not None:
                piece.copied.synchronize()

    def landed(self) -> bool:
        """Whether the host copy is complete, without waiting (False while it is queued)."""
        if not self._queued.is_set():
            return False
        if self._error is not None:
            return True
        self._settle(block=False)
        return all(p.landing is None and _landed(p.copied) for p in self._pieces)

    @property
    def host_bytes(self) -> int:
        """Bytes the copy occupies in host memory: the compressed sizes (headers included), or
        the tensor's size where stored raw. Waits until the sizes are known (for chunks copied
        before their size was, until those copies have landed)."""
        self._check()
        return sum(part.numel() for piece in self._pieces for part in piece.parts())

    def prefetch(self) -> None:
        """Start bringing the tensor back to its device; :meth:`load` then takes it. Returns at
        once; a second call before :meth:`load` does nothing."""
        if self._ticket is None:
            ticket = self._ticket = _Ticket(threading.Event())
            self._lanes.submit(lambda: self._load(ticket))

    def load(self) -> torch.Tensor:
        """The tensor, bit-exact, on its device and ordered after the copy on the current stream
        (the caller's stream waits for it; the caller's thread waits only for the copies up to
        be queued: by itself, or by the worker after :meth:`prefetch`). Each call makes a new
        tensor; the host copy stays until garbage collected.

        Returns:
            Tensor: the original dtype, shape and, for tensors without gaps or overlaps in
            memory, strides (others come back contiguous).

        Raises:
            RuntimeError: the copy down or up failed; its cause is chained.
        """
        ticket, self._ticket = self._ticket, None
        if ticket is None:
            ticket = _Ticket(threading.Event())
            self._load(ticket)
        ticket.issued.wait()
        if ticket.error is not None:
            raise RuntimeError(f"load of a {self.dtype} tensor failed") from ticket.error
        tensor = ticket.tensor
        assert tensor is not None
        caller = self._lanes.current()
        _wait(caller, ticket.done)
        _used_on(tensor, caller)
        return tensor

    # ------------------------------------------------------------ up (worker or caller)
    def _load(self, ticket: _Ticket) -> None:
        """Queue the chunks' copies up and decodes into a new tensor. ``done`` is recorded
        after whatever was queued, also when a chunk fails (the tensor and the host memory are
        marked as used until then). The staging ring is held while queuing, so that the loads
        of the worker and of callers' threads take its slots one after the other."""
        lanes = self._lanes
        try:
            self._check()  # (before the ring: the worker may need it to get here)
            with lanes.ring, lanes.on(lanes.decode):
                tensor, flat = self._empty()
                _used_on(tensor, lanes.h2d)  # raw chunks are copied into it there
                _wait(lanes.h2d, lanes.mark(lanes.decode))  # see _fresh
                try:
                    for piece in self._pieces:
                        self._load_piece(piece, flat)
                finally:
                    _wait(lanes.decode, lanes.mark(lanes.h2d))
                    self._last_use = ticket.done = lanes.mark(lanes.decode)
                ticket.tensor = tensor
        except BaseException as exc:  # raised to the caller by load()
            ticket.error = exc
        finally:
            ticket.issued.set()

    def _empty(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The tensor to load into and its flat view in memory order."""
        if self._order is None:
            tensor = torch.empty(self.shape, dtype=self.dtype, device=self.device)
            return tensor, tensor.view(-1)
        assert self._strides is not None
        tensor = torch.empty_strided(
            self.shape, self._strides, dtype=self.dtype, device=self.device
        )
        return tensor, tensor.permute(self._order).view(-1)

    def _load_piece(self, piece: _Piece, flat: torch.Tensor) -> None:
        """Queue one chunk's copy up (h2d stream, after its copy down) and its decode (decode
        stream)."""
        lanes, parts = self._lanes, piece.parts()
        target = flat[piece.start : piece.stop]
        _wait(lanes.h2d, piece.copied)
        if piece.head is None or piece.head.layout == LAYOUT_RAW:
            if piece.head is not None:
                parts[0] = parts[0][HEADER_BYTES:]
            with lanes.on(lanes.h2d):
                _copy_parts(target.view(torch.uint8), parts)
            return
        buffer, slot = lanes.stage(parts)
        decompress(Compressed._of(buffer, piece.head), out=target, sync=False)
        lanes.staged(slot)

    def __del__(self) -> None:
        for piece in self._pieces:
            after = [e for e in (piece.copied, self._last_use) if e is not None]
            for span in (piece.host, piece.tail, piece.landing):
                if span is not None:
                    self._lanes.pool.free(span, after)


GUESS_MARGIN = 1 / 256  # a chunk's guessed copy is queued for a ratio plus this (of its bound)


def _guess(ratio: float, cap: int) -> int:
    """Bytes to copy of a chunk of ``cap`` bytes at most, expected to compress like one of
    ``ratio`` (see HostCopy._settle)."""
    return min(cap, int(ratio * (1 + GUESS_MARGIN) * cap) + HEADER_BYTES)


def _copy_parts(into: torch.Tensor, parts: list[torch.Tensor]) -> None:
    """Queue the copies of ``parts``, end to end, into the flat ``into`` (current stream)."""
    offset = 0
    for part in parts:
        into[offset : offset + part.numel()].copy_(part, non_blocking=True)
        offset += part.numel()


def _source(piece: _Piece) -> torch.Tensor:
    assert piece.source is not None, "a chunk's source is let go only once it is stored"
    return piece.source


def _landed(copied: torch.cuda.Event | None) -> bool:
    return copied is None or copied.query()


def _chunk_elements(flat: torch.Tensor, chunk_bytes: int) -> int:
    blocks = max(1, chunk_bytes // (flat.element_size() * _CHUNK_ELEMENTS))
    return blocks * _CHUNK_ELEMENTS


def _check_chunk_bytes(chunk_bytes: object) -> int:
    if not isinstance(chunk_bytes, int) or isinstance(chunk_bytes, bool):
        raise TypeError(f"chunk_bytes must be an int, got {type(chunk_bytes).__name__}")
    if chunk_bytes < MIN_CHUNK_BYTES:
        raise ValueError(f"chunk_bytes must be at least {MIN_CHUNK_BYTES}, got {chunk_bytes}")
    return chunk_bytes


def _check_bool(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return value


def _unsupported(tensor: torch.Tensor) -> str | None:
    """Why ``tensor`` cannot be offloaded, or None."""
    if tensor.layout != torch.strided:
        return f"a {tensor.layout} tensor"
    if tensor.is_quantized:
        return "a quantized tensor"
    if tensor.device.type not in ("cuda", "cpu"):
        return f"a tensor on {tensor.device}"
    return None


def offload_tensor(
    tensor: torch.Tensor, *, compress: bool = True, chunk_bytes: int = CHUNK_BYTES
) -> HostCopy:
    """Copy a tensor into host memory, compressed on its device first, without waiting for it.

    On CUDA the compression is queued on the current stream (so the copy holds the tensor's
    value as that stream has it), the copy down on a side stream, for the compressed size of the
    last tensor of the same dtype and size (a worker thread waits for the first chunk's size
    where there is none): the call returns before any of it has run, and the caller's thread
    never waits for the device. Only the compressed bytes cross the link and occupy host
    memory (pinned, from a pool of slabs). A tensor the codec does not code, or ``compress=False``,
    is copied raw the same way. Write to the tensor in place only after :meth:`HostCopy.wait`
    where it is stored raw (its bytes are read by the copy itself). On CPU the copy is a compact
    CPU buffer, made the same way.

    Args:
        tensor (Tensor): on CUDA or CPU, strided, any dtype; ``bfloat16``, ``float16``,
            ``float32``, ``float8_e4m3fn`` and ``float8_e5m2`` are compressed, others copied raw.
            Only its values are read (autograd does not see the call).
        compress (bool, optional): False copies raw whatever the dtype (the uncompressed
            baseline, on the same streams). Default True.
        chunk_bytes (int, optional): the tensor is compressed and copied in chunks of about this
            many bytes (at least 1 MiB), chunk k+1 compressed while chunk k is copied; default
            64 MiB.

    Returns:
        HostCopy: :meth:`HostCopy.load` brings the tensor back.

    Raises:
        TypeError: ``tensor`` is not a tensor; ``compress`` not a bool; ``chunk_bytes`` not an
            int.
        ValueError: a sparse, quantized or other non-strided tensor, one on a device other than
            CUDA or CPU; ``chunk_bytes`` below 1 MiB; called inside a CUDA graph capture.

    Example::

        >>> x = torch.randn(1 << 16, dtype=torch.bfloat16)
        >>> h = zipccl.offload_tensor(x)
        >>> h.host_bytes < x.numel() * x.element_size()
        True
        >>> torch.equal(h.load(), x)
        True
    """
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"expected a torch.Tensor, got {type(tensor).__name__}")
    _check_bool("compress", compress)
    chunk_bytes = _check_chunk_bytes(chunk_bytes)
    why = _unsupported(tensor)
    if why is not None:
        raise ValueError(f"cannot offload {why}")
    with torch.no_grad():
        return HostCopy(tensor.detach(), compress, chunk_bytes)


class HostMemory(NamedTuple):
    """Host memory of one device's offloads: ``in_use`` bytes in host copies (and in ranges whose
    last copies have not yet completed), ``reserved`` bytes held in the pool's slabs."""

    in_use: int
    reserved: int


def host_memory(device: torch.device | str = "cuda") -> HostMemory:
    """The host memory that offloads of ``device``'s tensors hold (see :class:`HostMemory`)."""
    return HostMemory(*_lanes(torch.device(device)).pool.stats())


def empty_host_cache() -> None:
    """Hand the pools' idle slabs (no host copy in them) back to torch's host memory cache
    (pinned memory: ``torch._C._host_emptyCache()`` then releases it to the system)."""
    for lanes in list(_LANES.values()):
        lanes.pool.empty_cache()


# ---------------------------------------------------------------------- activations
@dataclass(eq=False)
class _Saved:
    """What autograd keeps for an offloaded tensor: its host copy and its place in the order of
    the forward pass it was saved in (``run``: weak references to that pass's entries).

    One entry may stand for several saved tensors (the same tensor saved twice, views of one
    base): ``uses`` counts them. The tensor the first of them brings back is held (``held``)
    until all ``uses`` have been unpacked, so that the others take it instead of copying it up
    again, then only referenced weakly (``last``)."""

    copy: HostCopy
    run: list[weakref.ref[_Saved]]
    index: int
    uses: int = 0
    unpacked: int = 0
    held: torch.Tensor | None = None
    last: weakref.ref[torch.Tensor] | None = None

    def restored(self) -> torch.Tensor | None:
        """The tensor an unpack brought back, while it is alive."""
        if self.held is not None:
            return self.held
        return self.last() if self.last is not None else None

    def unpack_done(self, tensor: torch.Tensor) -> None:
        self.last, self.unpacked = weakref.ref(tensor), self.unpacked + 1
        if self.unpacked >= self.uses:  # (a new round for each backward with retain_graph)
            self.held, self.unpacked = None, 0
        else:
            self.held = tensor


class _View(NamedTuple):
    """What autograd keeps for a view offloaded through its base: the base's entry (shared by
    every view of it) and where the view lies in it."""

    base: _Saved
    size: torch.Size
    stride: tuple[int, ...]
    offset: int


VIEW_SPAN = 4  # a view is offloaded through its base when the base is at most this many times it


_Place = tuple[torch.Size, tuple[int, ...], int]  # a view's size, stride and offset in its base


def _through_base(tensor: torch.Tensor) -> tuple[torch.Tensor, _Place | None]:
    """What to offload for ``tensor``: its base where it is a view that lies inside a dense base
    of its dtype at most ``VIEW_SPAN`` times its size (then also the view's place in it), else
    the tensor itself (and None).

    Restoring the base and taking the view of it gives backward the tensor it saved: the same
    strides and storage offset (some kernels choose their algorithm, and so their rounding, by
    layout and alignment), views of one base sharing one storage, and one copy of the base's
    bytes however many views of it are saved (q, k and v of one projection, say)."""
    base = tensor._base
    if (
        base is None
        or type(base) is not torch.Tensor
        or base.dtype != tensor.dtype
        or base.device != tensor.device
        or tensor.numel() == 0
        or base.numel() > VIEW_SPAN * tensor.numel()
        or _unsupported(base) is not None
        or _dense_order(base) is None
    ):
        return tensor, None
    offset = int(tensor.storage_offset() - base.storage_offset())
    last = offset + sum((n - 1) * s for n, s in zip(tensor.shape, tensor.stride(), strict=True))
    extent = 1 + sum((n - 1) * s for n, s in zip(base.shape, base.stride(), strict=True))
    if offset < 0 or last >= extent:
        return tensor, None
    return base, (tensor.shape, tensor.stride(), offset)


class ActivationOffload(torch.autograd.graph.saved_tensors_hooks):
    """A context manager that keeps the tensors autograd saves for backward in host memory,
    compressed; made by :func:`offload_activations`, which documents it.

    Attributes:
        min_bytes, compress, prefetch_bytes, max_inflight_bytes, chunk_bytes: the arguments of
            :func:`offload_activations`.

    Example::

        >>> offload = zipccl.ActivationOffload(min_bytes=1 << 16)  # one for every step
        >>> layer = torch.nn.Linear(512, 512)
        >>> for step in range(2):
        ...     with offload:
        ...         loss = layer(torch.randn(256, 512)).square().mean()
        ...     loss.backward()
    """

    def __init__(
        self,
        *,
        min_bytes: int = 1 << 20,
        compress: bool = True,
        prefetch_bytes: int = 1 << 30,
        max_inflight_bytes: int = 1 << 30,
        chunk_bytes: int = CHUNK_BYTES,
    ) -> None:
        self.min_bytes = _check_count("min_bytes", min_bytes)
        self.compress = _check_bool("compress", compress)
        self.prefetch_bytes = _check_count("prefetch_bytes", prefetch_bytes)
        self.max_inflight_bytes = _check_count("max_inflight_bytes", max_inflight_bytes)
        self.chunk_bytes = _check_chunk_bytes(chunk_bytes)
        self._run: list[weakref.ref[_Saved]] = []
        self._seen: dict[int, tuple[weakref.ref[torch.Tensor], int, weakref.ref[_Saved]]] = {}
        self._inflight: collections.deque[tuple[weakref.ref[HostCopy], int]] = collections.deque()
        self._inflight_bytes = 0
        self._active = False
        super().__init__(self._pack, self._unpack)

    def __enter__(self) -> ActivationOffload:  # type: ignore[override]  # (torch's: None)
        if self._active:
            raise RuntimeError(
                "this offload_activations() is already active: nest a new one instead"
            )
        self._active, self._run, self._seen = True, [], {}
        super().__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        self._active = False
        self._seen = {}
        self._prefetch_below(len(self._run), self._run)  # the backward pass starts at the end

    def keeps(self, tensor: torch.Tensor) -> bool:
        """Whether a saved tensor stays where it is (the rule in :func:`offload_activations`).

        Args:
            tensor (Tensor): a tensor autograd would save.

        Returns:
            bool: True where it is kept, False where it would be offloaded.
        """
        base = tensor._base if tensor._base is not None else tensor
        return (
            type(tensor) is not torch.Tensor  # parameters, subclasses (FakeTensor, DTensor...)
            or isinstance(base, torch.nn.Parameter)
            or (base.is_leaf and base.requires_grad)
            or tensor.numel() * tensor.element_size() < self.min_bytes
            or _unsupported(tensor) is not None
        )

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor | _Saved | _View:
        if self.keeps(tensor):
            return tensor
        source, place = _through_base(tensor)
        saved = self._offload(source)
        saved.uses += 1
        return saved if place is None else _View(saved, *place)

    def _offload(self, tensor: torch.Tensor) -> _Saved:
        seen = self._seen.get(id(tensor))
        if seen is not None and seen[0]() is tensor and seen[1] == tensor._version:
            saved = seen[2]()
            if saved is not None:  # saved twice (unchanged), or a base of several: one copy
                return saved
        with torch.no_grad():
            copy = HostCopy(tensor.detach(), self.compress, self.chunk_bytes)
        saved = _Saved(copy, self._run, len(self._run))
        self._run.append(weakref.ref(saved))
        self._seen[id(tensor)] = (weakref.ref(tensor), tensor._version, weakref.ref(saved))
        self._bound_inflight(copy)
        return saved

    def _bound_inflight(self, copy: HostCopy) -> None:
        """Keep at most ``max_inflight_bytes`` of device memory waiting for its copy down: past
        that, wait (the caller's thread) for the oldest copies to land, so the caching allocator
        can reuse their memory."""
        self._inflight.append((weakref.ref(copy), copy.nbytes))
        self._inflight_bytes += copy.nbytes
        while self._inflight:
            oldest = self._inflight[0][0]()
            over = self._inflight_bytes > self.max_inflight_bytes
            if oldest is not None and not over and not oldest.landed():
                return
            if oldest is not None and over:
                oldest.wait()
            self._inflight_bytes -= self._inflight.popleft()[1]

    def _unpack(self, saved: torch.Tensor | _Saved | _View) -> torch.Tensor:
        if isinstance(saved, _View):
            base = self._restore(saved.base)
            return base.as_strided(saved.size, saved.stride, saved.offset)
        if isinstance(saved, _Saved):
            return self._restore(saved)
        return saved

    def _restore(self, saved: _Saved) -> torch.Tensor:
        tensor = saved.restored()  # saved more than once: the tensor the first unpack returned
        if tensor is None:
            saved.copy.prefetch()
            self._prefetch_below(saved.index, saved.run)
            with torch.no_grad():
                tensor = saved.copy.load()
        saved.unpack_done(tensor)
        return tensor

    def _prefetch_below(self, index: int, run: list[weakref.ref[_Saved]]) -> None:
        """Start bringing back the tensors saved before ``index`` (the backward pass needs them
        next), up to ``prefetch_bytes`` of them counted from ``index`` down."""
        budget = self.prefetch_bytes
        for ref in reversed(run[:index]):
            saved = ref()
            if saved is None or saved.restored() is not None:
                continue
            if budget <= 0:
                return
            saved.copy.prefetch()
            budget -= saved.copy.nbytes


def _check_count(name: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return value


def offload_activations(
    *,
    min_bytes: int = 1 << 20,
    compress: bool = True,
    prefetch_bytes: int = 1 << 30,
    max_inflight_bytes: int = 1 << 30,
    chunk_bytes: int = CHUNK_BYTES,
) -> ActivationOffload:
    """A context manager that keeps the activations autograd saves in host memory, compressed.

    Inside ``with zipccl.offload_activations(): loss = model(x)`` every tensor autograd saves for
    backward is offloaded as :func:`offload_tensor` does (compressed on its device, only the
    compressed bytes copied, on side streams, without the caller's thread waiting for the device),
    unless
    the rule below keeps it. The backward pass brings each one back: when it needs a tensor, the
    ones saved just before it are already on their way (``prefetch_bytes`` of them; the tail of
    the forward pass is sent for when the block exits), so the copies overlap compute. Losses
    and gradients are bit-identical to a run without offload.

    The rule, for each saved tensor:

    * kept as it is (no copy): parameters -- ``nn.Parameter`` objects, other leaves that require
      grad, and views of either --, tensor subclasses, non-strided (sparse...) or quantized
      tensors, tensors on devices other than CUDA and CPU, and tensors under ``min_bytes``;
    * compressed: ``bfloat16``, ``float16``, ``float32``, ``float8_e4m3fn``, ``float8_e5m2``
      (chunks that compression would not shrink are stored raw);
    * copied raw: every other dtype (integers, bool, float64, complex...), and every dtype with
      ``compress=False``.

    Saved tensors come back as they were saved, so that backward computes what it would have:
    a view whose base is at most ``VIEW_SPAN`` (4) times its size is offloaded through its base,
    once for all views of that base, and comes back as the same view (sizes, strides, storage
    offset) of the restored base; other tensors without gaps come back with their strides, other
    views with gaps contiguous. A tensor saved twice (unchanged) is offloaded once. Host copies
    are freed when autograd frees what it saved (after backward, or with the graph);
    ``backward(retain_graph=True)`` brings them back again for each backward pass. CPU tensors
    are "offloaded" to a compact CPU copy by the same code.

    Args:
        min_bytes (int, optional): tensors smaller than this stay; default 1 MiB.
        compress (bool, optional): False offloads every tensor raw on the same streams with the
            same prefetch (the uncompressed baseline); default True.
        prefetch_bytes (int, optional): how much of what the backward pass needs next to bring
            back ahead (device memory it holds); default 1 GiB. 0: each tensor only when needed.
        max_inflight_bytes (int, optional): device memory the forward pass may hold in tensors
            whose copy down has not finished; past it, the caller's thread waits for the oldest
            (bounding peak memory); default 1 GiB.
        chunk_bytes (int, optional): as for :func:`offload_tensor`; default 64 MiB.

    Returns:
        ActivationOffload: the context manager; one instance may be entered again after it
        exits (e.g. once per training step), not while it is active.

    Raises:
        TypeError: an argument of the wrong type.
        ValueError: a negative size, ``chunk_bytes`` below 1 MiB.
        RuntimeError: entering an instance that is already active; in backward, a copy that
            failed (its cause chained).

    Example::

        >>> model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(),
        ...                             torch.nn.Linear(1024, 256))
        >>> x = torch.randn(512, 256)
        >>> with zipccl.offload_activations(min_bytes=1 << 16):
        ...     loss = model(x).square().mean()
        >>> loss.backward()
    """
    return ActivationOffload(
        min_bytes=min_bytes,
        compress=compress,
        prefetch_bytes=prefetch_bytes,
        max_inflight_bytes=max_inflight_bytes,
        chunk_bytes=chunk_bytes,
    )
