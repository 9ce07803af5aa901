"""The compressed-buffer format: exhaustive bit patterns, raw fallback, and corrupt buffers."""

from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from zipccl.golden import container
from zipccl.golden.codebook import Codebook
from zipccl.golden.container import (
    DEFAULT_BLOCK,
    HEADER_BYTES,
    LAYOUT_RAW,
    LAYOUT_SPLIT,
    MAX_NUMEL,
    PAYLOAD_BYTES_AT,
    Header,
    decode,
    encode,
    encode_raw,
)
from zipccl.golden.formats import BF16, E4M3, E5M2, FORMATS, FP16, FP32, FloatFormat, get_format
from zipccl.golden.streams import StreamError
from zipccl.golden.theory import TensorStats, zipccl_table

from tests.strategies import QLC, codebooks

SEED = 20261129


def _bf16_normal(n: int, seed: int = SEED, scale: float = 1.0) -> np.ndarray:
    x = (np.random.default_rng(seed).standard_normal(n) * scale).astype(np.float32)
    return (x.view(np.uint32) >> 16).astype(np.uint16)  # truncation: fine for a data source


def _round_trip(bits: np.ndarray, fmt: FloatFormat, table: Codebook, block: int = 4096) -> bytes:
    buf = encode(bits, fmt, table, block)
    got_fmt, got = decode(buf)
    assert got_fmt == fmt and got.dtype == bits.dtype and got.shape == bits.shape
    assert np.array_equal(got, bits), f"round trip differs (seed {SEED})"
    return buf


@pytest.mark.parametrize("fmt", [BF16, FP16], ids=lambda f: f.name)
@pytest.mark.parametrize("rms", [1e-3, 1.0, 300.0])
def test_all_65536_patterns_round_trip_under_theory_tables(fmt: FloatFormat, rms: float) -> None:
    bits = np.arange(1 << 16, dtype=np.uint16)
    _round_trip(bits, fmt, zipccl_table(fmt, TensorStats(rms, 0.0)))


@pytest.mark.parametrize("fmt", [E4M3, E5M2], ids=lambda f: f.name)
@pytest.mark.parametrize("block", [64, 4096])
def test_all_256_bytes_round_trip_under_qlc(fmt: FloatFormat, block: int) -> None:
    bits = np.tile(np.arange(256, dtype=np.uint8), 8)  # repeated so the split layout wins
    buf = _round_trip(bits, fmt, QLC, block)
    assert Header.unpack(buf).layout in (LAYOUT_SPLIT, LAYOUT_RAW)


def test_fp32_special_values_round_trip() -> None:
    specials = np.array(
        [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 1.1754942e-38, 3.4028235e38, 1.0],
        np.float32,
    ).view(np.uint32)
    payload_nans = np.array([0x7FC00001, 0xFFFFFFFF, 0x7F800001, 0xFF812345], np.uint32)
    normal = np.random.default_rng(SEED).standard_normal(5000).astype(np.float32).view(np.uint32)
    bits = np.concatenate([specials, payload_nans, normal])
    _round_trip(bits, FP32, zipccl_table(FP32, TensorStats(1.0, 0.0)))


def test_gaussian_bf16_compresses_to_about_eleven_bits() -> None:
    bits = _bf16_normal(1 << 18)
    buf = _round_trip(bits, BF16, zipccl_table(BF16, TensorStats(1.0, 0.0)))
    bits_per_element = 8 * len(buf) / bits.size
    assert Header.unpack(buf).layout == LAYOUT_SPLIT
    assert 11.0 < bits_per_element < 11.5, bits_per_element


@settings(max_examples=40, deadline=None)
@given(
    codebooks(),
    st.sampled_from(sorted(FORMATS)),
    st.lists(st.integers(0, 5), min_size=0, max_size=3),
    st.sampled_from([64, 256, 4096]),
    st.integers(0, 2**32 - 1),
)
def test_any_table_shape_and_format_round_trips(book, name, shape, block, seed) -> None:
    fmt = get_format(name)
    info = np.iinfo(fmt.uint)
    bits = np.random.default_rng(seed).integers(0, int(info.max) + 1, shape, dtype=fmt.uint)
    buf = _round_trip(bits, fmt, book, block)
    assert len(buf) <= HEADER_BYTES + bits.nbytes


@pytest.mark.parametrize("fmt", list(FORMATS.values()), ids=lambda f: f.name)
def test_incompressible_data_falls_back_to_raw(fmt: FloatFormat) -> None:
    info = np.iinfo(fmt.uint)
    bits = np.random.default_rng(SEED).integers(0, int(info.max) + 1, 10_000, dtype=fmt.uint)
    table = QLC if fmt.byte_coded else zipccl_table(fmt, TensorStats(1.0, 0.0))
    buf = _round_trip(bits, fmt, table)
    assert Header.unpack(buf).layout == LAYOUT_RAW
    assert len(buf) == HEADER_BYTES + bits.nbytes


@pytest.mark.parametrize("shape", [(), (0,), (1,), (3, 0, 2), (7,), (2, 3, 5)])
def test_edge_shapes_round_trip(shape: tuple[int, ...]) -> None:
    bits = _bf16_normal(int(np.prod(shape))).reshape(shape)
    _round_trip(bits, BF16, zipccl_table(BF16, TensorStats(1.0, 0.0)))


def test_wrong_dtype_and_bad_arguments_raise_type_and_value_errors() -> None:
    table = zipccl_table(BF16, TensorStats(1.0, 0.0))
    with pytest.raises(TypeError, match="uint16 array"):
        encode(np.zeros(4, np.float32), BF16, table)
    with pytest.raises(TypeError, match="uint16 array"):
        encode([1, 2, 3], BF16, table)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="power of two"):
        encode(np.zeros(4, np.uint16), BF16, table, block=100)
    with pytest.raises(ValueError, match="dimensions"):
        encode(np.zeros((1,) * 9, np.uint16), BF16, table)
    with pytest.raises(TypeError, match="unsupported dtype"):
        get_format("int8")
    with pytest.raises(TypeError, match="bytes-like"):
        decode("not bytes")  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def good_buffer() -> bytes:
    return encode(_bf16_normal(10_000), BF16, zipccl_table(BF16, TensorStats(1.0, 0.0)), 256)


def _patch_header(buf: bytes, at: int, value: bytes, fix_crc: bool = True) -> bytes:
    out = bytearray(buf)
    out[at : at + len(value)] = value
    if fix_crc:
        crc = zlib.crc32(out[: HEADER_BYTES - 4])
        out[HEADER_BYTES - 4 : HEADER_BYTES] = struct.pack("<I", crc)
    return bytes(out)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda b: b[:100], "shorter than the header"),
        (lambda b: b[: HEADER_BYTES + 10], "truncated"),
        (lambda b: b[:-1], "truncated"),
        (lambda b: b + b"\x00", "truncated or padded"),
        (lambda b: b"XXXX" + b[4:], "magic"),
        (lambda b: _patch_header(b, 4, b"\x09"), "version 9"),
        (lambda b: _patch_header(b, 20, b"\x01", fix_crc=False), "checksum"),
        (lambda b: _patch_header(b, 6, b"\x63"), "dtype code 99"),
        (lambda b: _patch_header(b, 5, b"\x07"), "unknown layout"),
        (lambda b: _patch_header(b, 8, struct.pack("<I", 100)), "block size 100"),
        (lambda b: _patch_header(b, 16, struct.pack("<Q", 10_001)), "does not hold"),
        (lambda b: _patch_header(b, 96, b"\xff"), "table hash"),
        (lambda b: _patch_header(b, 104, b"\x4f"), "header table is invalid"),
    ],
)
def test_corrupt_buffers_raise_value_error(good_buffer: bytes, mutate, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        decode(mutate(good_buffer))


def test_corrupt_offsets_and_illegal_codewords_are_detected(good_buffer: bytes) -> None:
    head = Header.unpack(good_buffer)
    sec = container.Sections.of(head.fmt, head.numel, head.block)
    bad = bytearray(good_buffer)
    bad[sec.offsets + 8] ^= 0x01  # block 1 starts one byte off
    with pytest.raises(StreamError, match="offsets disagree"):
        decode(bytes(bad))
    bad = bytearray(good_buffer)
    bad[sec.prefix[0]] ^= 0x01  # element 0 changes region: the escape count no longer matches
    with pytest.raises(StreamError):
        decode(bytes(bad))


def test_every_truncation_of_a_small_buffer_is_rejected() -> None:
    buf = encode(_bf16_normal(300), BF16, zipccl_table(BF16, TensorStats(1.0, 0.0)), 64)
    for cut in range(0, len(buf), 7):
        with pytest.raises(ValueError):
            decode(buf[:cut])


def test_header_round_trips_and_records_the_table_hash(good_buffer: bytes) -> None:
    head = Header.unpack(good_buffer)
    assert head.table is not None and head.shape == (10_000,) and head.block == 256
    assert struct.unpack_from("<Q", good_buffer, 96)[0] == head.table.hash64
    assert struct.unpack_from("<Q", good_buffer, PAYLOAD_BYTES_AT)[0] == head.payload_bytes > 0
    assert head.pack() == good_buffer[:HEADER_BYTES]


def _patch_shape(buf: bytes, shape: tuple[int, ...], numel: int) -> bytes:
    """The header's ndim, numel and dims rewritten (CRC fixed), the body untouched."""
    dims = struct.pack("<8Q", *shape, *[0] * (8 - len(shape)))
    out = _patch_header(buf, 7, bytes([len(shape)]))
    return _patch_header(_patch_header(out, 16, struct.pack("<Q", numel)), 32, dims)


@pytest.mark.parametrize(
    ("shape", "numel"),
    [
        ((40, 2**61 + 50), 2000),  # wraps to 2000 in int64
        ((2**32, 2**32), 0),  # wraps to 0
        ((0, 2**63), 0),  # holds no element, but no tensor has that dimension
        ((MAX_NUMEL + 1,), MAX_NUMEL + 1),
        ((2**24, 2**25), 2**49),  # each dimension in range, the product not
        ((0, 2**48, 2**48, 2**48), 0),  # holds nothing, but its strides overflow int64
        ((2**40, 0, 2**9), 0),
    ],
)
def test_header_shapes_are_checked_with_exact_integers(good_buffer: bytes, shape, numel) -> None:
    with pytest.raises(StreamError, match="does not hold"):
        Header.unpack(_patch_shape(good_buffer, shape, numel))


def test_header_shape_of_the_right_product_is_accepted(good_buffer: bytes, raw_buffer) -> None:
    head = Header.unpack(_patch_shape(good_buffer, (100, 100), 10_000))
    assert head.shape == (100, 100) and head.numel == 10_000
    assert Header.unpack(_patch_shape(raw_buffer, (0, 2**24, 2**24), 0)).shape == (0, 2**24, 2**24)


def test_a_split_header_of_no_elements_decodes_to_an_empty_tensor() -> None:
    """encode() writes an empty tensor in the raw layout, but a split writer (the collectives'
    pieces, streams.encode_split) writes a split header of no elements: accepted, decoded to no
    values, and any payload size or body is refused."""
    table = zipccl_table(BF16, TensorStats(1.0, 0.0))
    assert Header.unpack(encode(np.zeros((0, 3), np.uint16), BF16, table)).layout == LAYOUT_RAW
    empty = Header(LAYOUT_SPLIT, BF16, (0, 3), DEFAULT_BLOCK, 0, table).pack()
    fmt, values = decode(empty)
    assert fmt == BF16 and values.shape == (0, 3)
    with pytest.raises(StreamError, match="payload of 1 bytes"):
        Header.unpack(Header(LAYOUT_SPLIT, BF16, (0, 3), DEFAULT_BLOCK, 1, table).pack())
    with pytest.raises(StreamError, match="truncated or padded"):
        decode(empty + b"\0")


@pytest.fixture(scope="module")
def raw_buffer() -> bytes:
    bits = np.random.default_rng(SEED).integers(0, 1 << 16, 3000, dtype=np.uint16)
    buf = encode(bits, BF16, zipccl_table(BF16, TensorStats(1.0, 0.0)), 1024)
    assert buf == encode_raw(bits, BF16, 1024)
    return buf


@pytest.mark.parametrize(
    ("at", "value", "message"),
    [
        (PAYLOAD_BYTES_AT, struct.pack("<Q", 1), "payload size"),
        (8, struct.pack("<I", 0), "block size 0"),
        (8, struct.pack("<I", 100), "block size 100"),
        (8, struct.pack("<I", 1 << 21), "block size"),
    ],
)
def test_raw_headers_have_no_payload_size_and_a_valid_block(
    raw_buffer: bytes, at: int, value: bytes, message: str
) -> None:
    """The raw layout ignores these fields, so any value but the encoder's is non-canonical."""
    with pytest.raises(StreamError, match=message):
        decode(_patch_header(raw_buffer, at, value))


def test_split_payload_size_is_bounded_by_one_byte_per_element(good_buffer: bytes) -> None:
    head = Header.unpack(good_buffer)
    for payload, ok in [(head.numel, True), (head.numel + 1, False), (2**63, False)]:
        forged = Header(LAYOUT_SPLIT, head.fmt, head.shape, head.block, payload, head.table)
        if ok:
            assert Header.unpack(forged.pack()).payload_bytes == payload
        else:
            with pytest.raises(StreamError, match="payload of"):
                Header.unpack(forged.pack())


@pytest.mark.parametrize("fmt", list(FORMATS.values()), ids=lambda f: f.name)
def test_alignment_gaps_must_be_zero(fmt: FloatFormat) -> None:
    """Every gap byte between sections is checked: flip each gap's first and last byte."""
    table = QLC if fmt.byte_coded else zipccl_table(fmt, TensorStats(1.0, 0.5))
    bits = np.zeros(1001, fmt.uint)  # all zeros, a ranked symbol: the split layout wins
    buf = encode(bits, fmt, table, 64)
    sec = container.Sections.of(fmt, bits.size, 64)
    assert Header.unpack(buf).layout == LAYOUT_SPLIT and sec.gaps
    for lo, hi in sec.gaps:
        assert not any(buf[lo:hi])
        for at in (lo, hi - 1):
            bad = bytearray(buf)
            bad[at] = 0x80
            with pytest.raises(StreamError, match="alignment gap"):
                decode(bytes(bad))


@pytest.mark.parametrize("n", [0, 1, 7, 8, 127, 128, 129, 4097])
def test_sections_and_gaps_tile_the_fixed_part(n: int) -> None:
    for fmt in FORMATS.values():
        sec = container.Sections.of(fmt, n, 64)
        plane = (n + 7) // 8
        spans = [(at, at + n) for at in sec.raw_bytes]
        spans += [(at, at + plane) for at in sec.raw_bits + sec.prefix]
        spans += [(sec.offsets, sec.offsets + 8 * -(-n // 64)), *sec.gaps]
        covered = sorted((lo, hi) for lo, hi in spans if hi > lo)
        ends = [HEADER_BYTES] + [hi for _, hi in covered]
        assert [lo for lo, _ in covered] == ends[:-1] and ends[-1] == sec.payload
