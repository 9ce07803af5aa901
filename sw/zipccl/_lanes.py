"""Lanes: several collectives of one group in flight at once, each on a gloo group of its own.

Why: DDP hands its backend one gradient bucket's all-reduce after another while the backward
pass runs and waits for them all only at its end. A gloo group moves one collective's bytes at
a time, and a zipccl call runs to its end on the thread that makes it, so on the host-staged
transport (CUDA tensors through pinned memory over gloo) the buckets queued behind each other:
K gloo groups of the same ranks, each served by a thread of its own, move K at once (2 ranks
sharing one GPU, a 320 M-parameter GPT under DDP: BENCHMARKS.md section 6).

A lane is a worker thread with its own gloo group of the ranks and, through zipccl's per-thread
state, its own side streams, pinned buffers and device tables. :meth:`Lanes.submit` hands the
n-th call to lane n mod K: every rank issues a group's collectives in the same order
(torch.distributed's rule), so every rank's n-th call meets on the same lane, where zipccl's
descriptor exchange checks it as on any group. The caller gets a :class:`LaneWork` at once. On
CUDA the lane's stream starts after the caller's stream at the call, and the Work's future
(CUDA-aware, as NCCL's) orders a waiting stream after the lane's, without blocking the host
until the result is needed; an error on a lane is raised by ``wait()``.
"""

from __future__ import annotations

import contextlib
import itertools
import queue
import threading
import time
import weakref
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

Call = Callable[[dist.ProcessGroup], None]  # one collective, run to its end on the given group
_Job = Callable[[], None]


class LaneWork(dist._Work):
    """What a call handed to a lane returns: its future completes when the lane has run it."""

    def __init__(self, future: torch.futures.Future, outputs: list[torch.Tensor]) -> None:
        super().__init__()
        self._future, self._outputs = future, outputs

    def wait(self, timeout: object = None) -> bool:
        """Until the lane has run the call (its error raised here); a CUDA-aware future, so the
        current stream is then ordered after the lane's."""
        self._future.wait()
        return True

    def is_completed(self) -> bool:
        return self._future.done()

    def is_success(self) -> bool:
        if not self._future.done():
            return False
        try:
            self._future.value()
        except Exception:
            return False
        return True

    def result(self) -> list[torch.Tensor]:
        return self._outputs

    def get_future(self) -> torch.futures.Future:
        return self._future


class Lanes:
    """Worker threads, one per group of ``groups`` (each a gloo group of the same ranks), that
    run the calls :meth:`submit` hands them, round robin.

    Args:
        groups (sequence of ProcessGroup): one per lane; at least one.
        device (torch.device): where the calls' tensors live; a CUDA device gives every lane a
            side stream of its own on it.
    """

    def __init__(self, groups: Sequence[dist.ProcessGroup], device: torch.device) -> None:
        if not groups:
            raise ValueError("zipccl lanes: at least one lane group is needed")
        self.groups = tuple(groups)
        self.device = device
        self._calls = itertools.count()  # next() is atomic: callers on several threads agree
        self._queues: list[queue.SimpleQueue[_Job | None]] = []
        threads = []
        for i in range(len(self.groups)):
            jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
            threads.append(
                threading.Thread(
                    target=_serve, args=(jobs, device), name=f"zipccl-lane-{i}", daemon=True
                )
            )
            threads[-1].start()
            self._queues.append(jobs)
        # stopped and joined when collected or, at the latest, at interpreter exit (finalize's
        # atexit): a lane thread still alive while torch's C++ state is torn down aborts the
        # process
        self.close = weakref.finalize(self, _stop, list(self._queues), threads)

    def submit(
        self, call: Call, outputs: list[torch.Tensor], tensors: list[torch.Tensor]
    ) -> LaneWork:
        """Queue ``call`` on the next lane; ``tensors``: every tensor it reads or writes (kept
        alive, and on CUDA marked used by the lane's stream, until it has run)."""
        lane = next(self._calls) % len(self.groups)
        group = self.groups[lane]
        cuda = self.device.type == "cuda"
        issued = None
        if cuda:
            issued = torch.cuda.Event()
            issued.record(torch.cuda.current_stream(self.device))
        future: torch.futures.Future[list[torch.Tensor]] = torch.futures.Future(
            devices=[self.device] if cuda else None
        )

        def job() -> None:
            try:  # all of it: whatever raises, the waiter gets it and the lane goes on
                if issued is not None:
                    stream = torch.cuda.current_stream(self.device)
                    stream.wait_event(issued)
                    for t in tensors:  # one elsewhere is the call's: refused or copied there
                        if t.device == self.device:
                            t.record_stream(stream)
                call(group)
            except BaseException as error:  # the waiting thread raises it; the lane goes on
                future.set_exception(_as_exception(error))  # type: ignore[arg-type]  # (stub: T)
                return
            future.set_result(outputs)

        self._queues[lane].put(job)
        return LaneWork(future, outputs)

    def __len__(self) -> int:
        return len(self.groups)


def _as_exception(error: BaseException) -> Exception:
    """What a future can hold (an Exception): ``error``, or a RuntimeError that names a
    BaseException such as SystemExit, so that the waiter raises instead of waiting forever."""
    if isinstance(error, Exception):
        return error
    wrapped = RuntimeError(f"zipccl lane: the call raised {error!r}")
    wrapped.__cause__ = error
    return wrapped


def _serve(jobs: queue.SimpleQueue[_Job | None], device: torch.device) -> None:
    """A lane's thread: its jobs in order, on a stream of its own (CUDA), until told to stop."""
    streams: contextlib.AbstractContextManager[object] = contextlib.nullcontext()
    if device.type == "cuda":
        torch.cuda.set_device(device)
        streams = torch.cuda.stream(torch.cuda.Stream(device))
    with streams:
        while (job := jobs.get()) is not None:
            job()


_JOIN_S = 10.0  # at exit, how long lanes still inside calls (a peer gone) may hold it up, in all


def _stop(queues: list[queue.SimpleQueue[_Job | None]], threads: list[threading.Thread]) -> None:
    """Tell every lane to stop after the calls queued so far, and wait for them (``_JOIN_S``
    at most, for all of them together)."""
    for jobs in queues:
        jobs.put(None)
    deadline = time.monotonic() + _JOIN_S
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))


__all__ = ["Call", "LaneWork", "Lanes"]
