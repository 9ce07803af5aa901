"""zipccl.codec on CUDA: the CUDA kernels' bytes equal the CPU path's (== golden) bytes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import zipccl

from golden import container
from golden.codebook import Codebook
from golden.formats import BF16, E4M3
from tests.test_codec import DTYPES, UINT, bits_np, corrupted, fitted, gaussian, random_bits

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

CUDA = torch.device("cuda")


@pytest.fixture(scope="module", autouse=True)
def kernels_built() -> None:
    """Fail loudly if the kernels did not build: a silent torch fallback would pass every test."""
    from zipccl import _cuda

    assert _cuda.available()


def gpu_vs_cpu(x: torch.Tensor, table: Codebook | str | None = None, block: int = 4096) -> None:
    c_cpu = zipccl.compress(x, table, block=block)
    book = c_cpu.table if c_cpu.table is not None else zipccl.default_table(x)
    if isinstance(table, Codebook):
        book = table
    xg = x.to(CUDA)
    assert zipccl.default_table(xg) == zipccl.default_table(x)
    c_gpu = zipccl.compress(xg, book, block=block)
    assert c_gpu.buffer.is_cuda and c_gpu.layout == c_cpu.layout
    assert torch.equal(c_gpu.buffer.cpu(), c_cpu.buffer), "GPU bytes differ from CPU bytes"
    back = zipccl.decompress(c_gpu)
    assert back.is_cuda and np.array_equal(bits_np(back.cpu()), bits_np(x.contiguous()))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 8, 63, 4095, 4096, 4097, 100003, (1 << 20) + 5])
def test_gpu_bytes_equal_cpu(dtype: torch.dtype, n: int) -> None:
    gpu_vs_cpu(gaussian(n, dtype, seed=n, scale=2.0), fitted(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block", [64, 256, 8192, 16384])
def test_gpu_blocks(dtype: torch.dtype, block: int) -> None:
    gpu_vs_cpu(gaussian(7 * block + 5, dtype, seed=block), fitted(dtype), block=block)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_exhaustive_and_random_bits(dtype: torch.dtype) -> None:
    bits = torch.finfo(dtype).bits
    every = torch.arange(1 << min(bits, 16), dtype=torch.int64)
    every = torch.where(every >= 1 << (bits - 1), every - (1 << bits), every).to(UINT[bits])
    filler = gaussian(20 * every.numel(), dtype, seed=7).view(UINT[bits])
    gpu_vs_cpu(torch.cat([filler, every]).view(dtype), table="histogram")
    gpu_vs_cpu(random_bits(30000, dtype, seed=3))


@pytest.mark.parametrize("seed", range(6))
def test_gpu_mixed_width_tables(seed: int) -> None:
    rng = np.random.default_rng(seed)
    widths = [8, *rng.integers(0, 6, 7).tolist()]
    cap = sum(1 << w for w in widths[1:])
    ranks = tuple(int(s) for s in rng.permutation(256)[: min(cap, 256)])
    book = Codebook(tuple(widths), 0, ranks)
    for dtype in (torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn):
        gpu_vs_cpu(gaussian(20011, dtype, seed=seed, scale=30.0), table=book, block=1024)


def test_gpu_unaligned_views() -> None:
    big = gaussian(100001, torch.bfloat16, seed=12)
    x = big[3:].to(CUDA)  # storage offset: the kernels must take their scalar paths
    cap = zipccl.max_compressed_bytes(x.dtype, x.numel())
    out = torch.empty(cap + 5, dtype=torch.uint8, device=CUDA)[5:]
    c = zipccl.compress_into(x, out)
    assert torch.equal(c.buffer.cpu(), zipccl.compress(big[3:], c.table).buffer)
    y = torch.empty(x.numel() + 1, dtype=x.dtype, device=CUDA)[1:]
    zipccl.decompress(c, out=y)
    assert torch.equal(y.view(torch.int16), x.view(torch.int16))
    nc = gaussian(300 * 40, torch.float16, seed=13).view(300, 40).to(CUDA).t()
    assert torch.equal(zipccl.decompress(zipccl.compress(nc)).view(torch.int16),
                       nc.contiguous().view(torch.int16))


def test_gpu_rejects_corrupt_buffers() -> None:
    x = gaussian(60000, torch.float8_e4m3fn, seed=14, scale=20.0)
    c = zipccl.compress(x.to(CUDA), "histogram", block=1024)
    assert c.layout == "split"
    sec = container.Sections.of(E4M3, x.numel(), 1024)
    buf = c.buffer
    bad = [
        buf[:-1],
        corrupted(buf, 30, int(buf[30]) ^ 4),
        corrupted(buf, sec.offsets + 8 * 5 + 6, 0x7F),
        corrupted(buf, sec.offsets + 8 * 5, int(buf[sec.offsets + 8 * 5]) ^ 1),
    ]
    for b in bad:
        with pytest.raises(ValueError):
            zipccl.decompress(b)
    rng = np.random.default_rng(0)
    for _ in range(30):  # our verdict matches golden's on random damage
        b = buf.clone()
        for at in rng.integers(container.HEADER_BYTES, b.numel(), 3):
            b[int(at)] ^= int(rng.integers(1, 256))
        try:
            _, want = container.decode(bytes(b.cpu().numpy()))
        except ValueError:
            with pytest.raises(ValueError):
                zipccl.decompress(b)
            continue
        assert np.array_equal(bits_np(zipccl.decompress(b).cpu()), want)


@pytest.mark.slow
def test_gpu_more_than_2_gib() -> None:
    n = (1 << 30) + 12345  # 2 GiB + of BF16: 64-bit offsets and indices everywhere
    x = torch.randn(n, device=CUDA, dtype=torch.bfloat16)
    c = zipccl.compress(x)
    assert c.layout == "split" and c.nbytes < x.numel() * 2
    y = zipccl.decompress(c)
    assert torch.equal(y.view(torch.int16), x.view(torch.int16))


def with_prefix(buf: torch.Tensor, sec: container.Sections, i: int, prefix: int) -> torch.Tensor:
    """A copy of ``buf`` in which element i's three prefix-plane bits spell ``prefix``."""
    bad = buf.clone()
    for j, at in enumerate(sec.prefix):
        byte = int(bad[at + i // 8]) & ~(1 << (i % 8))
        bad[at + i // 8] = byte | (((prefix >> j) & 1) << (i % 8))
    return bad


def assert_illegal(bad: torch.Tensor) -> None:
    """The GPU and the CPU decoder both reject the buffer as holding an illegal codeword."""
    for buf in (bad, bad.cpu()):
        with pytest.raises(ValueError, match="illegal"):
            zipccl.decompress(buf)


@pytest.mark.parametrize("fast", ["1", "0"])
@pytest.mark.parametrize("literal", [0, 5])
def test_gpu_byte_escape_tables(fast: str, literal: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """BF16 fast path and generic kernels on ZipCCL-layout tables, with a literal region that is
    not prefix 0 and with prefixes that have no symbol (illegal in a stream)."""
    monkeypatch.setenv("ZIPCCL_FAST", fast)
    widths = [0] * 8
    widths[literal] = 8
    book = Codebook(tuple(widths), literal, (127, 126, 128))  # three ranked symbols only
    x = gaussian(50003, torch.bfloat16, seed=21)
    gpu_vs_cpu(x, table=book)  # block 4096: the fast path's block
    c = zipccl.compress(x.to(CUDA), book)
    sec = container.Sections.of(BF16, x.numel(), c.block)
    exps = (x.view(torch.int16).to(torch.int64) >> 7) & 0xFF
    i = int(torch.nonzero((exps >= 126) & (exps <= 128))[0])  # not an escape: size unchanged
    assert_illegal(with_prefix(c.buffer, sec, i, 7))  # prefix 7: a region with no symbol


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn])
def test_gpu_decode_from_separate_payload(dtype: torch.dtype) -> None:
    """A received fixed part and payload decode where they lie (no joining copy), at any byte
    alignment of the payload; a payload shorter than the header says is rejected."""
    from zipccl import _cuda

    x = gaussian(70001, dtype, seed=31, scale=3.0).to(CUDA)
    c = zipccl.compress(x, fitted(dtype), block=1024)
    assert c.layout == "split"
    fixed = zipccl.fixed_part_bytes(dtype, x.numel(), 1024)
    fmt = {torch.bfloat16: BF16, torch.float8_e4m3fn: E4M3}[dtype]
    for shift in (0, 1, 3):
        head = c.buffer[:fixed].clone()
        pay = torch.zeros(c.payload_bytes + shift, dtype=torch.uint8, device=CUDA)[shift:]
        pay.copy_(c.buffer[fixed:])
        y = torch.empty_like(x)
        flag = torch.zeros(1, dtype=torch.int32, device=CUDA)
        _cuda.launch_decode(head, fmt, c.table, 1024, c.payload_bytes, y, flag, payload=pay)
        assert int(flag.item()) == 0
        assert torch.equal(y.view(torch.uint8), x.view(torch.uint8))
    with pytest.raises(ValueError, match="too short"):
        _cuda.launch_decode(head, fmt, c.table, 1024, c.payload_bytes, y, flag, payload=pay[1:])


@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_decode_sized_by_its_own_header(dtype: torch.dtype) -> None:
    """payload_bytes=None (a collective's receiver): the kernel takes the size from the buffer's
    header; a room one byte short of it sets the room bit and leaves the output untouched."""
    from zipccl import _cuda

    x = gaussian(50001, dtype, seed=37, scale=3.0).to(CUDA)
    c = zipccl.compress(x, fitted(dtype))
    assert c.layout == "split" and c.payload_bytes > 0
    fixed = zipccl.fixed_part_bytes(dtype, x.numel())
    fmt = zipccl.codec._fmt(dtype)
    for room, flag_want in ((c.payload_bytes + 300, 0), (c.payload_bytes - 1, _cuda.ROOM_ERROR)):
        pay = torch.zeros(room, dtype=torch.uint8, device=CUDA)
        n = min(room, c.payload_bytes)
        pay[:n].copy_(c.buffer[fixed : fixed + n])
        y = torch.zeros_like(x)
        flag = torch.zeros(1, dtype=torch.int32, device=CUDA)
        _cuda.launch_decode(c.buffer[:fixed], fmt, c.table, 4096, None, y, flag, payload=pay)
        assert int(flag.item()) == flag_want
        want = x if flag_want == 0 else torch.zeros_like(x)
        assert torch.equal(y.view(torch.uint8), want.view(torch.uint8))


def test_gpu_fp8_regions_past_the_ranks() -> None:
    """FP8 tables with a region past the 200 ranked symbols (prefix 3: base 272, no symbol): data
    round trips, and a codeword moved into that region is illegal on GPU and CPU alike."""
    book = Codebook((8, 4, 8, 4, 1, 1, 1, 1), 0, tuple(range(200)))
    g = torch.Generator().manual_seed(41)
    small = torch.randint(0, 16, (40009,), generator=g, dtype=torch.uint8)
    wide = torch.randint(16, 256, (40009,), generator=g, dtype=torch.uint8)
    x = torch.where(torch.rand(40009, generator=g) < 0.8, small, wide).view(torch.float8_e4m3fn)
    gpu_vs_cpu(x, table=book, block=1024)
    c = zipccl.compress(x.to(CUDA), book, block=1024)
    assert c.layout == "split"
    sec = container.Sections.of(E4M3, x.numel(), 1024)
    i = int(torch.nonzero(small[:1000] == x.view(torch.uint8)[:1000])[0])  # prefix 1, 4 bits
    assert_illegal(with_prefix(c.buffer, sec, i, 3))  # prefix 3 codes 4 bits too: same size
