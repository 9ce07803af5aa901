"""zipccl.offload (issue 40): the host round trip and activation offloading.

On CPU the "host copy" is a compact CPU buffer made by the same code as on CUDA (streams and
events are absent, the worker thread and the pool are the same), so these tests check the logic:
bit-exact round trips of every dtype and layout, the dtype/threshold/parameter rule, gradients
bit-identical to a run without offload, nesting, tensors saved twice, retain_graph, prefetch and
the in-flight bound, errors, and that host memory is given back. tests/test_offload_gpu.py runs
the CUDA path.
"""

from __future__ import annotations

import doctest
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
import zipccl
from zipccl import codec, offload
from zipccl.golden.container import LAYOUT_RAW
from zipccl.offload import ActivationOffload, HostCopy, _host_copy, _lanes, host_memory

ROOT = Path(__file__).resolve().parents[1]
CODED = [torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn, torch.float8_e5m2]
OTHER = [torch.float64, torch.int64, torch.int32, torch.int8, torch.uint8, torch.bool]


def sample(shape: tuple[int, ...], dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.rand(shape, generator=gen) < 0.5
    if not dtype.is_floating_point:
        return torch.randint(-100 if dtype.is_signed else 0, 100, shape, generator=gen).to(dtype)
    return torch.randn(shape, generator=gen).to(dtype)


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-identical (NaN patterns and -0.0 included), same dtype and shape."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype == torch.bool:
        return torch.equal(a, b)
    as_bytes = lambda t: t.contiguous().view(-1).view(torch.uint8)  # noqa: E731
    return torch.equal(as_bytes(a), as_bytes(b))


def in_use() -> int:
    """Host bytes in CPU tensors' host copies, once the worker has let go of finished jobs."""
    _lanes.of(torch.device("cpu")).drain()
    return host_memory("cpu").in_use


@pytest.fixture(autouse=True)
def _no_remembered_ratios() -> None:
    """Each test starts with no tensor kind seen (a kind's ratio decides how its copies go)."""
    _lanes.of(torch.device("cpu")).ratios.clear()


# ---------------------------------------------------------------------- the round trip
@pytest.mark.parametrize("dtype", CODED + OTHER)
def test_round_trip_every_dtype(dtype: torch.dtype) -> None:
    x = sample((64, 1000), dtype)
    copy = zipccl.offload_tensor(x)
    assert copy.compressed == (dtype in CODED)
    y = copy.load()
    assert same(y, x) and y.stride() == x.stride()
    if dtype in (torch.bfloat16, torch.float16, torch.float32):  # N(0, 1): the codec shrinks it
        assert copy.host_bytes < copy.nbytes
    elif dtype not in CODED:
        assert copy.host_bytes == copy.nbytes  # raw: exactly its bytes


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.int32])
def test_compress_false_is_raw(dtype: torch.dtype) -> None:
    x = sample((300, 100), dtype)
    copy = zipccl.offload_tensor(x, compress=False)
    assert not copy.compressed and copy.host_bytes == copy.nbytes
    assert same(copy.load(), x)


def test_incompressible_chunks_are_stored_raw() -> None:
    """Random bits do not shrink: the codec's raw layout, header + the bytes, comes back."""
    x = torch.randint(0, 1 << 16, (50_000,), dtype=torch.int32).to(torch.int16)
    x = x.view(torch.bfloat16)
    copy = zipccl.offload_tensor(x)
    assert copy.compressed and copy.host_bytes == copy.nbytes + 512
    assert same(copy.load(), x)


def test_chunks() -> None:
    """A tensor of several chunks (1 MiB each) compresses and comes back chunk by chunk."""
    x = sample((3, 1000, 300), torch.bfloat16)  # 1.8 MB: two chunks
    copy = zipccl.offload_tensor(x, chunk_bytes=1 << 20)
    assert len(copy._pieces) == 2
    assert same(copy.load(), x) and copy.host_bytes < copy.nbytes


@pytest.mark.parametrize("second", ["alike", "incompressible"])
def test_chunk_copies_queued_for_a_guessed_size(second: str) -> None:
    """After the first chunk, each chunk's copy is queued for the size the chunk before it
    suggests: the host copy keeps exactly the compressed size (the guess's tail is given back),
    and a chunk that compresses worse than guessed has the bytes past the guess copied into a
    tail of its own."""
    first = sample((1 << 19,), torch.bfloat16, seed=11)  # 1 MiB: one chunk
    if second == "alike":
        rest = sample((1 << 19,), torch.bfloat16, seed=12)
    else:  # random bits: stored in the codec's raw layout, larger than the guess
        rest = torch.randint(-(1 << 15), 1 << 15, (1 << 19,), dtype=torch.int16)
        rest = rest.view(torch.bfloat16)
    x = torch.cat([first, rest])
    before = in_use()
    copy = zipccl.offload_tensor(x, chunk_bytes=1 << 20)
    copy.wait()
    sizes = [sum(v.numel() for v in p.parts()) for p in copy._pieces]
    expected = [codec._expected_size(p.head) for p in copy._pieces if p.head is not None]
    assert len(copy._pieces) == 2 and sizes == expected
    cap = codec.max_compressed_bytes(torch.bfloat16, 1 << 19)
    assert (sizes[1] > _host_copy._guess(sizes[0] / cap, cap)) == (second != "alike")
    assert [p.tail is not None for p in copy._pieces] == [False, second != "alike"]
    assert same(copy.load(), x) and copy.host_bytes == sum(sizes)
    del copy
    assert in_use() == before


def test_guessed_copies_settle_a_chunk_behind() -> None:
    """A chunk's header is read only once the chunk behind it is queued (so the link never
    waits for the worker): chunks that compress alike and chunks stored raw, alternating, each
    keep exactly their compressed size, and the tensor comes back bit for bit."""
    alike = [sample((1 << 19,), torch.bfloat16, seed=20 + k) for k in range(3)]
    gen = torch.Generator().manual_seed(21)
    noise = torch.randint(-(1 << 15), 1 << 15, (2, 1 << 19), dtype=torch.int16, generator=gen)
    x = torch.cat(
        [alike[0], noise[0].view(torch.bfloat16), alike[1], noise[1].view(torch.bfloat16), alike[2]]
    )
    copy = zipccl.offload_tensor(x, chunk_bytes=1 << 20)
    copy.wait()
    sizes = [sum(v.numel() for v in p.parts()) for p in copy._pieces]
    heads = [p.head for p in copy._pieces if p.head is not None]
    assert len(copy._pieces) == 5 == len(heads)
    assert sizes == [codec._expected_size(h) for h in heads]
    assert [h.layout == LAYOUT_RAW for h in heads] == [False, True, False, True, False]
    assert same(copy.load(), x)


def test_a_kind_seen_before_is_copied_down_before_its_size_is_known(monkeypatch) -> None:
    """The second tensor of a kind (dtype, size, chunking) has each chunk's copy queued by the
    caller's thread for the first one's worst chunk ratio, the worker waiting for no header;
    each settles to exactly its compressed size, a chunk that compresses worse than that is
    completed by a tail copy, and the kind then remembers the worse ratio."""
    kind = (torch.bfloat16, 1 << 20, 1 << 19)
    first = sample((1 << 20,), torch.bfloat16, seed=30)
    zipccl.offload_tensor(first, chunk_bytes=1 << 20).wait()
    lanes = _lanes.of(torch.device("cpu"))
    remembered = lanes.ratios[kind]
    assert 0.5 < remembered < 0.9
    waited: list[int] = []
    exact = HostCopy._store_exactly
    monkeypatch.setattr(
        HostCopy, "_store_exactly", lambda self, p: waited.append(1) or exact(self, p)
    )
    gen = torch.Generator().manual_seed(31)
    noise = torch.randint(-(1 << 15), 1 << 15, (1 << 19,), dtype=torch.int16, generator=gen)
    x = torch.cat([sample((1 << 19,), torch.bfloat16, seed=32), noise.view(torch.bfloat16)])
    copy = zipccl.offload_tensor(x, chunk_bytes=1 << 20)
    copy.wait()
    heads = [p.head for p in copy._pieces]
    assert all(h is not None for h in heads) and not waited
    assert [sum(v.numel() for v in p.parts()) for p in copy._pieces] == [
        codec._expected_size(h) for h in heads
    ]
    assert [p.tail is not None for p in copy._pieces] == [False, True]
    assert heads[1].layout == LAYOUT_RAW and lanes.ratios[kind] > 0.99
    assert same(copy.load(), x) and copy.landed()


def test_loads_of_the_worker_and_of_the_callers_thread_interleave() -> None:
    """Loads queued by the caller's thread (no prefetch) and by the worker (prefetched) share
    the staging ring one after the other; every tensor comes back bit for bit."""
    xs = [sample((1 << 19,), torch.bfloat16, seed=40 + k) for k in range(6)]
    copies = [zipccl.offload_tensor(x, chunk_bytes=1 << 20) for x in xs]
    for copy in copies[::2]:
        copy.prefetch()
    ys = [copy.load() for copy in copies[::-1]][::-1]
    assert all(same(y, x) for x, y in zip(xs, ys, strict=True))


def test_threads_offloading_and_loading_at_once() -> None:
    """Four threads offload and load tensors of two kinds (so guessed copies, settled by
    whichever thread comes first) with and without prefetch, one worker serving them all:
    every tensor comes back bit for bit and every byte of host memory is given back."""
    before = in_use()
    errors: list[BaseException] = []

    def run(seed: int) -> None:
        try:
            gen = torch.Generator().manual_seed(seed)
            for k in range(12):
                numel = (1 << 14) * (1 + k % 2)
                x = torch.randn(numel, generator=gen).to(torch.bfloat16)
                copy = zipccl.offload_tensor(x)
                if k % 3 == 0:
                    copy.prefetch()
                assert same(copy.load(), x)
        except BaseException as exc:  # re-raised on the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    assert in_use() == before


@pytest.mark.parametrize(
    "view",
    [
        lambda t: t.t(),  # dense, permuted: strides kept
        lambda t: t.view(16, 8, 100).permute(2, 0, 1),
        lambda t: t[:, ::2],  # gaps: comes back contiguous
        lambda t: t[3],
        lambda t: t[5, 7],  # 0-dim
        lambda t: t[:0],  # empty
        lambda t: t.expand(2, 128, 100),  # overlapping
    ],
)
def test_views(view) -> None:
    x = view(sample((128, 100), torch.float32))
    y = zipccl.offload_tensor(x).load()
    assert same(y, x)
    dense = x.numel() == 0 or _host_copy.dense_order(x) is not None
    assert y.stride() == x.stride() if dense else y.is_contiguous()


def test_loads_are_independent_and_the_copy_stays() -> None:
    x = sample((1000,), torch.float16)
    copy = zipccl.offload_tensor(x)
    copy.prefetch()
    copy.prefetch()  # no second load
    a, b = copy.load(), copy.load()
    assert a.data_ptr() != b.data_ptr() and same(a, x) and same(b, x)


def test_wait_and_landed() -> None:
    copy = zipccl.offload_tensor(sample((1000,), torch.bfloat16))
    copy.wait()
    assert copy.landed()


def test_host_memory_is_given_back() -> None:
    before = in_use()
    copies = [zipccl.offload_tensor(sample((4000,), d)) for d in (torch.bfloat16, torch.int64)]
    [c.wait() for c in copies]
    assert in_use() - before == sum(-(-c.host_bytes // 512) * 512 for c in copies)
    del copies
    assert in_use() == before


def test_bad_arguments() -> None:
    x = torch.zeros(10)
    with pytest.raises(TypeError, match=r"expected a torch\.Tensor"):
        zipccl.offload_tensor([1.0])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="compress must be a bool"):
        zipccl.offload_tensor(x, compress=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="chunk_bytes must be an int"):
        zipccl.offload_tensor(x, chunk_bytes=2.0**20)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="chunk_bytes must be at least"):
        zipccl.offload_tensor(x, chunk_bytes=4096)
    with pytest.raises(ValueError, match=r"cannot offload a torch\.sparse_coo tensor"):
        zipccl.offload_tensor(x.to_sparse())
    with pytest.raises(ValueError, match="cannot offload a tensor on meta"):
        zipccl.offload_tensor(torch.zeros(10, device="meta"))
    for name, value, error in [
        ("min_bytes", -1, ValueError),
        ("min_bytes", "1", TypeError),
        ("prefetch_bytes", -5, ValueError),
        ("max_inflight_bytes", True, TypeError),
        ("compress", None, TypeError),
        ("chunk_bytes", 1, ValueError),
    ]:
        with pytest.raises(error, match=name):
            zipccl.offload_activations(**{name: value})


@pytest.mark.parametrize(
    ("dtype", "seen"),
    [(torch.bfloat16, False), (torch.bfloat16, True), (torch.int64, False)],
    ids=["copied-by-the-worker", "guessed-on-the-callers-thread", "raw-on-the-callers-thread"],
)
def test_a_failed_copy_is_raised_where_it_is_used(
    monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype, seen: bool
) -> None:
    """Whichever thread queued the copy that failed, offload_tensor returns and wait() and
    load() raise the failure."""
    if seen:  # a kind seen before: the caller's thread queues the guessed copies
        zipccl.offload_tensor(sample((1 << 12,), dtype)).wait()
    pool = _lanes.of(torch.device("cpu")).pool

    def no_memory(nbytes: int) -> None:
        raise MemoryError("host memory exhausted")

    monkeypatch.setattr(pool, "alloc", no_memory)
    copy = zipccl.offload_tensor(sample((1 << 12,), dtype, seed=1))
    name = str(dtype).replace(".", r"\.")
    with pytest.raises(RuntimeError, match=f"offload of a {name} tensor failed") as info:
        copy.wait()
    assert isinstance(info.value.__cause__, MemoryError)
    with pytest.raises(RuntimeError, match=f"load of a {name} tensor failed"):
        copy.load()


def test_a_failed_decode_is_raised_by_load(monkeypatch: pytest.MonkeyPatch) -> None:
    copy = zipccl.offload_tensor(sample((5000,), torch.float16))

    def corrupt(*args: object, **kwargs: object) -> None:
        raise ValueError("corrupt compressed buffer")

    monkeypatch.setattr(_host_copy, "decompress", corrupt)
    with pytest.raises(RuntimeError, match=r"load of a torch\.float16 tensor failed") as info:
        copy.load()
    assert isinstance(info.value.__cause__, ValueError)
    monkeypatch.undo()
    assert same(copy.load(), sample((5000,), torch.float16))  # the host copy is intact


# ---------------------------------------------------------------------- activations
class Saves(torch.autograd.Function):
    """y = x * sum of the saved extras' (float) means: saves x and each extra, and checks in
    backward that every saved tensor came back bit-identical."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, *extras: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        ctx.save_for_backward(x, *extras)
        ctx.originals = [t.clone() for t in (x, *extras)]
        return x * sum(float(e.double().mean()) for e in extras)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        saved = ctx.saved_tensors
        assert all(same(s, o) for s, o in zip(saved, ctx.originals, strict=True))
        scale = sum(float(e.double().mean()) for e in saved[1:])
        return (grad * scale, *(None for _ in saved[1:]))


def mlp(dtype: torch.dtype) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(64, 256),
        torch.nn.GELU(),
        torch.nn.LayerNorm(256),
        torch.nn.Linear(256, 64),
        torch.nn.Tanh(),
    ).to(dtype)


def step(model: torch.nn.Module, x: torch.Tensor, hooks=None) -> tuple[torch.Tensor, list]:
    model.zero_grad(set_to_none=True)
    if hooks is None:
        loss = model(x).float().square().mean()
    else:
        with hooks:
            loss = model(x).float().square().mean()
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("compress", [True, False])
def test_gradients_bit_identical(dtype: torch.dtype, compress: bool) -> None:
    model = mlp(dtype)
    x = sample((128, 64), dtype, seed=1)
    loss, grads = step(model, x)
    hooks = zipccl.offload_activations(min_bytes=1024, compress=compress, prefetch_bytes=1 << 16)
    for _ in range(2):  # one instance, entered once per step
        loss2, grads2 = step(model, x, hooks)
        assert same(loss, loss2)
        assert all(same(a, b) for a, b in zip(grads, grads2, strict=True))
    assert len(hooks._run) >= 4  # the saved activations went through it


@pytest.mark.parametrize("dtype", CODED + OTHER)
def test_every_saved_dtype_comes_back(dtype: torch.dtype) -> None:
    x = sample((500,), torch.float32, seed=2).requires_grad_()
    extra = sample((40, 50), dtype, seed=3)
    with zipccl.offload_activations(min_bytes=0) as hooks:
        y = Saves.apply(x * 1, extra, extra.t())  # (x itself is a leaf that requires grad: kept)
    assert len(hooks._run) == 2  # x * 1, and extra once (extra.t() is a view of it)
    y.sum().backward()
    assert x.grad is not None


def test_the_rule_keeps_parameters_small_tensors_and_subclasses() -> None:
    hooks = zipccl.offload_activations(min_bytes=4096)
    param = torch.nn.Parameter(torch.zeros(100, 100))
    leaf = torch.zeros(100, 100, requires_grad=True)
    big = torch.zeros(100, 100) + 1
    assert hooks.keeps(param) and hooks.keeps(param.t()) and hooks.keeps(param[0:50])
    assert hooks.keeps(leaf) and hooks.keeps(leaf.view(-1))
    assert hooks.keeps(torch.zeros(1000))  # 4000 bytes < 4096
    assert hooks.keeps(big.to_sparse())
    assert not hooks.keeps(big) and not hooks.keeps(big.t())
    assert not hooks.keeps(torch.zeros(100, 100))  # a leaf without grad: an input, a mask


def test_kept_tensors_are_not_copied() -> None:
    param = torch.nn.Parameter(sample((64, 64), torch.float32))
    x = sample((64, 64), torch.float32).requires_grad_()
    with zipccl.offload_activations(min_bytes=1 << 20) as hooks:  # x is too small as well
        loss = (x @ param).sum()
    assert hooks._run == []
    loss.backward()


def test_nested() -> None:
    """An inner block's hooks take over inside it; each keeps its own order."""
    x = sample((2000,), torch.float32, seed=4).requires_grad_()
    extras = [sample((2000,), torch.bfloat16, seed=s) for s in range(3)]
    outer = zipccl.offload_activations(min_bytes=0)
    with outer:
        y = Saves.apply(x * 1, extras[0])
        with zipccl.offload_activations(min_bytes=0, compress=False) as inner:
            y = Saves.apply(y, extras[1])
        y = Saves.apply(y, extras[2])
    assert len(outer._run) == 4 and len(inner._run) == 2
    assert not inner._run[1]().copy.compressed and outer._run[3]().copy.compressed
    y.sum().backward()
    with pytest.raises(RuntimeError, match="already active"), outer, outer:
        pass


def test_a_tensor_saved_twice_is_offloaded_once() -> None:
    x = sample((3000,), torch.float32, seed=5).requires_grad_()
    h = x * 2
    with zipccl.offload_activations(min_bytes=0) as hooks:
        y = Saves.apply(h, h) + Saves.apply(h, h)
    assert len(hooks._run) == 1
    y.sum().backward()
    ref = sample((3000,), torch.float32, seed=5).requires_grad_()
    (Saves.apply(ref * 2, ref * 2) * 2).sum().backward()
    assert same(x.grad, ref.grad)


class SavesLayout(torch.autograd.Function):
    """y = x * 1, saving each extra; backward checks that every saved tensor came back with the
    dtype, shape, strides and storage offset it was saved with, and which ones share storage."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, *extras: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        ctx.save_for_backward(*extras)
        ctx.layouts = [(t.dtype, t.shape, t.stride(), t.storage_offset()) for t in extras]
        ctx.storages = [t.untyped_storage().data_ptr() for t in extras]
        ctx.originals = [t.clone() for t in extras]
        return x * 1

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        saved = ctx.saved_tensors
        assert [(t.dtype, t.shape, t.stride(), t.storage_offset()) for t in saved] == ctx.layouts
        assert all(same(s, o) for s, o in zip(saved, ctx.originals, strict=True))
        storages = [t.untyped_storage().data_ptr() for t in saved]
        assert [a == b for a in storages for b in storages] == [
            a == b for a in ctx.storages for b in ctx.storages
        ]
        return (grad, *(None for _ in saved))


@pytest.mark.parametrize("compress", [True, False])
def test_views_come_back_as_the_views_they_were(compress: bool) -> None:
    """q, k and v of one packed projection (gaps, storage offsets) come back as views of one
    restored base, with their strides and offsets: one host copy for the three."""
    x = sample((64,), torch.float32, seed=8).requires_grad_()
    qkv = sample((2, 96, 3, 4, 16), torch.bfloat16, seed=9)  # (batch, seq, 3, heads, dim)
    q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
    with zipccl.offload_activations(min_bytes=0, compress=compress) as hooks:
        y = SavesLayout.apply(x * 1, k, q, v, qkv.view(-1, 192).t())
    assert len(hooks._run) == 1 and hooks._run[0]().copy.shape == qkv.shape
    y.sum().backward()


def test_a_base_comes_back_once_for_all_its_views(monkeypatch: pytest.MonkeyPatch) -> None:
    """Views of one base unpacked by different backward nodes share one copy up: the first
    unpack's tensor is held until the last view has been unpacked (then let go)."""
    loads = []
    real_load = HostCopy.load
    monkeypatch.setattr(HostCopy, "load", lambda self: loads.append(self) or real_load(self))
    x = sample((64,), torch.float32, seed=8).requires_grad_()
    base = sample((96, 64), torch.bfloat16, seed=13) * 1
    with zipccl.offload_activations(min_bytes=0) as hooks:
        y = SavesLayout.apply(x * 1, base.t())
        y = SavesLayout.apply(y, base.view(48, 128)[::2], base[1:])
    saved, shape = hooks._run[-1](), base.shape
    assert saved is not None and saved.uses == 3 and saved.copy.shape == shape
    del base  # (as the forward pass lets go of its activations)
    y.sum().backward()
    assert [c.shape for c in loads].count(shape) == 1
    assert saved.held is None


def test_views_of_much_larger_bases_are_offloaded_alone() -> None:
    x = sample((64,), torch.float32, seed=8).requires_grad_()
    big = sample((64, 100), torch.float16, seed=10)
    row, col, as_int = big[3], big[:, 7:9], big[:20].view(torch.int16)
    with zipccl.offload_activations(min_bytes=0) as hooks:  # (col: gaps, comes back contiguous)
        y = Saves.apply(x * 1, row, as_int, col)
    assert [r().copy.shape for r in hooks._run] == [x.shape, row.shape, as_int.shape, col.shape]
    y.sum().backward()


def test_retain_graph_backward_twice() -> None:
    model, x = mlp(torch.float32), sample((128, 64), torch.float32, seed=6)
    loss = model(x).square().mean()
    loss.backward(retain_graph=True)
    loss.backward()
    want = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    before = in_use()
    with zipccl.offload_activations(min_bytes=1024, prefetch_bytes=0):
        loss = model(x).square().mean()
    loss.backward(retain_graph=True)
    assert in_use() > before  # still held for the second backward
    loss.backward()
    assert all(same(p.grad, w) for p, w in zip(model.parameters(), want, strict=True))
    del loss
    assert in_use() == before


def test_no_host_memory_left_after_backward() -> None:
    model, x = mlp(torch.bfloat16), sample((128, 64), torch.bfloat16, seed=7)
    before = in_use()
    with zipccl.offload_activations(min_bytes=1024):
        loss = model(x).float().mean()
    assert in_use() > before
    loss.backward()
    assert in_use() == before


def test_prefetch_brings_back_what_backward_needs_next() -> None:
    tensors = [sample((1000,), torch.float32, seed=s) + 0 for s in range(6)]  # 4000 bytes each
    hooks = zipccl.offload_activations(min_bytes=0, prefetch_bytes=8000)
    with hooks:
        saved = [hooks._pack(t) for t in tensors]
    pending = lambda: [s.copy._ticket is not None for s in saved]  # noqa: E731
    assert pending() == [False] * 4 + [True] * 2  # the block's exit sent for the tail
    assert same(hooks._unpack(saved[5]), tensors[5])
    assert pending() == [False, False, False, True, True, False]
    assert same(hooks._unpack(saved[2]), tensors[2])  # out of order: still correct
    assert pending() == [True, True, False, True, True, False]
    assert all(same(hooks._unpack(s), t) for s, t in zip(saved, tensors, strict=True))


def test_the_forward_waits_past_max_inflight_bytes() -> None:
    hooks = zipccl.offload_activations(min_bytes=0, max_inflight_bytes=0)
    with hooks:
        saved = [hooks._pack(sample((1000,), torch.float16, seed=s) + 0) for s in range(3)]
    assert all(s.copy.landed() for s in saved) and hooks._inflight_bytes == 0


def test_examples_run() -> None:
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    finder = doctest.DocTestFinder()
    attempted = 0
    for obj in (offload.offload_tensor, offload.offload_activations, HostCopy, ActivationOffload):
        for test in finder.find(obj, globs={"torch": torch, "zipccl": zipccl}):
            result = runner.run(test)
            assert not result.failed, test.name
            attempted += result.attempted
    assert attempted


def run_benchmark_smoke(tmp_path: Path) -> dict:
    """benchmarks/offload.py --smoke (on CUDA where there is one) in a process of its own, which
    must also exit cleanly (offload's worker threads at interpreter exit); its JSON result."""
    out = tmp_path / "offload.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "sw"), str(ROOT)])}
    command = [sys.executable, str(ROOT / "benchmarks/offload.py"), "--smoke", "--out", str(out)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(out.read_text())


def test_benchmark_smoke(tmp_path: Path) -> None:
    """The smoke benchmark runs and finds the three training runs identical, each repeating
    itself."""
    result = run_benchmark_smoke(tmp_path)
    training = result["training"]
    assert training["identical"] is True and not any(training["differ"].values())
    assert not any(training["repeat_differ"].values())
    assert {"plain", "raw", "compressed"} <= set(result["round_trip"][0])
