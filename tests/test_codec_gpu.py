"""zipccl.codec on CUDA: the CUDA kernels' bytes equal the CPU path's (== golden) bytes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import zipccl
from zipccl.golden import container
from zipccl.golden.codebook import Codebook
from zipccl.golden.formats import BF16, E4M3, get_format

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


def test_gpu_bytes_equal_cpu_past_a_full_gpu() -> None:
    """BF16 with more blocks (16,384) than a GPU holds warps twice over: one warp codes each block
    there, while the smaller tensors above take the encoder's two warps a block (block_split)."""
    n = (1 << 26) + 5
    gpu_vs_cpu(gaussian(n, torch.bfloat16, seed=n, scale=2.0), fitted(torch.bfloat16))


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
    assert torch.equal(
        zipccl.decompress(zipccl.compress(nc)).view(torch.int16), nc.contiguous().view(torch.int16)
    )


@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_unaligned_views_of_every_format(dtype: torch.dtype) -> None:
    """Input, buffer and output at offsets that no vector access fits: the encoder's and the
    decoder's general rounds give the same bytes and values as their aligned whole rounds."""
    big = gaussian(100001, dtype, seed=16, scale=2.0)
    x = big[3:].to(CUDA)
    cap = zipccl.max_compressed_bytes(x.dtype, x.numel())
    out = torch.empty(cap + 5, dtype=torch.uint8, device=CUDA)[5:]
    c = zipccl.compress_into(x, out, fitted(dtype))
    assert c.layout == "split"
    assert torch.equal(c.buffer.cpu(), zipccl.compress(big[3:], c.table).buffer)
    y = torch.empty(x.numel() + 1, dtype=dtype, device=CUDA)[1:]
    zipccl.decompress(c, out=y)
    assert np.array_equal(bits_np(y.cpu()), bits_np(big[3:]))


def assert_damage_verdicts_match_golden(buf: torch.Tensor, seed: int) -> None:
    """30 copies of ``buf`` with three random bytes past the header changed: each is rejected
    where golden rejects it, else decoded to golden's values."""
    rng = np.random.default_rng(seed)
    for _ in range(30):
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


@pytest.mark.parametrize("table", ["histogram", None])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_gpu_damage_verdicts_match_golden(dtype: torch.dtype, table: str | None) -> None:
    """The exponent formats' decoders, the generic one (a histogram table) and the fast path
    (the theory table's byte escapes), reject the damaged buffers golden rejects (ranks past the
    table, FP16 symbols past 5 bits, sizes, padding) and decode the others to golden's values."""
    x = gaussian(60000, dtype, seed=15, scale=20.0)
    buf = zipccl.compress(x.to(CUDA), table, block=1024).buffer
    assert_damage_verdicts_match_golden(buf, seed=1)


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
    assert_damage_verdicts_match_golden(buf, seed=0)


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
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_gpu_byte_escape_tables(
    dtype: torch.dtype, fast: str, literal: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fast path and the generic kernels on ZipCCL-layout tables, with a literal region that
    is not prefix 0 and with prefixes that have no symbol (illegal in a stream)."""
    monkeypatch.setenv("ZIPCCL_FAST", fast)
    fmt = get_format(str(dtype).removeprefix("torch."))
    bias = fmt.exp_bias
    widths = [0] * 8
    widths[literal] = 8
    ranked = (bias, bias - 1, bias + 1, bias - 2, bias - 3)  # five: prefixes without a symbol
    book = Codebook(tuple(widths), literal, ranked)
    x = gaussian(50003, dtype, seed=21)
    gpu_vs_cpu(x, table=book)  # block 4096: the fast path's block
    c = zipccl.compress(x.to(CUDA), book)
    assert c.layout == "split"
    sec = container.Sections.of(fmt, x.numel(), c.block)
    exps = fmt.symbols(bits_np(x))
    i = int(np.flatnonzero(np.isin(exps, ranked))[0])  # not an escape: size unchanged
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


# ---------------------------------------------------------------------- the no-sync call
def scaled(n: int, dtype: torch.dtype, sigma: float, zeros: float, seed: int) -> torch.Tensor:
    """N(0, sigma^2) values of ``dtype`` with a ``zeros`` share of exact zeros."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g, dtype=torch.float64) * sigma
    x[torch.rand(n, generator=g) < zeros] = 0.0
    return x.to(dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_gpu_device_theory_table_is_golden(dtype: torch.dtype) -> None:
    """The table the kernels build from the sample is golden.theory's for the sample's statistics
    (the same sums as sample_summary's), its header (hash, CRC) is golden's, and the buffer's
    bytes are the CPU codec's under that table."""
    from zipccl.golden import theory

    fmt = zipccl.codec._fmt(dtype)
    for seed, sigma in enumerate([1e-6, 3e-3, 0.02, 0.7, 1.0, 5.0, 300.0, 6e4]):
        for zeros in (0.0, 0.3, 0.97):
            if dtype == torch.float16 and sigma < 1e-4:
                continue  # FP16 has no normal values there
            x = scaled(200_003, dtype, sigma, zeros, seed).to(CUDA)
            c = zipccl.compress(x)
            summary = zipccl.codec.sample_summary(x).cpu().numpy()
            sums = summary[:3].view(np.float64).tolist()
            want = theory.zipccl_table(fmt, zipccl.codec._stats_of(sums, int(summary[3:].sum())))
            msg = f"sigma={sigma} zeros={zeros} seed={seed}"
            if c.layout == "raw":
                continue  # incompressible at this scale: no table to compare
            assert c.table == want, msg
            parsed = zipccl.Compressed.from_buffer(c.buffer.clone())  # golden's header checks
            assert parsed.table == want and parsed.nbytes == c.nbytes, msg
            cpu = zipccl.compress(x.cpu(), want)
            assert torch.equal(c.buffer.cpu(), cpu.buffer), msg
            assert torch.equal(zipccl.decompress(c).view(torch.uint8), x.view(torch.uint8)), msg


def fp8_cases(fmt: str) -> dict[str, torch.Tensor]:
    """FP8 tensors whose sample histograms cover the staircase builder's cases: absmax-scaled
    Gaussians (strided samples too), zero-heavy, one symbol, tied counts, random weights with
    unseen symbols, random bytes."""
    from tests.test_fp8_tables import FP8, absmax_scaled

    dtype, gen, cases = FP8[fmt], torch.Generator().manual_seed(61), {}
    for n in (200_003, 3_000_001):
        for zeros in (0.0, 0.6):
            x = torch.randn(n, generator=gen)
            x[torch.rand(n, generator=gen) < zeros] = 0.0
            cases[f"absmax N(0,1) n={n} zeros={zeros}"] = absmax_scaled(x, fmt)
    cases["one symbol"] = torch.full((100_000,), 0x38, dtype=torch.uint8)
    cases["four tied symbols"] = torch.tensor([9, 4, 250, 17], dtype=torch.uint8)[
        torch.arange(70_000) % 4
    ]
    for k in range(12):
        weights = torch.rand(256, generator=gen) ** (1 + 4 * k)
        weights[torch.rand(256, generator=gen) < 0.3] = 0.0
        cases[f"random weights {k}"] = torch.multinomial(
            weights, 150_001, replacement=True, generator=gen
        ).to(torch.uint8)
    cases["random bytes"] = torch.randint(0, 256, (500_000,), generator=gen, dtype=torch.uint8)
    return {name: x.view(dtype) if x.dtype == torch.uint8 else x for name, x in cases.items()}


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_gpu_device_fp8_table_is_golden(fmt: str) -> None:
    """FP8's default table built by the kernels is golden.builders.staircase_table of the
    sample's byte histogram (codec.default_table on the CPU copy): same header, same bytes as
    the CPU codec, decoded exactly."""
    for name, x in fp8_cases(fmt).items():
        c = zipccl.compress(x.to(CUDA))
        cpu = zipccl.compress(x)
        assert c.layout == cpu.layout and torch.equal(c.buffer.cpu(), cpu.buffer), name
        if c.layout == "split":
            assert c.table == zipccl.default_table(x) == cpu.table, name
            assert zipccl.Compressed.from_buffer(c.buffer.clone()).table == c.table, name
        back = zipccl.decompress(c).cpu().view(torch.uint8)
        assert torch.equal(back, x.view(torch.uint8)), name


@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_sizes_stay_on_the_device(dtype: torch.dtype) -> None:
    """compress returns before the size is read; the first read reads it once, and matches what
    golden's parser says of the buffer. Incompressible data takes the raw layout on the device."""
    for x in (gaussian(300_001, dtype, seed=51, scale=2.0), random_bits(300_001, dtype, seed=52)):
        c = zipccl.compress(x.to(CUDA))
        assert c._sizes is None
        y = zipccl.decompress(c, sync=False)
        zipccl.check_errors()
        assert c._sizes is None  # decompress needed no size on the host
        assert torch.equal(y.cpu().view(torch.uint8), x.view(torch.uint8))
        parsed = zipccl.Compressed.from_buffer(c.buffer.clone())
        assert (parsed.nbytes, parsed.layout, parsed.payload_bytes) == (
            c.nbytes,
            c.layout,
            c.payload_bytes,
        )
        cpu = zipccl.compress(x, c.table)
        assert torch.equal(c.buffer.cpu(), cpu.buffer)


def test_gpu_tiny_tensors_are_raw() -> None:
    for n in (0, 1, 8, 63):
        x = gaussian(n, torch.bfloat16, seed=n).to(CUDA)
        c = zipccl.compress(x)
        assert c.layout == "raw"
        assert torch.equal(c.buffer.cpu(), zipccl.compress(x.cpu()).buffer)
        assert torch.equal(
            zipccl.decompress(c, sync=False).cpu().view(torch.int16), x.cpu().view(torch.int16)
        )


def offsets_damaged(c: zipccl.Compressed) -> None:
    """Make block 1's offset point past the payload (in place)."""
    sec = container.Sections.of(zipccl.codec._fmt(c.dtype), c.numel, c.block)
    c._storage[sec.offsets + 8 + 6] = 0x7F


def test_gpu_corrupt_buffer_sync_and_deferred() -> None:
    """sync=True raises at once; sync=False raises at the next check_errors, once."""
    x = gaussian(100_003, torch.bfloat16, seed=61).to(CUDA)
    c = zipccl.compress(x)
    offsets_damaged(c)
    with pytest.raises(ValueError, match="offsets"):
        zipccl.decompress(c)
    zipccl.decompress(c, sync=False)  # queued; nothing raised yet
    with pytest.raises(ValueError, match="offsets"):
        zipccl.check_errors(CUDA)
    zipccl.check_errors(CUDA)  # reported once
    good = zipccl.compress(x)
    zipccl.decompress(good, sync=False)
    zipccl.check_errors()


def test_gpu_validating_decodes_after_a_corrupt_one() -> None:
    """A validating decompress reads its thread's flag in the same call and leaves it zero: after
    a corrupt buffer raised, good ones pass, on another stream and from a bare buffer too, and a
    corrupt bare buffer raises as well."""
    x = gaussian(100_003, torch.bfloat16, seed=62).to(CUDA)
    bad = zipccl.compress(x)
    offsets_damaged(bad)
    good = zipccl.compress(x)
    for _ in range(2):
        with pytest.raises(ValueError, match="offsets"):
            zipccl.decompress(bad)
        assert torch.equal(zipccl.decompress(good).view(torch.int16), x.view(torch.int16))
    with pytest.raises(ValueError, match="offsets"):
        zipccl.decompress(bad.buffer.clone())
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        y = zipccl.decompress(good.buffer.clone())
    side.synchronize()
    assert torch.equal(y.view(torch.int16), x.view(torch.int16))


def test_gpu_validating_decode_refuses_a_capture() -> None:
    """sync=True waits for the device, which a CUDA graph capture cannot: a ValueError saying
    what to capture instead, not a broken capture."""
    x = gaussian(50_000, torch.bfloat16, seed=63).to(CUDA)
    c = zipccl.compress(x)
    y = zipccl.decompress(c)  # warm: kernels and plan built outside the capture
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(ValueError, match="sync=False"), torch.cuda.graph(graph):
        zipccl.decompress(c, out=y)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn])
def test_gpu_compress_decompress_capture_and_replay(dtype: torch.dtype) -> None:
    """compress -> decompress with the default table in one CUDA graph: replays with new data in
    the input are bit-exact, and the captured buffer equals an eager compress of that data."""
    n = 1 << 20
    x = torch.empty(n, dtype=dtype, device=CUDA)
    x.copy_(torch.randn(n, device=CUDA).to(dtype))
    y = torch.empty_like(x)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm up: build the kernels and plans outside the capture
        zipccl.decompress(zipccl.compress(x), out=y, sync=False)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        c = zipccl.compress(x)
        zipccl.decompress(c, out=y, sync=False)
    for seed, scale in enumerate([1.0, 1e-3, 50.0, 0.0]):
        g = torch.Generator(device=CUDA).manual_seed(seed)
        x.copy_((torch.randn(n, device=CUDA, generator=g) * scale).to(dtype))
        y.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(y.view(torch.uint8), x.view(torch.uint8)), f"replay {seed}"
        eager = zipccl.compress(x)
        assert torch.equal(c._storage[: eager.nbytes], eager.buffer), f"replay {seed}"
    zipccl.check_errors()


def test_gpu_calls_in_any_order_share_one_scratch() -> None:
    """The table kernels leave their control zero (compress with no table has no memset): calls
    of every format, size and table kind, in turn on one stream, each give the CPU's bytes."""
    calls = []
    for i, dtype in enumerate(
        [torch.bfloat16, torch.float8_e4m3fn, torch.float16, torch.float8_e5m2, torch.float32] * 2
    ):
        x = gaussian([300_001, 5_000, 2_000_003][i % 3], dtype, seed=80 + i, scale=1.5**i)
        table = zipccl.histogram_table(x) if i % 4 == 3 else None
        calls.append((x, table))
    for x, table in calls + calls[::-1]:
        c = zipccl.compress(x.to(CUDA), table)
        assert torch.equal(c.buffer.cpu(), zipccl.compress(x, table).buffer), (x.dtype, x.numel())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn, torch.float32])
def test_gpu_back_to_back_compresses_reuse_their_graph(dtype: torch.dtype) -> None:
    """Calls of one plan replay one recorded graph with their own parameters (codec.cu
    run_chain): queued back to back with no sync, so each call's parameters are set while earlier
    replays still run, alternating two streams (a graph each) and the default table with a given
    one (a memset node instead of the table kernel), every buffer is the CPU's."""
    n = 300_001
    xs = [gaussian(n, dtype, seed=90 + i, scale=3.0**i) for i in range(8)]
    given = zipccl.default_table(xs[0])
    streams = [torch.cuda.current_stream(), torch.cuda.Stream()]
    streams[1].wait_stream(streams[0])
    queued = []
    for i, x in enumerate(xs):
        table = given if i % 4 >= 2 else None
        with torch.cuda.stream(streams[i % 2]):
            xg = x.to(CUDA, non_blocking=True)
            queued.append((zipccl.compress(xg), zipccl.compress(xg, table), xg, table, x))
    torch.cuda.synchronize()
    for i, (default, chosen, _, table, x) in enumerate(queued):
        assert torch.equal(default.buffer.cpu(), zipccl.compress(x).buffer), (dtype, i)
        assert torch.equal(chosen.buffer.cpu(), zipccl.compress(x, table).buffer), (dtype, i)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn, torch.float16])
def test_gpu_calls_on_the_same_buffers_code_the_values_now(dtype: torch.dtype) -> None:
    """A call with the call before's tensors and buffers finds its graph's parameters already
    set and does not set them again (launch.cuh NodeParams): queued with no sync, with the inputs
    overwritten in place between calls, alternating two inputs and the default table with a given
    one (the memset node), each buffer holds the CPU's bytes for the values it was called on."""
    n = 200_003
    given = zipccl.default_table(gaussian(n, dtype, seed=120))
    inputs = [torch.empty(n, dtype=dtype, device=CUDA) for _ in range(2)]
    out = torch.empty(zipccl.max_compressed_bytes(dtype, n), dtype=torch.uint8, device=CUDA)
    queued = []
    for i in range(8):
        x = gaussian(n, dtype, seed=121 + i, scale=2.0 ** (i % 3))
        table = given if i % 4 >= 2 else None
        target = inputs[(i // 2) % 2]  # each input twice in a row: the same parameters
        target.copy_(x, non_blocking=True)
        zipccl.compress_into(target, out, table)
        queued.append((out.clone(), x, table))
    torch.cuda.synchronize()
    for i, (snapshot, x, table) in enumerate(queued):
        want = zipccl.compress(x, table).buffer
        assert torch.equal(snapshot[: want.numel()].cpu(), want), (dtype, i)


def test_gpu_threads_do_not_share_scratch() -> None:
    """Two host threads compressing on the default stream each get their own scratch."""
    import threading

    xs = [gaussian(400_001, torch.bfloat16, seed=70 + i, scale=10.0**i).to(CUDA) for i in range(2)]
    results: dict[int, list[torch.Tensor]] = {0: [], 1: []}

    def work(i: int) -> None:
        for _ in range(20):
            results[i].append(zipccl.compress(xs[i]).buffer)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(2):
        want = zipccl.compress(xs[i]).buffer
        assert all(torch.equal(b, want) for b in results[i])


@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_torch_backend_by_chunks_equals_cpu(dtype: torch.dtype, monkeypatch) -> None:
    """The torch ops (the fallback where the kernels cannot be built) on CUDA, chunk by chunk of
    whole blocks and in int32 as on CPU: the CPU's bytes, the tensor back, corruption refused."""
    x = gaussian(3 * 65536 + 77, dtype, seed=9, scale=2.0)
    want = zipccl.compress(x, fitted(dtype), block=1024)
    monkeypatch.setenv("ZIPCCL_BACKEND", "torch")
    got = zipccl.compress(x.to(CUDA), fitted(dtype), block=1024)
    assert torch.equal(got.buffer.cpu(), want.buffer)
    back = zipccl.decompress(got)
    assert back.is_cuda and np.array_equal(bits_np(back.cpu()), bits_np(x))
    sec = container.Sections.of(container.Header.unpack(want.header_bytes()).fmt, x.numel(), 1024)
    with pytest.raises(ValueError, match="offsets disagree"):
        zipccl.decompress(corrupted(got.buffer, sec.offsets + 8 * 70 + 7, 0x40))
