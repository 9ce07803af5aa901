"""The process group as zipccl's protocols see it, and how their buffers cross it.

A :class:`Group` knows where a call's tensors live (``device``) and what carries them: NCCL moves
device buffers, gloo host buffers, and a gloo group given CUDA tensors is *staged* -- its buffers
cross through pinned host memory, which the transport fills and drains on the protocol's side
streams so that the copies of one chunk overlap the wire of another. Also here: the side streams
that pipeline a call and the Work a compressed call returns.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

import torch
import torch.distributed as dist

from zipccl import _groups, _streams
from zipccl.collectives import _stripes


class Forwarding:
    """Marks a process group whose own collectives call zipccl's on inner groups (the ``zipccl``
    backend): zipccl's functions hand a call on it straight to torch.distributed, which brings
    it back through the backend, instead of compressing it twice."""


@dataclass(frozen=True)
class Group:
    """A resolved process group: the handle torch wants plus what the protocols need. It holds
    the group weakly (``ref``; None: the default group), as the caches that keep it (resolved
    groups, plans) must not keep a group the script destroys alive (zipccl._groups)."""

    ref: weakref.ReferenceType[dist.ProcessGroup] | None
    rank: int
    world: int
    device: torch.device  # where the call's tensors and the codec's buffers live
    backend: str
    staged: bool = False  # CUDA tensors on a host transport (gloo): buffers cross pinned memory

    @functools.cached_property
    def cuda(self) -> bool:
        """The codec runs on the GPU, its work pipelined on side streams."""
        return self.device.type == "cuda"

    @functools.cached_property
    def nccl(self) -> bool:
        """Device buffers go on the wire as they are (else the wire reads host memory)."""
        return self.cuda and not self.staged

    @property
    def pg(self) -> dist.ProcessGroup | None:
        """The group torch.distributed's calls take (None: the default group)."""
        if self.ref is None:
            return None
        pg = self.ref()
        if pg is None:
            raise RuntimeError("zipccl: this call's process group has been destroyed")
        return pg

    @property
    def handle(self) -> dist.ProcessGroup:
        """The process group object itself (the default one for ``pg`` None): its own
        collectives skip torch.distributed's Python wrappers, which cost a small call more."""
        pg = _groups.current(self.pg)
        if pg is None:
            raise RuntimeError("torch.distributed is not initialised")
        return pg

    @property
    def wire(self) -> torch.device:
        """Where the transport reads and writes: the device for NCCL, the host for gloo."""
        return torch.device("cpu") if self.staged else self.device


def resolve(group: dist.ProcessGroup | None, like: torch.Tensor | None = None) -> Group:
    """The group's rank, size and backend, and where the call's buffers live: NCCL's device
    (``like``'s own if it is a CUDA tensor), else the host -- or, for CUDA tensors on a host
    backend (gloo), the tensors' device, with the transport staged through pinned memory.
    Cached per group and device (every call resolves its group; torch's lookups cost more than
    a small call's own work)."""
    if not dist.is_initialized():
        raise RuntimeError("torch.distributed is not initialised: call init_process_group first")
    on = like.device if like is not None and (like.is_cuda or STAGE_HOST_TENSORS) else None
    key = (_groups.key(group), on)  # a new default group: a new key
    found = _RESOLVED.get(key)
    if found is None:
        found = _resolve(group, on)
        if on is not None or not found.nccl:  # else: the current CUDA device, which may change
            _RESOLVED[key] = found
    return found


_RESOLVED: dict[tuple, Group] = {}  # by group token (_groups.key) and device


def _resolve(group: dist.ProcessGroup | None, on: torch.device | None) -> Group:
    backend = str(dist.get_backend(group)).lower()
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    ref = weakref.ref(group) if group is not None else None
    if "nccl" in backend:
        device = on if on is not None else torch.device("cuda", torch.cuda.current_device())
        return Group(ref, rank, world, device, backend)
    if on is not None:
        return Group(ref, rank, world, on, backend, staged=True)
    return Group(ref, rank, world, torch.device("cpu"), backend)


#  Tests and benchmarks only: stage host tensors too, so that the staged transport's chunking,
#  ordering and copies run on a machine without a GPU (plain host memory stands for the device)
STAGE_HOST_TENSORS = False


def global_rank(g: Group, rank: int) -> int:
    return dist.get_global_rank(g.pg, rank) if g.pg is not None else rank


class DoneWork(dist._Work):
    """What ``async_op=True`` returns for a collective whose work is already enqueued in order.

    Compressed collectives finish their host-side protocol before returning and leave the
    caller's current stream ordered after all their GPU work. The future is CUDA-aware, as
    NCCL's is: waiting on it (``wait()``, ``get_future().wait()``/``then``) orders the waiting
    stream after the stream that issued the call, without blocking the host.
    """

    def __init__(self, result: list[torch.Tensor] | None = None) -> None:
        super().__init__()
        self._result = result
        devices = {t.device for t in result or () if t.is_cuda}
        self._future: torch.futures.Future = torch.futures.Future(devices=list(devices) or None)
        self._future.set_result(result)

    def wait(self, timeout: object = None) -> bool:
        self._future.wait()
        return True

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    # torch's stub has Work.result() -> list[Tensor]; this returns None for a collective without
    # outputs (as it always has), which the stub cannot express
    def result(self) -> list[torch.Tensor] | None:  # type: ignore[override]
        return self._result

    def get_future(self) -> torch.futures.Future:
        return self._future


def done(async_op: bool) -> DoneWork | None:
    """What a compressed call returns: torch's convention, a Work only when async_op."""
    return DoneWork() if async_op else None


@dataclass
class Streams:
    """Side streams for pipelining on CUDA (compress | NCCL | decompress); none on CPU."""

    compress: torch.cuda.Stream | None
    decompress: torch.cuda.Stream | None

    def on(self, stream: torch.cuda.Stream | None) -> contextlib.AbstractContextManager[None]:
        """Make ``stream`` current inside the block (zipccl._streams.on: a protocol switches
        streams a few times per chunk)."""
        return _streams.on(stream)


def streams_for(g: Group) -> Streams:
    """This thread's side streams on ``g``'s device: calls on different threads (a backend's
    lanes) pipeline independently instead of queueing behind each other's kernels."""
    if not g.cuda:
        return Streams(None, None)
    return per_thread(
        ("streams", g.device),
        lambda: Streams(torch.cuda.Stream(g.device), torch.cuda.Stream(g.device)),
    )


@contextlib.contextmanager
def ordered(g: Group, streams: Streams) -> Iterator[None]:
    """Side streams start after the caller's work and the caller resumes after theirs.

    All temporaries are allocated on the caller's stream, so this ordering is also what keeps the
    caching allocator from handing a buffer back out while a side stream still reads it.
    """
    if not g.cuda:
        yield
        return
    main = torch.cuda.current_stream(g.device)
    compress, decompress = streams.compress, streams.decompress
    assert compress is not None and decompress is not None  # streams_for made both on CUDA
    sides = (compress, decompress)
    for s in sides:
        s.wait_stream(main)
    try:
        yield
    finally:
        for s in sides:
            main.wait_stream(s)


_LOCAL = threading.local()


_T = TypeVar("_T")


def per_thread(key: tuple, make: Callable[[], _T]) -> _T:
    """This thread's object under ``key``, made on first use: small buffers a call reuses, which
    that call is done with (its host reads waited for them) before the thread's next call."""
    kept = _LOCAL.__dict__.setdefault("kept", {})
    if key not in kept:
        kept[key] = make()
    return kept[key]


# --------------------------------------------------------------------------- the wire

#  torch 2.13 renamed the tensor forms (the old names warn); older torch has only the old ones
ALL_GATHER = "all_gather_single" if hasattr(dist, "all_gather_single") else "all_gather_into_tensor"
REDUCE_SCATTER = (
    "reduce_scatter_single" if hasattr(dist, "reduce_scatter_single") else "reduce_scatter_tensor"
)


def native_all_gather(
    out: torch.Tensor, inp: torch.Tensor, group: dist.ProcessGroup | None, async_op: bool = False
) -> dist.Work | None:
    """torch.distributed's all-gather into one tensor, under this torch's current name."""
    return getattr(dist, ALL_GATHER)(out, inp, group, async_op)


def native_reduce_scatter(
    out: torch.Tensor,
    inp: torch.Tensor,
    op: object,
    group: dist.ProcessGroup | None,
    async_op: bool = False,
) -> dist.Work | None:
    """torch.distributed's reduce-scatter of one tensor, under this torch's current name."""
    return getattr(dist, REDUCE_SCATTER)(out, inp, op, group, async_op)


class Pending:
    """A transfer in flight, one Work or several (a staged call's stripes): :meth:`wait` makes
    its results usable on the current stream (NCCL: the stream waits, the host does not; gloo:
    the host waits for the wire)."""

    def __init__(self, work: dist.Work | list[dist.Work | None] | None) -> None:
        self.works = work if isinstance(work, list) else [work]

    def wait(self) -> None:
        for work in self.works:
            if work is not None:
                work.wait()


class _Staged(Pending):
    """A staged transfer: once the wire is done, the received host bytes are copied up into
    ``into`` on the current stream (the pinned buffer stays reserved until that copy ran: the
    caching host allocator records the stream's use)."""

    def __init__(
        self,
        work: dist.Work | list[dist.Work | None] | None,
        into: torch.Tensor | None,
        host: torch.Tensor | None,
    ) -> None:
        super().__init__(work)
        self.into, self.host = into, host

    def wait(self) -> None:
        super().wait()
        if self.into is not None and self.host is not None:
            self.into.copy_(self.host, non_blocking=True)


def _pinned(like: torch.Tensor, copies: int = 1) -> torch.Tensor:
    """An uninitialised host tensor of ``copies`` times ``like``'s values, pinned for a CUDA
    ``like`` (the caching host allocator reuses them: pinning fresh memory every chunk would
    cost more than the copy)."""
    numel = copies * like.numel()
    return torch.empty(numel, dtype=like.dtype, pin_memory=like.is_cuda).view(
        like.shape if copies == 1 else (numel,)
    )


def _down(t: torch.Tensor, copies: int = 1) -> torch.Tensor:
    """``copies`` copies of the flat ``t`` end to end in host memory, once everything queued on
    the current stream (the encode that wrote ``t``) and the copies are done: the host waits
    here, and only here, before the wire reads the bytes. The previous chunks are on the wire
    meanwhile (the protocols send ahead: zipccl.collectives._protocols.pipelined)."""
    host = _pinned(t, copies)
    for part in host.view(copies, -1) if copies > 1 else (host,):
        part.copy_(t.view(part.shape), non_blocking=True)
    if t.is_cuda:
        torch.cuda.current_stream(t.device).synchronize()
    return host


def all_gather(g: Group, out: torch.Tensor, inp: torch.Tensor, chunk: int = 0) -> Pending:
    """Every rank's flat ``inp`` into ``out`` in rank order, after the current stream's queued
    work (``chunk``: a protocol's chunk number, whose stripe carries it on a staged group). On
    gloo, an all-to-all of ``inp`` repeated for every rank: gloo's all-gather moves the same
    bytes several times slower (benchmarks/collectives: gloo_ops)."""
    if g.nccl:
        return Pending(native_all_gather(out, inp, g.pg, async_op=True))
    if not g.staged:
        repeated = inp.repeat(g.world)
        return Pending(dist.all_to_all_single(out, repeated, group=g.pg, async_op=True))
    host, wire = _pinned(out), _stripes.wire(g.pg, chunk)
    work = dist.all_to_all_single(host, _down(inp, g.world), group=wire, async_op=True)
    return _Staged(work, out, host)


def all_to_all(
    g: Group,
    out: torch.Tensor,
    inp: torch.Tensor,
    out_splits: list[int] | None = None,
    in_splits: list[int] | None = None,
    down: Prestaged | None = None,
    chunk: int = 0,
) -> Pending:
    """all_to_all_single of ``inp`` into ``out`` (None splits: even), after the current
    stream's queued work (``down``: a staged group's ``inp`` already on its way to the host;
    ``chunk``: a protocol's chunk number, whose stripe carries it)."""
    if not g.staged:
        return Pending(
            dist.all_to_all_single(out, inp, out_splits, in_splits, group=g.pg, async_op=True)
        )
    host, sent = _pinned(out), _down(inp) if down is None else down.host()
    wire = _stripes.wire(g.pg, chunk)
    work = dist.all_to_all_single(host, sent, out_splits, in_splits, group=wire, async_op=True)
    return _Staged(work, out, host)


def broadcast(
    g: Group, buf: torch.Tensor, src: int, down: Prestaged | None = None, chunk: int | None = None
) -> Pending:
    """Group rank ``src``'s ``buf`` into every other rank's ``buf``, after the current stream's
    queued work (``down``: ``buf``'s host buffer, the source's bytes already on their way).
    On a staged group ``chunk`` (a protocol's chunk number) picks the stripe that carries it;
    None: the whole buffer in stripes, all at once (a native broadcast)."""
    if not g.staged:
        return Pending(dist.broadcast(buf, global_rank(g, src), group=g.pg, async_op=True))
    host = down.host() if down is not None else _down(buf) if g.rank == src else _pinned(buf)
    root = global_rank(g, src)
    parts = (
        _stripes.cut(g.pg, host, g.world) if chunk is None else [(host, _stripes.wire(g.pg, chunk))]
    )
    works = [dist.broadcast(part, root, group=wire, async_op=True) for part, wire in parts]
    return _Staged(works, None if g.rank == src else buf, host)


def all_reduce(
    g: Group, buf: torch.Tensor, op: dist.ReduceOp | dist.ReduceOp.RedOpType, down: Prestaged
) -> Pending:
    """A staged group's native all-reduce of ``buf`` in place, its bytes ``down`` already on
    their way to the host: gloo's own reduction of the host bytes, as its CUDA path runs it, in
    stripes where that gives the same bits (zipccl.collectives._stripes)."""
    host = down.host()
    parts = _stripes.cut(g.pg, host, g.world, op)
    works = [dist.all_reduce(part, op, group=wire, async_op=True) for part, wire in parts]
    return _Staged(works, buf, host)


class Prestaged:
    """A staged call's input copied down to pinned memory from before its agreement: the copy
    runs while the host exchanges the descriptor, where gloo's own CUDA path would start it only
    after. What a native call on a staged group then runs is gloo's own op on these host bytes,
    with the result copied up on the current stream (:func:`broadcast`, :func:`all_reduce`,
    :func:`all_to_all`)."""

    def __init__(self, t: torch.Tensor, sends: bool = True) -> None:
        """``t``'s bytes on their way down; ``sends`` False: a host buffer like ``t`` only (a
        broadcast's receiver)."""
        self._host = _pinned(t)
        self._ready = torch.cuda.Event() if t.is_cuda and sends else None
        if sends:
            self._host.copy_(t, non_blocking=True)
        if self._ready is not None:
            self._ready.record(torch.cuda.current_stream(t.device))

    def host(self) -> torch.Tensor:
        """The host bytes, once the copy down is done (the host waits for that copy only)."""
        if self._ready is not None:
            self._ready.synchronize()
        return self._host
