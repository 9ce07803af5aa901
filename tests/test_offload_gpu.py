"""zipccl.offload on CUDA: side streams, pinned host copies, the worker that reads sizes off the
caller's thread, and activation offloading with gradients bit-identical to a run without it."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import zipccl
from zipccl import codec, offload
from zipccl.golden.container import LAYOUT_RAW
from zipccl.offload import _lanes

from tests.test_offload import (
    CODED,
    OTHER,
    Saves,
    mlp,
    run_benchmark_smoke,
    same,
    sample,
    step,
)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

CUDA = torch.device("cuda")


@pytest.fixture(scope="module", autouse=True)
def kernels_built() -> None:
    """Fail loudly if the kernels did not build: the torch fallback syncs on every size."""
    from zipccl import _cuda

    assert _cuda.available()


def cuda_in_use() -> int:
    torch.cuda.synchronize()
    _lanes.of(CUDA).drain()
    return offload.host_memory(CUDA).in_use


@pytest.mark.parametrize("dtype", CODED + OTHER)
def test_round_trip_every_dtype(dtype: torch.dtype) -> None:
    x = sample((512, 1000), dtype).to(CUDA)
    copy = zipccl.offload_tensor(x)
    y = copy.load()
    assert y.is_cuda and same(y, x) and y.stride() == x.stride()
    assert all(p.host is not None and p.host.view.is_pinned() for p in copy._pieces)


def test_chunks_pipelined_and_views() -> None:
    x = torch.randn(8 << 20, dtype=torch.bfloat16, device=CUDA)  # 16 MiB: 16 chunks of 1 MiB
    copy = zipccl.offload_tensor(x, chunk_bytes=1 << 20)
    assert len(copy._pieces) == 16 and same(copy.load(), x)
    assert copy.host_bytes < 0.75 * copy.nbytes
    for view in (x.view(4096, 2048).t(), x.view(4096, 2048)[:, ::3]):
        assert same(zipccl.offload_tensor(view).load(), view)


def test_the_caller_thread_does_not_wait_for_the_device() -> None:
    """Queued behind a long kernel, the copy is not done when offload_tensor returns; nor is
    the loaded tensor ready when load returns, yet the stream sees the right values."""
    x = torch.randn(1 << 22, dtype=torch.bfloat16, device=CUDA)
    torch.cuda.synchronize()
    torch.cuda._sleep(1 << 30)  # ~0.5 s of one busy kernel on the current stream
    copy = zipccl.offload_tensor(x)
    assert not copy.landed()
    y = copy.load()
    assert same(y, x)


def test_a_kind_seen_before_goes_down_before_its_size_is_known() -> None:
    """The second tensor of a kind has its chunks' copies queued on the caller's thread behind a
    busy kernel, for the first one's ratio; a chunk that compresses worse (random bits, stored
    raw) is completed by a tail copy, and the tensor comes back bit for bit."""
    x = torch.randn(1 << 21, dtype=torch.bfloat16, device=CUDA)  # 4 MiB: 4 chunks of 1 MiB
    zipccl.offload_tensor(x, chunk_bytes=1 << 20).wait()
    y = x.clone()
    bits = torch.randint(-(1 << 15), 1 << 15, (1 << 19,), dtype=torch.int16, device=CUDA)
    y[1 << 20 : 3 << 19] = bits.view(torch.bfloat16)
    torch.cuda.synchronize()
    torch.cuda._sleep(1 << 28)
    copy = zipccl.offload_tensor(y, chunk_bytes=1 << 20)
    assert not copy.landed() and all(p.landing is not None for p in copy._pieces)
    assert same(copy.load(), y)
    heads = [p.head for p in copy._pieces]
    assert [h.layout == LAYOUT_RAW for h in heads] == [False, False, True, False]
    assert [p.tail is not None for p in copy._pieces] == [False, False, True, False]
    assert [sum(v.numel() for v in p.parts()) for p in copy._pieces] == [
        codec._expected_size(h) for h in heads
    ]


def test_compressed_copy_holds_the_value_at_the_call() -> None:
    x = torch.randn(1 << 20, dtype=torch.float16, device=CUDA)
    want = x.clone()
    torch.cuda._sleep(1 << 28)
    copy = zipccl.offload_tensor(x)
    x.add_(1)  # queued after the compression on the same stream
    assert same(copy.load(), want)


def test_load_on_another_stream() -> None:
    x = torch.randn(1 << 20, dtype=torch.bfloat16, device=CUDA)
    copy = zipccl.offload_tensor(x)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        y = copy.load()
        z = y * 1
    side.synchronize()
    assert same(z, x)


@contextlib.contextmanager
def deterministic() -> Iterator[None]:
    """torch's deterministic mode, in which new memory is filled (NaN, the largest integer) by a
    kernel on the stream that allocates it (warn_only: cuBLAS may lack its workspace setting)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        torch.use_deterministic_algorithms(True, warn_only=True)
        try:
            yield
        finally:
            torch.use_deterministic_algorithms(False)


@pytest.mark.parametrize("compress", [True, False])
def test_fresh_memory_is_filled_before_the_copy_up_lands(compress: bool) -> None:
    """The worker's new device memory (the loaded tensor, a new staging slot) is filled on the
    decode stream in deterministic mode; the copies up on the h2d stream must come after that
    fill, even when the decode stream is busy."""
    x = torch.randn(1 << 20, dtype=torch.bfloat16, device=CUDA)
    lanes = _lanes.of(CUDA)
    with deterministic():
        copy = zipccl.offload_tensor(x, compress=compress)
        copy.wait()
        lanes.drain()  # (the worker is idle: the staging ring may be reset from here)
        lanes._slots = [None] * _lanes.STAGING_SLOTS
        lanes._slot_free = [None] * _lanes.STAGING_SLOTS
        with torch.cuda.stream(lanes.decode):
            torch.cuda._sleep(1 << 28)  # the fill queues behind this on the decode stream
        y = copy.load()
        assert same(y, x)
    zipccl.check_errors()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("compress", [True, False])
@pytest.mark.parametrize("mode", ["default", "deterministic"])
def test_gradients_bit_identical(dtype: torch.dtype, compress: bool, mode: str) -> None:
    model = mlp(dtype).to(CUDA)
    x = sample((4096, 64), dtype, seed=1).to(CUDA)
    with deterministic() if mode == "deterministic" else contextlib.nullcontext():
        loss, grads = step(model, x)
        hooks = zipccl.offload_activations(
            min_bytes=1 << 16, compress=compress, prefetch_bytes=1 << 20
        )
        before = cuda_in_use()
        for _ in range(2):
            loss2, grads2 = step(model, x, hooks)
            assert same(loss, loss2)
            assert all(same(a, b) for a, b in zip(grads, grads2, strict=True))
        assert cuda_in_use() == before  # every host copy given back after backward


@pytest.mark.parametrize("dtype", CODED + OTHER)
def test_every_saved_dtype_comes_back(dtype: torch.dtype) -> None:
    x = sample((5000,), torch.float32, seed=2).to(CUDA).requires_grad_()
    extra = sample((400, 500), dtype, seed=3).to(CUDA)
    with zipccl.offload_activations(min_bytes=0, max_inflight_bytes=0) as hooks:
        y = Saves.apply(x * 1, extra, extra.t())
    assert len(hooks._run) == 2  # x * 1, and extra once (extra.t() is a view of it)
    y.sum().backward()


def test_retain_graph_on_cuda() -> None:
    model, x = mlp(torch.bfloat16).to(CUDA), sample((4096, 64), torch.bfloat16, seed=6).to(CUDA)
    loss = model(x).float().square().mean()
    loss.backward(retain_graph=True)
    loss.backward()
    want = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    with zipccl.offload_activations(min_bytes=1 << 16):
        loss = model(x).float().square().mean()
    loss.backward(retain_graph=True)
    loss.backward()
    assert all(same(p.grad, w) for p, w in zip(model.parameters(), want, strict=True))


def test_benchmark_smoke_on_cuda(tmp_path: Path) -> None:
    """The benchmark's transformer (deterministic mode, flash attention, q/k/v views of one
    projection) trains bit-identically without offload, offloaded raw and compressed."""
    training = run_benchmark_smoke(tmp_path)["training"]
    assert training["differ"] == {k: [] for k in training["differ"]}
    assert training["repeat_differ"] == {k: [] for k in training["repeat_differ"]}
