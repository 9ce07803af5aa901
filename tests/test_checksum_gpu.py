"""``checksum=True`` on CUDA: the kernels sum golden's values checksum while they encode and check
it while they decode (split and raw layouts, the compressed object and a bare buffer, at once or
at ``check_errors``, inside a CUDA graph)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import zipccl
from zipccl.golden import container

from tests.test_codec import DTYPES, bits_np, fitted, gaussian, random_bits

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

CUDA = torch.device("cuda")
SEED = 20261202


def golden_checksum(x: torch.Tensor) -> int:
    return container.values_checksum(bits_np(x.cpu()).tobytes())


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.reshape(-1).view(torch.uint8).cpu(), b.reshape(-1).view(torch.uint8).cpu())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 8, 63, 4095, 4097, 100_003, (1 << 20) + 5])
def test_gpu_checksum_is_golden(dtype: torch.dtype, n: int) -> None:
    x = gaussian(n, dtype, seed=SEED + n, scale=2.0)
    xg = x.to(CUDA)
    c = zipccl.compress(xg, checksum=True)  # the device's own table
    head = container.Header.unpack(c.header_bytes())  # its CRC covers the checksum
    assert c.checksummed and head.checksum == golden_checksum(x)
    plain = zipccl.compress(xg)
    assert c.nbytes == plain.nbytes and torch.equal(c.buffer[512:], plain.buffer[512:])
    book = zipccl.histogram_table(x)  # a given table: every byte is the CPU path's
    want = zipccl.compress(x, book, checksum=True).buffer
    assert torch.equal(zipccl.compress(xg, book, checksum=True).buffer.cpu(), want)
    assert same(zipccl.decompress(c), x)
    y = torch.empty_like(xg)
    zipccl.decompress(c, out=y, sync=False)
    zipccl.check_errors()
    assert same(y, x)
    assert same(zipccl.decompress(c.buffer.clone()), x)  # a bare buffer: header read on the host


@pytest.mark.parametrize("fast", ["1", "0"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_gpu_checksum_fast_and_generic_paths(
    dtype: torch.dtype, fast: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fast path and the generic kernels sum alike, aligned or not."""
    monkeypatch.setenv("ZIPCCL_FAST", fast)
    x = gaussian(1_000_003, dtype, seed=SEED, scale=0.01).to(CUDA)
    for view in (x, x[1:], x[3:-2]):
        c = zipccl.compress(view, checksum=True)
        assert container.Header.unpack(c.header_bytes()).checksum == golden_checksum(view)
        assert same(zipccl.decompress(c), view)


def test_gpu_checksum_raw_fallback() -> None:
    x = random_bits(300_001, torch.float16, seed=SEED).to(CUDA)
    c = zipccl.compress(x, checksum=True)
    assert c.layout == "raw"
    assert container.Header.unpack(c.header_bytes()).checksum == golden_checksum(x)
    assert same(zipccl.decompress(c), x) and same(zipccl.decompress(c.buffer.clone()), x)
    bad = c.buffer.clone()
    bad[12345] ^= 0x20
    with pytest.raises(ValueError, match="values checksum"):
        zipccl.decompress(bad)  # a bare buffer: the raw copy checks it
    c._storage[12345] ^= 0x20
    with pytest.raises(ValueError, match="values checksum"):
        zipccl.decompress(c)  # the compressed object: the decode kernel's raw branch checks it


def flip_rejections(c: zipccl.Compressed, positions: np.ndarray, bits: np.ndarray) -> list[bool]:
    """For each flip (one bit of the body, in place, then undone): did decompress raise?"""
    out = []
    for at, bit in zip(positions.tolist(), bits.tolist(), strict=True):
        c._storage[at] ^= 1 << bit
        try:
            zipccl.decompress(c)
        except ValueError:
            out.append(True)
        else:
            out.append(False)
        c._storage[at] ^= 1 << bit
    return out


@pytest.mark.parametrize(
    "dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn]
)
def test_gpu_every_sampled_flip_is_rejected(dtype: torch.dtype) -> None:
    """400 seeded single-bit flips of the body: the same flips pass silently without a checksum
    (some of them), and every one raises with it, at once and from check_errors."""
    x = gaussian(200_003, dtype, seed=SEED, scale=3.0).to(CUDA)
    table = fitted(dtype)
    plain, checked = zipccl.compress(x, table), zipccl.compress(x, table, checksum=True)
    assert checked.layout == "split"
    rng = np.random.default_rng(SEED)
    at = rng.integers(container.HEADER_BYTES, checked.nbytes, 400)
    bit = rng.integers(0, 8, 400)
    assert not all(flip_rejections(plain, at, bit)), "some flips pass without a checksum"
    assert all(flip_rejections(checked, at, bit)), f"a flip passed the checksum (seed {SEED})"
    checked._storage[int(at[0])] ^= 1 << int(bit[0])
    zipccl.decompress(checked, sync=False)
    with pytest.raises(ValueError):
        zipccl.check_errors()
    checked._storage[int(at[0])] ^= 1 << int(bit[0])
    zipccl.decompress(checked, sync=False)  # the accumulator was left clean
    zipccl.check_errors()


def test_gpu_bare_buffer_flips_are_rejected() -> None:
    x = gaussian(100_003, torch.bfloat16, seed=SEED).to(CUDA)
    c = zipccl.compress(x, checksum=True)
    sec = container.Sections.of(container.BY_CODE[1], x.numel(), c.block)
    bad = c.buffer.clone()
    bad[sec.raw_bytes[0] + 777] ^= 0x04  # a mantissa bit: the code stays legal
    with pytest.raises(ValueError, match="values checksum"):
        zipccl.decompress(bad)
    zipccl.decompress(bad, sync=False)
    with pytest.raises(ValueError, match="values checksum"):
        zipccl.check_errors()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn])
def test_gpu_checksum_capture_and_replay(dtype: torch.dtype) -> None:
    """compress(checksum=True) -> decompress(sync=False) in one CUDA graph: each replay with new
    data writes golden's checksum and checks it, with no error."""
    n = 1 << 20
    x = torch.randn(n, device=CUDA).to(dtype)
    y = torch.empty_like(x)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        zipccl.decompress(zipccl.compress(x, checksum=True), out=y, sync=False)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        c = zipccl.compress(x, checksum=True)
        zipccl.decompress(c, out=y, sync=False)
    for seed in range(3):
        g = torch.Generator(device=CUDA).manual_seed(seed)
        x.copy_((torch.randn(n, device=CUDA, generator=g) * 10.0**seed).to(dtype))
        graph.replay()
        torch.cuda.synchronize()
        assert same(y, x), f"replay {seed}"
        head = container.Header.unpack(bytes(c._storage[:512].cpu().numpy()))
        assert head.checksum == golden_checksum(x), f"replay {seed}"
    zipccl.check_errors()


def test_gpu_decoder_rejects_what_no_checksum_sees() -> None:
    """Corruption that leaves the values as they were is caught as the host decoders catch it:
    a non-zero alignment gap byte, and an FP16 escape byte past the 5-bit exponent field (its
    bit 5 lands on the sign bit, which may be set already)."""
    x = gaussian(100_003, torch.float16, seed=SEED, scale=1e4).to(CUDA)
    c = zipccl.compress(x, checksum=True)
    sec = container.Sections.of(container.BY_CODE[2], x.numel(), c.block)
    assert c.layout == "split" and c.payload_bytes > 0 and sec.gaps
    for at, value, why in [(sec.gaps[0][0], 0x01, "gap"), (sec.payload, 0x20, "exponent field")]:
        bad = c.buffer.clone()
        bad[at] |= value
        with pytest.raises(ValueError, match=why):
            zipccl.decompress(bad)
        with pytest.raises(ValueError):
            zipccl.decompress(bad.cpu())
