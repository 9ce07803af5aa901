"""The process group as zipccl's protocols see it, and how their buffers cross it.

A :class:`Group` knows where a call's tensors live (``device``) and what carries them: NCCL moves
device buffers, gloo host buffers, and a gloo group given CUDA tensors is *staged* -- its buffers
cross through pinned host memory, which the transport fills and drains on the protocol's side
streams so that the copies of one chunk overlap the wire of another. Also here: the side streams
that pipeline a call and the Work a compressed call returns.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

import torch
import torch.distributed as dist


class Forwarding:
    """Marks a process group whose own collectives call zipccl's on inner groups (the ``zipccl``
    backend): zipccl's functions hand a call on it straight to torch.distributed, which brings
    it back through the backend, instead of compressing it twice."""


@dataclass(frozen=True)
class Group:
    """A resolved process group: the handle torch wants plus what the protocols need."""

    pg: dist.ProcessGroup | None
    rank: int
    world: int
    device: torch.device  # where collective buffers must live (cuda for NCCL, cpu for gloo)
    backend: str

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"


def resolve(group: dist.ProcessGroup | None, like: torch.Tensor | None = None) -> Group:
    """The group's rank, size, backend and buffer device (the tensor's own if it is a CUDA one)."""
    if not dist.is_initialized():
        raise RuntimeError("torch.distributed is not initialised: call init_process_group first")
    backend = str(dist.get_backend(group)).lower()
    if "nccl" in backend:
        device = (
            like.device
            if like is not None and like.is_cuda
            else torch.device("cuda", torch.cuda.current_device())
        )
    else:
        device = torch.device("cpu")
    return Group(group, dist.get_rank(group), dist.get_world_size(group), device, backend)


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

    @contextlib.contextmanager
    def on(self, stream: torch.cuda.Stream | None) -> Iterator[None]:
        """Make ``stream`` current inside the block. A protocol switches streams a few times per
        chunk, and ``torch.cuda.stream`` costs ~30 us of host time per switch (device lookups),
        so this calls torch's own setter directly where it exists."""
        if stream is None:
            yield
        elif (
            _SET_STREAM is None
            or _GET_STREAM is None
            or torch.cuda.current_device() != stream.device_index
        ):
            with torch.cuda.stream(stream):
                yield
        else:
            before = _GET_STREAM(stream.device_index)
            _SET_STREAM(
                stream_id=stream.stream_id,
                device_index=stream.device_index,
                device_type=stream.device_type,
            )
            try:
                yield
            finally:
                _SET_STREAM(stream_id=before[0], device_index=before[1], device_type=before[2])


_GET_STREAM = getattr(torch._C, "_cuda_getCurrentStream", None)


_SET_STREAM = getattr(torch._C, "_cuda_setStream", None)


_STREAMS: dict[torch.device, Streams] = {}


def streams_for(g: Group) -> Streams:
    if not g.cuda:
        return Streams(None, None)
    if g.device not in _STREAMS:
        _STREAMS[g.device] = Streams(torch.cuda.Stream(g.device), torch.cuda.Stream(g.device))
    return _STREAMS[g.device]


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
