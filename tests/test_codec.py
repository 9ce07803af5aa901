"""zipccl.codec on CPU (the vectorised torch backend): golden bytes, round trips, bad input."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
import zipccl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from zipccl import codec
from zipccl.golden import builders, container, presets, theory
from zipccl.golden.codebook import Codebook
from zipccl.golden.formats import get_format

from tests.strategies import codebooks

DTYPES = [torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn, torch.float8_e5m2]
UINT = {8: torch.uint8, 16: torch.int16, 32: torch.int32}


def bits_np(x: torch.Tensor) -> np.ndarray:
    """The tensor's bit patterns as the numpy unsigned array golden/ takes."""
    fmt = get_format(str(x.dtype).removeprefix("torch."))
    return x.contiguous().view(UINT[fmt.bits]).numpy().view(fmt.uint)


def fitted(dtype: torch.dtype) -> str | None:
    """FP8 presets fit absmax-scaled activations, not these test tensors: fit the table instead so
    the split layout (not the raw fallback) is what gets tested."""
    return "histogram" if torch.finfo(dtype).bits == 8 else None


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and np.array_equal(bits_np(a), bits_np(b))


def gaussian(n: int, dtype: torch.dtype, seed: int, scale: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, generator=g) * scale).to(dtype)


def random_bits(n: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Uniform bit patterns: NaN payloads, infinities, -0, subnormals all appear."""
    bits = get_format(str(dtype).removeprefix("torch.")).bits
    g = torch.Generator().manual_seed(seed)
    raw = torch.randint(0, 1 << bits, (n,), generator=g, dtype=torch.int64)
    return torch.where(raw >= 1 << (bits - 1), raw - (1 << bits), raw).to(UINT[bits]).view(dtype)


def check(
    x: torch.Tensor, table: Codebook | str | None = None, block: int = 4096
) -> codec.Compressed:
    """compress == golden bytes, and decompress (ours and golden's) gives the input back."""
    c = zipccl.compress(x, table, block=block)
    fmt = get_format(str(x.dtype).removeprefix("torch."))
    book = c.table if c.table is not None else zipccl.default_table(x)
    if isinstance(table, Codebook):
        book = table
    gold = container.encode(bits_np(x), fmt, book, block)
    assert bytes(c.buffer.numpy()) == gold
    assert c.nbytes == len(gold) and c.buffer.numel() == c.nbytes
    assert c.ratio == pytest.approx(len(gold) / max(1, x.numel() * x.element_size()))
    assert same_bits(zipccl.decompress(c), x.contiguous())
    _, back = container.decode(gold)
    assert np.array_equal(back, bits_np(x))
    return c


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [0, 1, 7, 8, 63, 4095, 4097, 20001])
def test_golden_bytes_gaussian(dtype: torch.dtype, n: int) -> None:
    check(gaussian(n, dtype, seed=n, scale=3.0), fitted(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block", [64, 256, 1024])
def test_golden_bytes_blocks(dtype: torch.dtype, block: int) -> None:
    c = check(gaussian(5 * block + 3, dtype, seed=block), fitted(dtype), block=block)
    assert c.block == block


@pytest.mark.parametrize("dtype", DTYPES)
def test_random_bits_fall_back_to_raw(dtype: torch.dtype) -> None:
    c = check(random_bits(5000, dtype, seed=1))
    assert c.layout == "raw" and c.table_hash == 0
    assert c.nbytes == zipccl.max_compressed_bytes(dtype, 5000)


@pytest.mark.parametrize("dtype", [d for d in DTYPES if d != torch.float32])
def test_exhaustive_bit_patterns_split(dtype: torch.dtype) -> None:
    """Every bit pattern of the format, hidden in compressible data so the split layout is used."""
    bits = get_format(str(dtype).removeprefix("torch.")).bits
    every = torch.arange(1 << bits, dtype=torch.int64)
    every = torch.where(every >= 1 << (bits - 1), every - (1 << bits), every).to(UINT[bits])
    filler = gaussian(20 * (1 << bits), dtype, seed=7).view(UINT[bits])
    order = torch.randperm(21 << bits, generator=torch.Generator().manual_seed(3))
    mixed = torch.cat([every, filler])[order]
    c = check(mixed.view(dtype), table="histogram")  # extreme values skew the theory RMS
    assert c.layout == "split"


def test_fp32_specials_split() -> None:
    specials = torch.tensor(
        [
            0x00000000,
            0x80000000,
            0x7F800000,
            0xFF800000,
            0x7FC00001,
            0xFFBFFFFF,
            0x00000001,
            0x807FFFFF,
            0x00800000,
            0x7F7FFFFF,
        ],
        dtype=torch.int64,
    )
    specials = torch.where(specials >= 1 << 31, specials - (1 << 32), specials).to(torch.int32)
    x = torch.cat([specials.view(torch.float32), gaussian(50000, torch.float32, seed=2)])
    c = check(x, table="histogram")  # FLT_MAX in the sample would dominate the theory RMS
    assert c.layout == "split"


@pytest.mark.parametrize("dtype", DTYPES)
def test_shapes_and_noncontiguous(dtype: torch.dtype) -> None:
    x = gaussian(6 * 70 * 50, dtype, seed=4).view(6, 70, 50)
    view = x.transpose(0, 2)[:, ::2]
    c = check(view, fitted(dtype))
    assert c.shape == view.shape and c.dtype == dtype and c.numel == view.numel()
    out = torch.empty_like(view)
    assert zipccl.decompress(c, out=out) is out and same_bits(out, view)


def test_zero_dim_and_empty_shapes() -> None:
    check(torch.tensor(1.5, dtype=torch.bfloat16))
    c = check(torch.zeros(3, 0, 2, dtype=torch.float16))
    assert zipccl.decompress(c).shape == (3, 0, 2)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    dtype=st.sampled_from(DTYPES),
    shape=st.lists(st.integers(0, 40), min_size=0, max_size=4),
    seed=st.integers(0, 2**31 - 1),
    scale=st.sampled_from([1e-30, 1e-3, 1.0, 7.0, 1e4]),
    block=st.sampled_from([64, 128, 4096]),
)
def test_hypothesis_round_trip(
    dtype: torch.dtype, shape: list[int], seed: int, scale: float, block: int
) -> None:
    n = int(np.prod(shape)) if shape else 1
    x = gaussian(n, dtype, seed, scale).view(shape)
    check(x, fitted(dtype), block=block)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    book=codebooks(),
    seed=st.integers(0, 2**31 - 1),
    dtype=st.sampled_from([torch.bfloat16, torch.float8_e4m3fn]),
)
def test_any_table(book: Codebook, seed: int, dtype: torch.dtype) -> None:
    """Any complete table, including ones with mixed payload widths, gives golden's bytes."""
    check(gaussian(3000, dtype, seed, scale=0.5), table=book, block=256)


def test_default_table_mirrors_golden() -> None:
    x = gaussian(300001, torch.bfloat16, seed=5, scale=0.02)
    x[::3] = 0
    values = x.to(torch.float64).numpy()[theory.sample_indices(x.numel())]
    want = theory.zipccl_table(get_format("bfloat16"), theory.tensor_stats(values))
    assert zipccl.default_table(x) == want
    assert zipccl.compress(x).table_hash == want.hash64


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2], ids=str)
def test_fp8_default_fits_the_sample_on_cpu(dtype: torch.dtype) -> None:
    """FP8 on CPU: the staircase table of golden's sample's bytes, the summary's table too."""
    x = gaussian(300001, dtype, seed=1, scale=30.0)
    sample = bits_np(x)[theory.sample_indices(x.numel())]
    want = builders.staircase_table(np.bincount(sample, minlength=256))
    assert zipccl.default_table(x) == want != presets.qlc_e4m3()
    assert codec.summary_table(dtype, codec.sample_summary(x).numpy()) == want
    assert zipccl.compress(x).table_hash == want.hash64
    assert check(torch.empty(0, dtype=dtype)).layout == "raw"


@pytest.mark.parametrize("dtype", DTYPES)
def test_histogram_table_mode(dtype: torch.dtype) -> None:
    x = gaussian(30000, dtype, seed=6, scale=2.0)
    c = check(x, table="histogram")
    assert c.table == zipccl.histogram_table(x)


def test_compress_into_and_from_buffer() -> None:
    x = gaussian(10000, torch.bfloat16, seed=8)
    cap = zipccl.max_compressed_bytes(x.dtype, x.numel())
    out = torch.full((cap + 100,), 0xAB, dtype=torch.uint8)
    c = zipccl.compress_into(x, out)
    assert c.buffer.data_ptr() == out.data_ptr()
    assert zipccl.fixed_part_bytes(x.dtype, x.numel()) + c.payload_bytes == c.nbytes
    parsed = zipccl.Compressed.from_buffer(c.buffer.clone())
    assert parsed.table == c.table and parsed.nbytes == c.nbytes and parsed.layout == "split"
    assert same_bits(zipccl.decompress(parsed.buffer), x)


def test_bad_arguments() -> None:
    x = gaussian(100, torch.bfloat16, seed=9)
    with pytest.raises(TypeError, match="unsupported dtype"):
        zipccl.compress(torch.zeros(4, dtype=torch.int32))
    with pytest.raises(TypeError, match="table must be"):
        zipccl.compress(x, table="nope")
    with pytest.raises(ValueError, match="block"):
        zipccl.compress(x, block=100)
    with pytest.raises(ValueError, match="at least"):
        zipccl.compress_into(x, torch.empty(10, dtype=torch.uint8))
    c = zipccl.compress(x)
    with pytest.raises(ValueError, match="out must be"):
        zipccl.decompress(c, out=torch.empty(99, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match=r"1-D torch\.uint8"):
        zipccl.Compressed.from_buffer(torch.empty(600, dtype=torch.int16))


def corrupted(buf: torch.Tensor, at: int, value: int) -> torch.Tensor:
    bad = buf.clone()
    bad[at] = value
    return bad


def test_corrupt_buffers_raise_value_error() -> None:
    x = gaussian(50000, torch.bfloat16, seed=10, scale=2.0)
    c = zipccl.compress(x)
    sec = container.Sections.of(get_format("bfloat16"), x.numel(), c.block)
    buf = c.buffer
    cases = {
        "truncated": buf[:-1],
        "padded": torch.cat([buf, torch.zeros(1, dtype=torch.uint8)]),
        "short": buf[:100],
        "header": corrupted(buf, 20, int(buf[20]) ^ 1),
        "offset": corrupted(buf, sec.offsets + 8 * 3 + 7, 0x40),
    }
    odd = Codebook((8, 1, 1, 1, 1, 1, 1, 1), 0, tuple(range(118, 132)))  # 4-bit codes: padding
    tail = zipccl.compress(x[:4002], table=odd).buffer
    cases["payload padding"] = corrupted(tail, tail.numel() - 1, int(tail[-1]) | 1)
    with pytest.raises(ValueError, match="padding"):
        container.decode(bytes(cases["payload padding"].numpy()))
    for name, bad in cases.items():
        with pytest.raises(ValueError):
            zipccl.decompress(bad)
        print("rejected", name)


def test_a_shape_whose_strides_overflow_is_a_value_error() -> None:
    """Issue 37: (0, 2^48, 2^48, 2^48) holds no element and has a valid CRC, but torch cannot
    allocate it (RuntimeError: stride calculation overflowed); the header check refuses it."""
    head = container.Header(
        container.LAYOUT_RAW, get_format("bfloat16"), (0, 1 << 48, 1 << 48, 1 << 48), 4096, 0, None
    )
    buf = torch.frombuffer(bytearray(head.pack()), dtype=torch.uint8)
    with pytest.raises(ValueError, match="does not hold"):
        zipccl.decompress(buf)


def test_a_split_buffer_of_no_elements_decodes_as_golden_does() -> None:
    table = theory.zipccl_table(get_format("bfloat16"), theory.TensorStats(1.0, 0.0))
    head = container.Header(container.LAYOUT_SPLIT, get_format("bfloat16"), (0, 3), 4096, 0, table)
    y = zipccl.decompress(torch.frombuffer(bytearray(head.pack()), dtype=torch.uint8))
    assert y.dtype == torch.bfloat16 and y.shape == (0, 3)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), flips=st.integers(1, 4))
def test_random_corruption_agrees_with_golden(seed: int, flips: int) -> None:
    """Corruption past the header: we reject exactly what golden rejects, else decode the same."""
    x = gaussian(9000, torch.float8_e4m3fn, seed=11, scale=20.0)
    c = zipccl.compress(x, "histogram", block=1024)
    assert c.layout == "split"
    rng = np.random.default_rng(seed)
    bad = c.buffer.clone()
    for at in rng.integers(container.HEADER_BYTES, bad.numel(), flips):
        bad[int(at)] ^= int(rng.integers(1, 256))
    try:
        _, want = container.decode(bytes(bad.numpy()))
    except ValueError:
        with pytest.raises(ValueError):
            zipccl.decompress(bad)
        return
    assert np.array_equal(bits_np(zipccl.decompress(bad)), want)


@settings(max_examples=30, deadline=None)
@given(
    payload=st.integers(0, 2**48),
    dtype=st.sampled_from(DTYPES),
    shape=st.lists(st.integers(1, 9), min_size=0, max_size=8),
    checksum=st.none() | st.integers(0, 2**64 - 1),
)
def test_fast_header_equals_golden(
    payload: int, dtype: torch.dtype, shape: list[int], checksum: int | None
) -> None:
    """The hot-path header packer (template + patched payload size, checksum and CRC) ==
    Header.pack()."""
    fmt = get_format(str(dtype).removeprefix("torch."))
    book = zipccl.default_table(torch.ones(4, dtype=dtype))
    head = container.Header(
        container.LAYOUT_SPLIT, fmt, tuple(shape), 1024, payload, book, checksum
    )
    assert codec._pack_header(head) == head.pack()


@pytest.mark.parametrize("table", [None, "histogram"])
def test_tensors_that_require_grad_compress(table: str | None) -> None:
    """A parameter (requires_grad=True) compresses as torch.save would store it."""
    x = gaussian(5000, torch.float32, seed=81).requires_grad_()
    c = zipccl.compress(x, table)
    assert torch.equal(zipccl.decompress(c).view(torch.int32), x.detach().view(torch.int32))
    assert zipccl.default_table(x) == zipccl.default_table(x.detach())


def test_a_malformed_backend_setting_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZIPCCL_BACKEND", "fastest")
    with pytest.raises(ValueError, match="ZIPCCL_BACKEND"):
        zipccl.compress(gaussian(5000, torch.bfloat16, seed=1))


# --------------------------------------------------------------------------- storing
def _saved_bytes(obj: object) -> int:
    f = io.BytesIO()
    torch.save(obj, f)
    return len(f.getvalue())


def test_a_cpu_buffer_owns_exactly_its_bytes() -> None:
    """Issue 37: c.buffer was a view of the raw-size allocation, so torch.save(c.buffer) stored
    more than torch.save(x)."""
    x = gaussian(1 << 16, torch.bfloat16, seed=3)
    c = zipccl.compress(x)
    assert c.layout == "split"
    assert c.buffer.untyped_storage().nbytes() == c.nbytes
    assert _saved_bytes(c.buffer) < c.nbytes + 2048 < _saved_bytes(x)


def test_to_bytes_and_from_bytes_round_trip() -> None:
    x = gaussian(5000, torch.float8_e4m3fn, seed=4, scale=8.0)
    c = zipccl.compress(x, checksum=True)
    data = c.to_bytes()
    assert len(data) == c.nbytes and isinstance(data, bytes)
    for form in (data, bytearray(data), memoryview(data)):
        back = zipccl.Compressed.from_bytes(form)
        assert back.checksummed and back.nbytes == c.nbytes
        assert torch.equal(zipccl.decompress(back).view(torch.uint8), x.view(torch.uint8))
    with pytest.raises(ValueError, match="truncated or padded"):
        zipccl.Compressed.from_bytes(data[:-1])
    with pytest.raises(ValueError, match="shorter than the header"):
        zipccl.Compressed.from_bytes(b"")
    with pytest.raises(TypeError):
        zipccl.Compressed.from_bytes("text")  # type: ignore[arg-type]


def test_torch_save_of_a_compressed_keeps_nbytes_and_loads_weights_only() -> None:
    x = gaussian(1 << 15, torch.bfloat16, seed=5)
    out = torch.empty(4 * codec.max_compressed_bytes(x.dtype, x.numel()), dtype=torch.uint8)
    c = zipccl.compress_into(x, out)  # a view of a 4x larger out
    assert _saved_bytes(c) < c.nbytes + 2048 < _saved_bytes(c.buffer)
    f = io.BytesIO()
    torch.save(c, f)
    f.seek(0)
    with torch.serialization.safe_globals([zipccl.Compressed]):
        back = torch.load(f, weights_only=True)
    assert isinstance(back, zipccl.Compressed) and back.nbytes == c.nbytes
    assert torch.equal(zipccl.decompress(back), x)
    bad = c.buffer.clone()
    bad[20] ^= 1  # the header's CRC no longer holds
    forged = zipccl.Compressed.__new__(zipccl.Compressed)
    with pytest.raises(ValueError, match="header checksum"):
        forged.__setstate__({"buffer": bad})
    with pytest.raises(ValueError, match="not a pickled"):
        forged.__setstate__({"storage": c.buffer})
