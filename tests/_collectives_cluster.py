"""A small pool of gloo worker processes for the collectives tests.

Spawning torch processes costs seconds on a 2-core machine, so a test module starts W workers once
(``Cluster``) and sends each test's scenario (a module-level function name plus arguments) to all
of them. Every wait has a timeout: a protocol bug fails the test instead of hanging CI, and the
gloo process group itself times out after ``GLOO_TIMEOUT_S``.
"""

from __future__ import annotations

import importlib
import os
import queue
import tempfile
import traceback
from collections.abc import Iterator
from datetime import timedelta

import pytest
import torch.multiprocessing as mp

GLOO_TIMEOUT_S = 30
RESULT_TIMEOUT_S = 90


def _worker(rank: int, world: int, store_path: str, inbox: mp.Queue, outbox: mp.Queue) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # auto mode's profile cache goes to the cluster's temp dir, not the user's home
    os.environ["ZIPCCL_CACHE_DIR"] = os.path.join(os.path.dirname(store_path), "cache")
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        store=dist.FileStore(store_path, world),
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=GLOO_TIMEOUT_S),
    )
    while True:
        job = inbox.get()
        if job is None:
            break
        module, name, args, env = job
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            fn = getattr(importlib.import_module(module), name)
            outbox.put((rank, "ok", fn(rank, world, *args)))
        except BaseException:
            outbox.put((rank, "error", traceback.format_exc()))
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    dist.destroy_process_group()


class Cluster:
    """W gloo workers; restarted on the next run after a hang killed them."""

    def __init__(self, world: int) -> None:
        self.world = world
        self._procs: list = []

    def _start(self) -> None:
        ctx = mp.get_context("spawn")
        world = self.world
        self._dir = tempfile.TemporaryDirectory()
        store = os.path.join(self._dir.name, "store")
        self._inboxes = [ctx.Queue() for _ in range(world)]
        self._outbox = ctx.Queue()
        self._procs = [
            ctx.Process(
                target=_worker, args=(r, world, store, self._inboxes[r], self._outbox), daemon=True
            )
            for r in range(world)
        ]
        for p in self._procs:
            p.start()

    def run(self, fn, *args, env: dict[str, str] | None = None) -> list[object]:
        """Run ``fn(rank, world, *args)`` on every rank; the per-rank results, rank order."""
        if not self._procs:
            self._start()
        for box in self._inboxes:
            box.put((fn.__module__, fn.__name__, args, dict(env or {})))
        results: dict[int, tuple[str, object]] = {}
        try:
            for _ in range(self.world):
                rank, status, value = self._outbox.get(timeout=RESULT_TIMEOUT_S)
                results[rank] = (status, value)
        except queue.Empty:
            self.close()
            missing = sorted(set(range(self.world)) - set(results))
            raise TimeoutError(
                f"{fn.__name__}: ranks {missing} did not answer within {RESULT_TIMEOUT_S} s (hang)"
            ) from None
        errors = [f"rank {r}:\n{v}" for r, (s, v) in sorted(results.items()) if s == "error"]
        if errors:
            raise AssertionError("\n".join(errors))
        return [results[r][1] for r in range(self.world)]

    def close(self) -> None:
        if not self._procs:
            return
        for box in self._inboxes:
            box.put(None)
        for p in self._procs:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
        self._dir.cleanup()
        self._procs = []


def sc_short_timeout_world(
    rank: int, world: int, backend: str, store_path: str, timeout_s: float
) -> str:
    """Re-create the worker's default group with a ``timeout_s`` timeout (``backend``: gloo or
    zipccl): a rank left waiting then fails its test soon instead of blocking CI."""
    import torch.distributed as dist
    import zipccl  # noqa: F401  (registers the zipccl backend)

    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group(
        backend,
        store=dist.FileStore(store_path, world),
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=timeout_s),
    )
    return dist.get_backend()


def short_timeout_cluster(
    world: int, backend: str, store_dir: str, timeout_s: float
) -> Iterator[Cluster]:
    """A module fixture's body: W workers whose group times out after ``timeout_s``."""
    ranks = Cluster(world)
    store = os.path.join(store_dir, "store")
    assert ranks.run(sc_short_timeout_world, backend, store, timeout_s) == [backend] * world
    yield ranks
    ranks.close()


def module_cluster(world: int) -> object:
    """A module-scoped fixture of ``world`` workers (a test module's ``pair``, ``trio``)."""

    @pytest.fixture(scope="module")
    def cluster() -> Iterator[Cluster]:
        c = Cluster(world)
        yield c
        c.close()

    return cluster
