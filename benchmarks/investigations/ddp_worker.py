"""Would DDP on the host-staged transport gain from the zipccl backend's all-reduce running off
the caller's thread? A prototype, measured with the training benchmark.

DDP hands each gradient bucket to the backend from the autograd thread and waits for the
results only at the end of the backward pass. The zipccl backend runs a call to the end on the
calling thread. With ``DDP_WORKER=1`` this script patches the backend's ``allreduce`` to
queue each call on one worker thread instead (first in, first out, on a side stream after the
caller's stream; a CUDA-aware future completes the Work), then runs
``benchmarks.collectives.train_staged`` with the given arguments::

    ZIPCCL_MODE=always DDP_WORKER=1 torchrun --nproc-per-node 2 \\
        -m benchmarks.investigations.ddp_worker --strategy ddp --backend zipccl \\
        --out OUT --warmup 3 --steps 30

Without the variable it is the training benchmark unchanged, the A of the A/B
(BENCHMARKS.md section 6 has the result).
"""

from __future__ import annotations

import os
import queue
import runpy
import sys
import threading
from collections.abc import Callable

import torch
import torch.distributed as dist
from zipccl import backend


class _QueuedWork(dist._Work):
    """The Work of a call queued on the worker: its future completes when the call has."""

    def __init__(self, future: torch.futures.Future, result: list[torch.Tensor]) -> None:
        super().__init__()
        self._future, self._result = future, result

    def wait(self, timeout: object = None) -> bool:
        self._future.wait()
        return True

    def is_completed(self) -> bool:
        return self._future.done()

    def is_success(self) -> bool:
        return True

    def result(self) -> list[torch.Tensor]:
        return self._result

    def get_future(self) -> torch.futures.Future:
        return self._future


def _serve(jobs: queue.SimpleQueue[Callable[[torch.cuda.Stream], None]]) -> None:
    torch.cuda.set_device(0)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        while True:
            jobs.get()(side)


def patch_allreduce() -> None:
    """Queue the backend's single-tensor CUDA all-reduces on one worker thread."""
    jobs: queue.SimpleQueue[Callable[[torch.cuda.Stream], None]] = queue.SimpleQueue()
    threading.Thread(target=_serve, args=(jobs,), daemon=True).start()
    inline = backend.ProcessGroupZipccl.allreduce

    def allreduce(self, tensors, opts=None):  # type: ignore[no-untyped-def]
        if len(tensors) != 1 or not tensors[0].is_cuda:
            return inline(self, tensors, opts)
        issued = torch.cuda.Event()
        issued.record()
        future = torch.futures.Future(devices=[tensors[0].device])

        def job(side: torch.cuda.Stream) -> None:
            side.wait_event(issued)
            tensors[0].record_stream(side)
            try:
                inline(self, tensors, opts).wait()
                future.set_result(tensors)
            except Exception as exc:  # the waiting rank raises it
                future.set_exception(exc)

        jobs.put(job)
        return _QueuedWork(future, tensors)

    backend.ProcessGroupZipccl.allreduce = allreduce  # type: ignore[method-assign]


if __name__ == "__main__":
    if os.environ.get("DDP_WORKER") == "1":
        patch_allreduce()
    sys.argv = ["train_staged", *sys.argv[1:]]
    runpy.run_module("benchmarks.collectives.train_staged", run_name="__main__")
