"""One tensor's host copy (:class:`HostCopy`, made by :func:`offload_tensor`): its chunks
compressed on the device, copied down for a guessed or exact size, settled, and brought back
(the package docstring tells the whole way)."""

from __future__ import annotations

import functools
import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from zipccl.codec import (
    Compressed,
    _expected_size,
    compress_into,
    decompress,
    max_compressed_bytes,
)
from zipccl.golden.container import HEADER_BYTES, LAYOUT_RAW, Header
from zipccl.offload import _lanes
from zipccl.offload._host_pool import HostRange

CODED = frozenset(
    {torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn, torch.float8_e5m2}
)
CHUNK_BYTES = 64 << 20  # a chunk is compressed while the one before it is copied
MIN_CHUNK_BYTES = 1 << 20
_CHUNK_ELEMENTS = 4096  # chunks hold whole codec blocks (codec.DEFAULT_BLOCK)


def dense_order(t: torch.Tensor) -> list[int] | None:
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
        self._lanes = _lanes.of(tensor.device)
        self._order = dense_order(tensor)
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
            _lanes.wait(lanes.d2h, piece.ready)
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
            _lanes.wait(lanes.d2h, piece.ready)
            host.view.copy_(source[start:nbytes], non_blocking=True)
            _lanes.used_on(source, lanes.d2h)
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
            if not _lanes.landed(copied):
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
        return all(p.landing is None and _lanes.landed(p.copied) for p in self._pieces)

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
        _lanes.wait(caller, ticket.done)
        _lanes.used_on(tensor, caller)
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
                _lanes.used_on(tensor, lanes.h2d)  # raw chunks are copied into it there
                _lanes.wait(lanes.h2d, lanes.mark(lanes.decode))  # see _fresh in _lanes
                try:
                    for piece in self._pieces:
                        self._load_piece(piece, flat)
                finally:
                    _lanes.wait(lanes.decode, lanes.mark(lanes.h2d))
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
        _lanes.wait(lanes.h2d, piece.copied)
        if piece.head is None or piece.head.layout == LAYOUT_RAW:
            if piece.head is not None:
                parts[0] = parts[0][HEADER_BYTES:]
            with lanes.on(lanes.h2d):
                _lanes.copy_parts(target.view(torch.uint8), parts)
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


def _source(piece: _Piece) -> torch.Tensor:
    assert piece.source is not None, "a chunk's source is let go only once it is stored"
    return piece.source


def _chunk_elements(flat: torch.Tensor, chunk_bytes: int) -> int:
    blocks = max(1, chunk_bytes // (flat.element_size() * _CHUNK_ELEMENTS))
    return blocks * _CHUNK_ELEMENTS


def check_chunk_bytes(chunk_bytes: object) -> int:
    if not isinstance(chunk_bytes, int) or isinstance(chunk_bytes, bool):
        raise TypeError(f"chunk_bytes must be an int, got {type(chunk_bytes).__name__}")
    if chunk_bytes < MIN_CHUNK_BYTES:
        raise ValueError(f"chunk_bytes must be at least {MIN_CHUNK_BYTES}, got {chunk_bytes}")
    return chunk_bytes


def check_bool(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return value


def unsupported(tensor: torch.Tensor) -> str | None:
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
    check_bool("compress", compress)
    chunk_bytes = check_chunk_bytes(chunk_bytes)
    why = unsupported(tensor)
    if why is not None:
        raise ValueError(f"cannot offload {why}")
    with torch.no_grad():
        return HostCopy(tensor.detach(), compress, chunk_bytes)
