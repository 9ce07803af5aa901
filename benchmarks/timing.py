"""CUDA timing for the benchmarks: CUDA-event medians, wall-clock medians, graph replays."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

MIB = 1 << 20


def event_median(fn: Callable[[], object], runs: int, warmup: int = 3) -> float:
    """Median seconds of ``fn`` between two CUDA events on the current stream."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def wall_median(fn: Callable[[], object], runs: int, warmup: int = 2) -> float:
    """Median seconds with a device-wide sync on both sides (for libraries on other streams)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def graph_median(fn: Callable[[], object], runs: int) -> float:
    """Median seconds of ``fn``'s GPU work alone: captured once in a CUDA graph, then replayed
    (no Python launch overhead; one graph launch per run)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()  # warm-up outside the capture: builds, caches, first allocations
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return event_median(graph.replay, runs)


def runs_for(nbytes: int) -> int:
    return int(min(100, max(10, 2e10 / max(nbytes, 1))))


def copy_bandwidth() -> float:
    """Device-to-device copy rate, bytes read + written per second, 1 GiB."""
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    t = event_median(lambda: dst.copy_(src), 20)
    return 2 * src.numel() / t


def recorded() -> torch.cuda.Event:
    """A timing CUDA event recorded now on the current stream."""
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event
