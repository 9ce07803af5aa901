"""The values checksum of ``checksum=True`` buffers: its definition, the header field, and that
every single-bit flip of a checksummed buffer is rejected (most are not without it)."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from zipccl.golden import container
from zipccl.golden.container import (
    CHECKSUM_AT,
    FLAG_CHECKSUM,
    FLAGS_AT,
    HEADER_BYTES,
    Header,
    decode,
    encode,
    encode_raw,
    values_checksum,
)
from zipccl.golden.formats import BF16, E4M3, FORMATS, FloatFormat
from zipccl.golden.theory import TensorStats, zipccl_table

from tests.strategies import QLC
from tests.test_golden_container import _bf16_normal, _patch_header

SEED = 20261202
MASK = 0xFFFFFFFF


def _reference(data: bytes) -> int:
    """values_checksum written out word by word in plain Python integers."""
    data += bytes(-len(data) % 8)
    w = [int.from_bytes(data[i : i + 4], "little") for i in range(0, len(data), 4)]
    a = [(w[i] + i * 0x9E3779B9) & MASK for i in range(len(w))]
    low = sum(w) & MASK
    pairs = sum(a[i] * a[i + 1] for i in range(0, len(a), 2)) % (1 << 64)
    return ((pairs ^ pairs >> 32) & MASK) << 32 | low


@pytest.mark.parametrize("n", [0, 1, 3, 4, 5, 8, 9, 1000, 4099])
def test_checksum_is_the_documented_word_sum(n: int) -> None:
    data = np.random.default_rng(SEED + n).integers(0, 256, n, dtype=np.uint8).tobytes()
    assert values_checksum(data) == _reference(data)


def test_checksum_pins_its_value() -> None:
    """A fixed vector, so the GPU and torch implementations are held to the same function."""
    assert values_checksum(bytes(range(10))) == _reference(bytes(range(10)))
    assert values_checksum(b"") == 0
    assert values_checksum(bytes(range(10))) == 0x40B7C727_0A080F0C


def test_checksum_spans_chunks() -> None:
    """Words past the first working chunk keep their own index (mod 2^32)."""
    n = 4 * container._CHUNK_WORDS + 12
    data = np.random.default_rng(SEED).integers(0, 256, n, dtype=np.uint8).tobytes()
    assert values_checksum(data) == _reference(data)


def test_pairs_of_sign_flips_are_detected() -> None:
    """Two sign bits flipped cancel in the word sum (2^31 + 2^31 = 2^32); the keyed pair
    products catch every such pair of a 64-value tensor, in one pair and across pairs."""
    data = bytearray(np.random.default_rng(SEED).standard_normal(64).astype(np.float32).tobytes())
    base = values_checksum(bytes(data))
    for i in range(64):
        for j in range(i + 1, 64):
            flipped = bytearray(data)
            flipped[4 * i + 3] ^= 0x80
            flipped[4 * j + 3] ^= 0x80
            got = values_checksum(bytes(flipped))
            assert got != base and got & MASK == base & MASK, (i, j)


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=1, max_size=64), st.data())
def test_changing_one_word_always_changes_the_checksum(data: bytes, draw) -> None:
    i = draw.draw(st.integers(0, len(data) - 1))
    bit = draw.draw(st.integers(0, 7))
    flipped = bytearray(data)
    flipped[i] ^= 1 << bit
    assert values_checksum(bytes(flipped)) != values_checksum(data)


def _normal_bits(fmt: FloatFormat, n: int) -> np.ndarray:
    x = np.random.default_rng(SEED).standard_normal(n).astype(np.float32)
    if fmt.byte_coded:
        return np.random.default_rng(SEED).integers(0, 120, n, dtype=np.uint8)
    if fmt.bits == 32:
        return x.view(np.uint32)
    if fmt is BF16:
        return (x.view(np.uint32) >> 16).astype(np.uint16)
    return x.astype(np.float16).view(np.uint16)


@pytest.mark.parametrize("fmt", list(FORMATS.values()), ids=lambda f: f.name)
def test_checksummed_buffers_round_trip_and_differ_only_in_the_header(fmt: FloatFormat) -> None:
    bits = _normal_bits(fmt, 5000)
    book = QLC if fmt.byte_coded else zipccl_table(fmt, TensorStats(1.0, 0.0))
    plain, checked = encode(bits, fmt, book), encode(bits, fmt, book, checksum=True)
    assert checked[HEADER_BYTES:] == plain[HEADER_BYTES:]
    head = Header.unpack(checked)
    assert head.checksum == values_checksum(bits.astype(f"<u{fmt.bits // 8}").tobytes())
    assert struct.unpack_from("<I", checked, FLAGS_AT)[0] == FLAG_CHECKSUM
    assert Header.unpack(plain).checksum is None
    got_fmt, got = decode(checked)
    assert got_fmt == fmt and np.array_equal(got, bits)


def test_raw_buffers_carry_the_checksum_too() -> None:
    bits = _bf16_normal(100)
    buf = encode_raw(bits, BF16, checksum=True)
    assert Header.unpack(buf).checksum == values_checksum(bits.astype("<u2").tobytes())
    bad = bytearray(buf)
    bad[HEADER_BYTES + 7] ^= 0x10
    with pytest.raises(ValueError, match="checksum mismatch"):
        decode(bytes(bad))


def _silent_flips(buf: bytes, stop_at: int | None = None) -> int:
    """Single-bit flips of ``buf``'s body (every bit after the header, whose CRC-32 covers it)
    that decode without an error; stops counting at ``stop_at``."""
    silent = 0
    for i in reversed(range(HEADER_BYTES, len(buf))):
        for bit in range(8):
            bad = bytearray(buf)
            bad[i] ^= 1 << bit
            try:
                decode(bytes(bad))
            except ValueError:
                continue
            silent += 1
            if silent == stop_at:
                return silent
    return silent


@pytest.mark.slow
@pytest.mark.parametrize(("fmt", "table"), [(BF16, "theory"), (E4M3, "qlc")], ids=["bf16", "e4m3"])
def test_every_single_bit_flip_of_a_checksummed_buffer_is_rejected(fmt, table) -> None:
    """The sweep the checksum exists for: every bit of the body. Without the checksum, flips in
    the sign/mantissa planes and in-region payload bits pass silently."""
    rng = np.random.default_rng(SEED)
    if fmt.byte_coded:
        bits, book = rng.choice(np.asarray(QLC.ranks[:8], np.uint8), 1000), QLC
    else:
        bits, book = _bf16_normal(900), zipccl_table(BF16, TensorStats(1.0, 0.0))
    plain = encode(bits, fmt, book, 64)
    checked = encode(bits, fmt, book, 64, checksum=True)
    assert Header.unpack(checked).layout == container.LAYOUT_SPLIT
    assert _silent_flips(plain, stop_at=1), "without a checksum some flips pass silently"
    assert _silent_flips(checked) == 0, f"seed {SEED}"


@pytest.mark.parametrize(
    ("at", "value", "message"),
    [
        (FLAGS_AT, struct.pack("<I", 2), "unknown header flags"),
        (CHECKSUM_AT, b"\x01", "checksum but not its flag"),
        (CHECKSUM_AT - 1, b"\x01", "reserved bytes"),
        (CHECKSUM_AT + 8, b"\x01", "reserved bytes"),
    ],
)
def test_header_flags_and_checksum_field_are_strict(at: int, value: bytes, message: str) -> None:
    buf = encode(_bf16_normal(2000), BF16, zipccl_table(BF16, TensorStats(1.0, 0.0)))
    with pytest.raises(ValueError, match=message):
        decode(_patch_header(buf, at, value))


def test_a_forged_checksum_is_rejected() -> None:
    buf = encode(_bf16_normal(2000), BF16, zipccl_table(BF16, TensorStats(1.0, 0.0)), checksum=True)
    value = struct.unpack_from("<Q", buf, CHECKSUM_AT)[0] ^ 1
    with pytest.raises(ValueError, match="checksum mismatch"):
        decode(_patch_header(buf, CHECKSUM_AT, struct.pack("<Q", value)))
