"""The two stream layouts of the same codewords.

*serial* (hardware): codewords concatenated MSB first into bytes, the last byte zero padded.

*split* (GPU): the 3-bit prefixes as three bit planes (plane k holds bit k of every prefix; element
i sits at bit i % 8 of byte i // 8, so a little-endian 32-bit word of a plane holds 32 consecutive
elements), and the payloads as a separate stream cut into blocks of ``block`` symbols. Each
block's payloads are packed MSB first and padded to a byte; ``offsets[b]`` (uint64) is the byte
where block b starts, so every block decodes independently.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from zipccl.golden.codebook import MAX_CODE_LENGTH, PREFIX_BITS, Codebook


class StreamError(ValueError):
    """A compressed stream that is truncated, corrupt or illegal under its table."""


@dataclass(frozen=True)
class Codewords:
    """One codeword per symbol: region prefix, payload value and payload width."""

    prefix: np.ndarray
    payload: np.ndarray
    width: np.ndarray

    @property
    def total_bits(self) -> int:
        return int(self.width.sum(dtype=np.int64)) + PREFIX_BITS * len(self.prefix)

    def same_as(self, other: Codewords) -> bool:
        return bool(
            np.array_equal(self.prefix, other.prefix)
            and np.array_equal(self.payload, other.payload)
            and np.array_equal(self.width, other.width)
        )


def encode_codewords(symbols: np.ndarray, book: Codebook) -> Codewords:
    prefix, payload, length = book.encoder_lut()
    sym = np.asarray(symbols, np.uint8).ravel()
    return Codewords(prefix[sym], payload[sym], (length[sym] - PREFIX_BITS).astype(np.uint8))


def resolve(cw: Codewords, book: Codebook) -> np.ndarray:
    """Codewords -> symbols (prefix parse, length select, LUT remap); illegal ranks raise."""
    _, base, literal = book.region_table()
    is_lit = literal[cw.prefix]
    rank = base[cw.prefix].astype(np.int64) + cw.payload.astype(np.int64)
    illegal = ~is_lit & (rank >= book.num_ranked)
    if illegal.any():
        i = int(np.argmax(illegal))
        raise StreamError(
            f"illegal codeword at symbol {i}: region {int(cw.prefix[i])} rank {int(rank[i])} "
            f"but the table ranks only {book.num_ranked} symbols"
        )
    lut = book.rank_lut()
    return np.where(is_lit, cw.payload, lut[np.minimum(rank, 255)]).astype(np.uint8)


def _codeword_bits(values: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenate each value's low ``length`` bits, MSB first, into one 0/1 array."""
    if len(values) == 0:
        return np.zeros(0, np.uint8)
    j = np.arange(MAX_CODE_LENGTH)
    shift = lengths[:, None].astype(np.int64) - 1 - j[None, :]
    bits = (values[:, None].astype(np.int64) >> np.maximum(shift, 0)) & 1
    return bits[shift >= 0].astype(np.uint8)


def _pack_bits(bits: np.ndarray) -> bytes:
    return np.packbits(bits, bitorder="big").tobytes()


# ---------------------------------------------------------------------- serial layout
def pack_serial(cw: Codewords) -> bytes:
    width = cw.width.astype(np.int64)
    value = (cw.prefix.astype(np.int64) << width) | cw.payload.astype(np.int64)
    return _pack_bits(_codeword_bits(value, width + PREFIX_BITS))


def parse_serial(data: bytes, count: int, book: Codebook) -> Codewords:
    """Read ``count`` codewords; the stream must end with at most 7 zero padding bits."""
    bits = np.unpackbits(np.frombuffer(data, np.uint8), bitorder="big")
    widths = np.asarray(book.widths, np.int64)
    prefix = np.zeros(count, np.uint8)
    payload = np.zeros(count, np.uint8)
    pos = 0
    as_list = bits.tolist()
    for i in range(count):
        if pos + PREFIX_BITS > len(as_list):
            raise StreamError(f"serial stream truncated at symbol {i} of {count}")
        p = as_list[pos] << 2 | as_list[pos + 1] << 1 | as_list[pos + 2]
        w = int(widths[p])
        end = pos + PREFIX_BITS + w
        if end > len(as_list):
            raise StreamError(f"serial stream truncated inside symbol {i} of {count}")
        v = 0
        for b in as_list[pos + PREFIX_BITS : end]:
            v = v << 1 | b
        prefix[i], payload[i] = p, v
        pos = end
    _check_tail(bits, pos, "serial stream")
    return Codewords(prefix, payload, widths[prefix].astype(np.uint8))


def _check_tail(bits: np.ndarray, used: int, what: str) -> None:
    if len(bits) - used >= 8:
        raise StreamError(f"{what} has {(len(bits) - used) // 8} trailing bytes")
    if bits[used:].any():
        raise StreamError(f"{what} padding bits are not zero")


def encode_serial(symbols: np.ndarray, book: Codebook) -> bytes:
    return pack_serial(encode_codewords(symbols, book))


def decode_serial(data: bytes, count: int, book: Codebook) -> np.ndarray:
    return resolve(parse_serial(data, count, book), book)


# ---------------------------------------------------------------------- bit planes
def to_planes(values: np.ndarray, nbits: int) -> np.ndarray:
    """(nbits, ceil(n/8)) uint8: plane k holds bit k of each value, LSB-first within bytes."""
    values = np.asarray(values, np.uint32).ravel()
    return (
        np.stack(
            [
                np.packbits(((values >> k) & 1).astype(np.uint8), bitorder="little")
                for k in range(nbits)
            ]
        )
        if nbits
        else np.zeros((0, (len(values) + 7) // 8), np.uint8)
    )


def from_planes(planes: np.ndarray, count: int) -> np.ndarray:
    """Inverse of :func:`to_planes`; bits past ``count`` must be zero."""
    out = np.zeros(count, np.uint32)
    for k, plane in enumerate(planes):
        bits = np.unpackbits(np.asarray(plane, np.uint8), bitorder="little")
        if len(bits) < count:
            raise StreamError(f"bit plane {k} holds {len(bits)} bits, need {count}")
        if bits[count:].any():
            raise StreamError(f"bit plane {k} padding bits are not zero")
        out |= bits[:count].astype(np.uint32) << k
    return out


# ---------------------------------------------------------------------- split layout
@dataclass(frozen=True)
class SplitStream:
    planes: np.ndarray  # (3, ceil(n/8)) uint8 prefix bit planes
    offsets: np.ndarray  # (nblocks,) uint64 byte offset of each block's payloads
    payload: bytes


def num_blocks(count: int, block: int) -> int:
    return -(-count // block)


def _block_ids(count: int, block: int) -> np.ndarray:
    return np.arange(count, dtype=np.int64) // block


def _in_block_bit_offsets(width: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray]:
    """Each payload's bit offset inside its block, and each block's payload bit count."""
    count = len(width)
    nb = num_blocks(count, block)
    csum = np.cumsum(width, dtype=np.int64)
    ends = csum[np.minimum((np.arange(nb) + 1) * block, count) - 1] if count else csum
    starts = np.concatenate([[0], ends[:-1]]) if nb else ends
    block_bits = ends - starts
    within = csum - width - np.repeat(starts, np.diff(np.r_[0:count:block, count]))
    return within, block_bits


def pack_split(cw: Codewords, block: int) -> SplitStream:
    count = len(cw.prefix)
    width = cw.width.astype(np.int64)
    within, block_bits = _in_block_bit_offsets(width, block)
    block_bytes = (block_bits + 7) // 8
    offsets = (np.cumsum(block_bytes) - block_bytes).astype(np.uint64)
    total = int(block_bytes.sum())
    bits = np.zeros(total * 8, np.uint8)
    if count:
        start = offsets[_block_ids(count, block)].astype(np.int64) * 8 + within
        j = np.arange(8)
        shift = width[:, None] - 1 - j[None, :]
        keep = shift >= 0
        vals = (cw.payload.astype(np.int64)[:, None] >> np.maximum(shift, 0)) & 1
        pos = start[:, None] + j[None, :]
        bits[pos[keep]] = vals[keep]
    return SplitStream(to_planes(cw.prefix, PREFIX_BITS), offsets, _pack_bits(bits))


def parse_split(split: SplitStream, count: int, book: Codebook, block: int) -> Codewords:
    nb = num_blocks(count, block)
    offsets = np.asarray(split.offsets, np.uint64).astype(np.int64)
    if offsets.shape != (nb,):
        raise StreamError(f"split stream has {offsets.shape} block offsets, need ({nb},)")
    prefix = from_planes(split.planes, count).astype(np.uint8)
    width = np.asarray(book.widths, np.int64)[prefix]
    within, block_bits = _in_block_bit_offsets(width, block)
    block_bytes = (block_bits + 7) // 8
    expect = np.cumsum(block_bytes) - block_bytes
    if not np.array_equal(offsets, expect) or int(block_bytes.sum()) != len(split.payload):
        bad = np.flatnonzero(offsets != expect)
        where = f"block {int(bad[0])}" if len(bad) else "the end of the payload stream"
        raise StreamError(f"split stream payload offsets disagree with its prefixes at {where}")
    bits = np.unpackbits(np.frombuffer(split.payload, np.uint8), bitorder="big")
    payload = np.zeros(count, np.int64)
    if count:
        start = offsets[_block_ids(count, block)] * 8 + within
        for j in range(int(width.max(initial=0))):
            take = j < width
            payload[take] = payload[take] << 1 | bits[start[take] + j]
    pad = np.ones(len(bits), bool)
    if count:
        for j in range(int(width.max(initial=0))):
            take = j < width
            pad[start[take] + j] = False
    if bits[pad].any():
        raise StreamError("split stream payload padding bits are not zero")
    return Codewords(prefix, payload.astype(np.uint8), width.astype(np.uint8))


def encode_split(symbols: np.ndarray, book: Codebook, block: int) -> SplitStream:
    return pack_split(encode_codewords(symbols, book), block)


def decode_split(split: SplitStream, count: int, book: Codebook, block: int) -> np.ndarray:
    return resolve(parse_split(split, count, book, block), book)
