"""Serial and split layouts: same codewords, round trips, and rejection of bad streams."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from zipccl.golden.codebook import Codebook
from zipccl.golden.streams import (
    SplitStream,
    StreamError,
    decode_serial,
    decode_split,
    encode_codewords,
    encode_serial,
    encode_split,
    from_planes,
    parse_serial,
    parse_split,
    to_planes,
)

from tests.strategies import QLC, ZIPCCL, codebooks, symbol_arrays

# A table with holes: region 1 is partly empty (n=3 of capacity 1+4+...), region 7 wholly empty.
HOLEY = Codebook((8, 2, 0, 0, 0, 0, 0, 3), 0, (10, 20, 30), name="holey")
BLOCKS = st.sampled_from([64, 128, 256, 4096])


def test_worked_example_by_hand() -> None:
    """docs/format.md's worked example: ZipCCL table, exponents 126, 127, 7, 122."""
    symbols = np.array([126, 127, 7, 122], np.uint8)
    # 126 -> prefix 1 ; 127 -> prefix 2 ; 7 escapes -> prefix 0 + 00000111 ; 122 -> prefix 7
    bits = "00101000000000111111"
    padded = bits + "0" * (-len(bits) % 8)
    expect = bytes(int(padded[i : i + 8], 2) for i in range(0, len(padded), 8))
    assert encode_serial(symbols, ZIPCCL) == expect == bytes([0x28, 0x03, 0xF0])
    split = encode_split(symbols, ZIPCCL, 64)
    # prefixes 1,2,0,7 -> plane k holds bit k of each, element i at bit i
    assert split.planes.tolist() == [[0b1001], [0b1010], [0b1000]]
    assert split.offsets.tolist() == [0] and split.payload == bytes([7])


@settings(max_examples=80, deadline=None)
@given(codebooks(), symbol_arrays(), BLOCKS)
def test_serial_and_split_carry_the_same_codewords(book, symbols, block) -> None:
    n = len(symbols)
    serial = encode_serial(symbols, book)
    split = encode_split(symbols, book, block)
    from_serial = parse_serial(serial, n, book)
    assert from_serial.same_as(parse_split(split, n, book, block))
    assert from_serial.same_as(encode_codewords(symbols, book))
    assert np.array_equal(decode_serial(serial, n, book), symbols)
    assert np.array_equal(decode_split(split, n, book, block), symbols)
    assert len(serial) == -(-from_serial.total_bits // 8)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2000), st.integers(1, 8), st.integers(0, 2**32 - 1))
def test_bit_planes_round_trip(n: int, nbits: int, seed: int) -> None:
    values = np.random.default_rng(seed).integers(0, 1 << nbits, n)
    planes = to_planes(values, nbits)
    assert planes.shape == (nbits, (n + 7) // 8)
    assert np.array_equal(from_planes(planes, n), values)


def test_plane_words_hold_32_consecutive_elements() -> None:
    values = np.zeros(64, np.uint32)
    values[[0, 5, 33]] = 1
    words = to_planes(values, 1)[0].view("<u4")
    assert words.tolist() == [(1 << 0) | (1 << 5), 1 << 1]


@pytest.mark.parametrize("book", [QLC, ZIPCCL, HOLEY], ids=lambda b: b.name)
def test_truncated_serial_streams_are_rejected(book: Codebook) -> None:
    symbols = np.array([10, 20, 30, 200, 7] * 20, np.uint8)
    if book is not HOLEY:
        symbols = np.arange(100, dtype=np.uint8)
    data = encode_serial(symbols, book)
    for cut in (1, len(data) // 2, len(data) - 1):
        with pytest.raises(StreamError, match="truncated"):
            decode_serial(data[:cut], len(symbols), book)


def test_serial_trailing_bytes_and_dirty_padding_are_rejected() -> None:
    data = encode_serial(np.array([126, 127], np.uint8), ZIPCCL)  # 6 bits + 2 padding bits
    with pytest.raises(StreamError, match="trailing"):
        decode_serial(data + b"\x00", 2, ZIPCCL)
    with pytest.raises(StreamError, match="padding"):
        decode_serial(bytes([data[0] | 1]), 2, ZIPCCL)


@pytest.mark.parametrize(
    ("bits", "what"),
    [
        ("111000", "region 7 has no symbols"),  # prefix 7 of HOLEY: base 7 >= n = 3
        ("00111", "rank 3 past a 3-symbol table"),  # prefix 1, payload 3 -> rank 3
    ],
)
def test_illegal_codewords_are_rejected(bits: str, what: str) -> None:
    padded = bits + "0" * (-len(bits) % 8)
    data = bytes(int(padded[i : i + 8], 2) for i in range(0, len(padded), 8))
    with pytest.raises(StreamError, match="illegal codeword"):
        decode_serial(data, 1, HOLEY)


def test_split_with_wrong_offsets_or_payload_is_rejected() -> None:
    symbols = np.arange(300, dtype=np.int64).astype(np.uint8)
    split = encode_split(symbols, QLC, 64)
    bad_offsets = split.offsets.copy()
    bad_offsets[2] += 1
    with pytest.raises(StreamError, match="offsets disagree"):
        decode_split(SplitStream(split.planes, bad_offsets, split.payload), 300, QLC, 64)
    with pytest.raises(StreamError, match="offsets disagree"):
        decode_split(SplitStream(split.planes, split.offsets, split.payload[:-1]), 300, QLC, 64)
    with pytest.raises(StreamError, match="block offsets"):
        decode_split(SplitStream(split.planes, split.offsets[:-1], split.payload), 300, QLC, 64)
    with pytest.raises(StreamError, match="holds"):
        decode_split(SplitStream(split.planes[:, :-1], split.offsets, split.payload), 300, QLC, 64)


def test_split_dirty_payload_padding_is_rejected() -> None:
    split = encode_split(np.array([0], np.uint8), QLC, 64)  # one 3-bit payload in one byte
    dirty = bytes([split.payload[0] | 1])
    with pytest.raises(StreamError, match="padding"):
        decode_split(SplitStream(split.planes, split.offsets, dirty), 1, QLC, 64)


def test_split_dirty_plane_padding_is_rejected() -> None:
    split = encode_split(np.array([0, 1, 2], np.uint8), QLC, 64)
    planes = split.planes.copy()
    planes[0, 0] |= 0x80
    with pytest.raises(StreamError, match="plane 0 padding"):
        decode_split(SplitStream(planes, split.offsets, split.payload), 3, QLC, 64)


def test_empty_input_gives_empty_streams() -> None:
    empty = np.zeros(0, np.uint8)
    assert encode_serial(empty, QLC) == b""
    split = encode_split(empty, QLC, 64)
    assert split.payload == b"" and len(split.offsets) == 0
    assert decode_split(split, 0, QLC, 64).size == 0
