"""The compressed-buffer format: one self-describing byte buffer per tensor.

Layout (all integers little endian; every section starts on a 128-byte boundary, gaps are zero):

    header          HEADER_BYTES, see ``Header``; ends with a CRC-32 of everything before it
    split layout:   raw byte planes   raw_bits // 8 planes of numel bytes (plane b: bits 8b..8b+7)
                    raw bit planes    raw_bits % 8 planes of ceil(numel/8) bytes (the top raw bits)
                    prefix planes     3 planes of ceil(numel/8) bytes
                    block offsets     ceil(numel/block) uint64
                    payload stream    payload_bytes bytes
    raw layout:     the tensor's bytes, little endian

The split sections that depend only on ``numel`` (raw planes, prefix planes, offsets) have sizes
every rank can compute before any data moves; only the payload stream varies. An encoder stores
the raw layout whenever the split layout would not be smaller, so no buffer exceeds its input by
more than ``HEADER_BYTES``.

Integrity: the header's CRC-32 covers the header, and the decoder accepts only buffers an encoder
can write (canonical form), so corruption that breaks the code is caught. A flipped bit that keeps
the code legal (a sign or mantissa bit, a payload bit inside a ranked region) decodes to other
values; a buffer written with ``checksum=True`` also carries :func:`values_checksum` of the
tensor's bytes (header flag ``FLAG_CHECKSUM``, the field at ``CHECKSUM_AT``), which the decoder
recomputes over what it decoded. Because decoding is canonical, every accepted corruption
changes the decoded values, so the checksum sees every one: with certainty where one 32-bit
word of the values changes, else with probability 1 - 2^-64 or so.
"""

from __future__ import annotations

import functools
import math
import struct
import zlib
from dataclasses import dataclass

import numpy as np
from zipccl.golden.codebook import MAX_WIDTH, PREFIX_BITS, TABLE_BYTES, Codebook, TableError
from zipccl.golden.formats import BY_CODE, FloatFormat
from zipccl.golden.streams import (
    SplitStream,
    StreamError,
    encode_split,
    from_planes,
    num_blocks,
    parse_split,
    resolve,
    to_planes,
)

MAGIC = b"ZCCL"
VERSION = 1
LAYOUT_RAW = 0
LAYOUT_SPLIT = 1
HEADER_BYTES = 512
ALIGN = 128
MAX_DIMS = 8
DEFAULT_BLOCK = 4096
MIN_BLOCK, MAX_BLOCK = 64, 1 << 20
# Far past any tensor (2^48 elements is 256 TiB of FP8) yet small enough that every size derived
# from it is an exact int64 on every backend: a header beyond it is corrupt, not large.
MAX_NUMEL = 1 << 48

# offset 0 magic, 4 version, 5 layout, 6 dtype code, 7 ndim, 8 block, 12 flags, 16 numel,
# 24 payload_bytes, 32 shape[8], 96 table hash64, 104 table (266 bytes), 376 values checksum
# (FLAG_CHECKSUM; else 0), 508 CRC-32; every other byte zero
_FIXED = struct.Struct("<4sBBBBIIQQ8QQ")
_TABLE_AT = _FIXED.size
CRC_AT = HEADER_BYTES - 4  # the header's last 4 bytes: CRC-32 of the bytes before them
FLAGS_AT = struct.calcsize("<4sBBBBI")  # the uint32 flags field
PAYLOAD_BYTES_AT = struct.calcsize("<4sBBBBIIQ")  # the uint64 payload_bytes field
CHECKSUM_AT = -(-(_TABLE_AT + TABLE_BYTES) // 8) * 8  # the uint64 values checksum
FLAG_CHECKSUM = 1  # the header carries values_checksum of the tensor's bytes
CHECKSUM_MISMATCH = "values checksum mismatch: the buffer's body is corrupt"
assert CHECKSUM_AT + 8 <= CRC_AT

# values_checksum's key: the golden ratio, so that each word's key differs from its neighbours'
_KEY = 0x9E3779B9
_CHUNK_WORDS = 1 << 20  # values_checksum's working set, in words (even)
_MASK32 = 0xFFFFFFFF


def values_checksum(data: bytes | np.ndarray) -> int:
    """The 64-bit checksum of a tensor's bytes that ``checksum=True`` buffers carry.

    The bytes (little-endian elements in order), zero padded to a multiple of 8, as 32-bit
    little-endian words ``w_i``. Each word is keyed by its index, ``a_i = w_i + i * 0x9E3779B9``
    (mod 2^32, ``i`` mod 2^32), and the words are multiplied in pairs (NH, the hash of UMAC):

        L = sum w_i                  mod 2^32
        S = sum a_2j * a_2j+1        mod 2^64  (64-bit products)
        checksum = (S ^ S >> 32) mod 2^32 << 32 | L

    L changes whenever exactly one word does, so such a corruption is always detected; S, whose
    keyed products mix every bit of a pair with every bit of its partner, catches what cancels
    in L (two sign bits flipped, say). Every term depends on its pair alone, so pairs sum in any
    order: the GPU kernels sum them while they code, at one multiply-add a pair.
    """
    raw = np.frombuffer(data, np.uint8) if not isinstance(data, np.ndarray) else data.view(np.uint8)
    raw = raw.ravel()
    if raw.size % 8:
        raw = np.concatenate([raw, np.zeros(8 - raw.size % 8, np.uint8)])
    words = raw.view("<u4")
    low = pairs = 0
    for at in range(0, words.size, _CHUNK_WORDS):
        w = words[at : at + _CHUNK_WORDS].astype(np.uint32)
        keys = np.arange(at, at + w.size, dtype=np.uint64).astype(np.uint32) * np.uint32(_KEY)
        a = (w + keys).astype(np.uint64)
        low += int(w.sum(dtype=np.uint64))
        pairs += int((a[0::2] * a[1::2]).sum(dtype=np.uint64))
    pairs &= (1 << 64) - 1
    return ((pairs ^ pairs >> 32) & _MASK32) << 32 | (low & _MASK32)


def align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


@dataclass(frozen=True)
class Header:
    layout: int
    fmt: FloatFormat
    shape: tuple[int, ...]
    block: int
    payload_bytes: int
    table: Codebook | None  # None for the raw layout
    checksum: int | None = None  # values_checksum of the tensor's bytes, where the buffer has one

    @property
    def numel(self) -> int:
        return math.prod(self.shape)  # exact: a wrapped int64 product could pass a corrupt shape

    def pack(self) -> bytes:
        dims = list(self.shape) + [0] * (MAX_DIMS - len(self.shape))
        table = self.table.to_bytes() if self.table else bytes(TABLE_BYTES)
        thash = self.table.hash64 if self.table else 0
        fixed = _FIXED.pack(
            MAGIC,
            VERSION,
            self.layout,
            self.fmt.code,
            len(self.shape),
            self.block,
            0 if self.checksum is None else FLAG_CHECKSUM,
            self.numel,
            self.payload_bytes,
            *dims,
            thash,
        )
        body = fixed + table + bytes(CHECKSUM_AT - _TABLE_AT - TABLE_BYTES)
        body += struct.pack("<Q", self.checksum or 0)
        body += bytes(CRC_AT - len(body))
        return body + struct.pack("<I", zlib.crc32(body))

    @classmethod
    def unpack(cls, buf: bytes) -> Header:
        if len(buf) < HEADER_BYTES:
            raise StreamError(f"buffer of {len(buf)} bytes is shorter than the header")
        head = bytes(buf[:HEADER_BYTES])
        (magic, version, layout, code, ndim, block, flags, numel, payload_bytes, *rest) = (
            _FIXED.unpack(head[:_TABLE_AT])
        )
        dims, thash = rest[:MAX_DIMS], rest[MAX_DIMS]
        if magic != MAGIC:
            raise StreamError(f"not a zipccl buffer (magic {magic!r})")
        if version != VERSION:
            raise StreamError(f"buffer format version {version} is not supported (need {VERSION})")
        if struct.unpack("<I", head[CRC_AT:])[0] != zlib.crc32(head[:CRC_AT]):
            raise StreamError("header checksum mismatch: the buffer is corrupt")
        if flags & ~FLAG_CHECKSUM:
            raise StreamError(f"unknown header flags {flags:#x}")
        (checksum,) = struct.unpack_from("<Q", head, CHECKSUM_AT)
        if not flags & FLAG_CHECKSUM and checksum:
            raise StreamError("header has a values checksum but not its flag")
        if any(head[_TABLE_AT + TABLE_BYTES : CHECKSUM_AT]) or any(head[CHECKSUM_AT + 8 : CRC_AT]):
            raise StreamError("header reserved bytes are not zero")
        if code not in BY_CODE:
            raise StreamError(f"unknown dtype code {code}")
        if layout not in (LAYOUT_RAW, LAYOUT_SPLIT):
            raise StreamError(f"unknown layout {layout}")
        if ndim > MAX_DIMS or any(dims[ndim:]):
            raise StreamError(f"bad shape rank {ndim}")
        shape = tuple(dims[:ndim])
        spans = math.prod(d for d in shape if d)  # bounds the strides of an empty shape too
        if spans > MAX_NUMEL or numel > MAX_NUMEL or math.prod(shape) != numel:
            raise StreamError(f"shape {shape} does not hold {numel} elements (at most {MAX_NUMEL})")
        if not valid_block(block):
            raise StreamError(f"block size {block} is not a power of two in range")
        fmt = BY_CODE[code]
        table = None
        if layout == LAYOUT_RAW:
            if thash or payload_bytes or any(head[_TABLE_AT : _TABLE_AT + TABLE_BYTES]):
                raise StreamError("raw-layout header carries a table or a payload size")
        else:
            try:
                table, table_hash = _header_table(head[_TABLE_AT : _TABLE_AT + TABLE_BYTES])
            except TableError as exc:
                raise StreamError(f"header table is invalid: {exc}") from None
            if table_hash != thash:
                raise StreamError("header table hash does not match its table")
            if payload_bytes > numel * MAX_WIDTH // 8:  # a block's payload is <= 1 byte/element
                raise StreamError(f"payload of {payload_bytes} bytes for {numel} elements")
        checked = checksum if flags & FLAG_CHECKSUM else None
        return cls(layout, fmt, shape, block, payload_bytes, table, checked)


@functools.lru_cache(maxsize=256)
def _header_table(data: bytes) -> tuple[Codebook, int]:
    """A header's table and its hash. Kept for the tables seen last: a tensor's chunks, and the
    tensors a job moves, mostly carry the same few, and parsing one is most of a header's cost
    on the host (its chunks are read one after another while the link waits)."""
    table = Codebook.from_bytes(data)
    return table, table.hash64


def valid_block(block: int) -> bool:
    return MIN_BLOCK <= block <= MAX_BLOCK and block & (block - 1) == 0


@dataclass(frozen=True)
class Sections:
    """Byte offsets of the split layout's sections, derived from numel alone; ``gaps`` are the
    [start, end) spans of alignment padding between them, zero in every canonical buffer."""

    raw_bytes: list[int]
    raw_bits: list[int]
    prefix: list[int]
    offsets: int
    payload: int
    gaps: list[tuple[int, int]]

    @classmethod
    def of(cls, fmt: FloatFormat, numel: int, block: int) -> Sections:
        pos = HEADER_BYTES
        plane_bits = (numel + 7) // 8
        gaps: list[tuple[int, int]] = []

        def take(size: int) -> int:
            nonlocal pos
            at, pos = pos, align(pos + size)
            if at + size < pos:
                gaps.append((at + size, pos))
            return at

        raw_bytes = [take(numel) for _ in range(fmt.raw_bits // 8)]
        raw_bits = [take(plane_bits) for _ in range(fmt.raw_bits % 8)]
        prefix = [take(plane_bits) for _ in range(PREFIX_BITS)]
        offsets = take(8 * num_blocks(numel, block))
        return cls(raw_bytes, raw_bits, prefix, offsets, pos, gaps)


def split_size(fmt: FloatFormat, numel: int, block: int, payload_bytes: int) -> int:
    return Sections.of(fmt, numel, block).payload + payload_bytes


def raw_size(fmt: FloatFormat, numel: int) -> int:
    return HEADER_BYTES + numel * fmt.bits // 8


def _check_bits(bits: np.ndarray, fmt: FloatFormat) -> np.ndarray:
    if not isinstance(bits, np.ndarray) or bits.dtype != np.dtype(fmt.uint):
        got = bits.dtype if isinstance(bits, np.ndarray) else type(bits).__name__
        raise TypeError(f"{fmt.name} bit patterns must be a {np.dtype(fmt.uint)} array, got {got}")
    if bits.ndim > MAX_DIMS:
        raise ValueError(f"tensors of more than {MAX_DIMS} dimensions are not supported")
    return bits


def encode(
    bits: np.ndarray,
    fmt: FloatFormat,
    table: Codebook,
    block: int = DEFAULT_BLOCK,
    checksum: bool = False,
) -> bytes:
    """Compress the bit patterns ``bits`` (uint8/16/32 view of the tensor) under ``table``;
    ``checksum``: the header carries :func:`values_checksum` of them."""
    bits = _check_bits(bits, fmt)
    if not valid_block(block):
        raise ValueError(f"block must be a power of two in [{MIN_BLOCK}, {MAX_BLOCK}], got {block}")
    flat = bits.ravel()
    split = encode_split(fmt.symbols(flat), table, block)
    size = split_size(fmt, flat.size, block, len(split.payload))
    if size >= raw_size(fmt, flat.size):
        return encode_raw(bits, fmt, block, checksum)
    check = _checksum_of(flat, fmt) if checksum else None
    head = Header(LAYOUT_SPLIT, fmt, bits.shape, block, len(split.payload), table, check)
    out = bytearray(size)
    out[:HEADER_BYTES] = head.pack()
    sec = Sections.of(fmt, flat.size, block)
    raw = fmt.raw(flat)
    for b, at in enumerate(sec.raw_bytes):
        out[at : at + flat.size] = ((raw >> (8 * b)) & 0xFF).astype(np.uint8).tobytes()
    top = to_planes(raw >> (8 * len(sec.raw_bytes)), len(sec.raw_bits))
    for plane, at in zip(list(top) + list(split.planes), sec.raw_bits + sec.prefix, strict=True):
        out[at : at + len(plane)] = plane.tobytes()
    out[sec.offsets : sec.offsets + 8 * len(split.offsets)] = split.offsets.astype("<u8").tobytes()
    out[sec.payload :] = split.payload
    return bytes(out)


def encode_raw(
    bits: np.ndarray, fmt: FloatFormat, block: int = DEFAULT_BLOCK, checksum: bool = False
) -> bytes:
    """The raw layout (the encoder's fallback): header, then the tensor's little-endian bytes."""
    bits = _check_bits(bits, fmt)
    check = _checksum_of(bits.ravel(), fmt) if checksum else None
    head = Header(LAYOUT_RAW, fmt, bits.shape, block, 0, None, check)
    return head.pack() + bits.ravel().astype(f"<u{fmt.bits // 8}").tobytes()


def _checksum_of(flat: np.ndarray, fmt: FloatFormat) -> int:
    return values_checksum(np.ascontiguousarray(flat, dtype=f"<u{fmt.bits // 8}"))


def check_values(head: Header, bits: np.ndarray) -> None:
    """The decoded values must have the checksum the header carries (where it carries one)."""
    if head.checksum is not None and _checksum_of(bits.ravel(), head.fmt) != head.checksum:
        raise StreamError(CHECKSUM_MISMATCH)


def check_gaps(buf: bytes | np.ndarray, sec: Sections) -> None:
    """Alignment padding must be zero: a decoder accepts only buffers an encoder can write."""
    data = np.frombuffer(buf, np.uint8) if not isinstance(buf, np.ndarray) else buf
    for lo, hi in sec.gaps:
        if data[lo:hi].any():
            raise StreamError(f"alignment gap bytes {lo}..{hi} are not zero")


def check_codewords(
    prefix: np.ndarray, symbols: np.ndarray, table: Codebook, fmt: FloatFormat
) -> None:
    """Decoded codewords must be the encoder's: a symbol the format has (FP16's exponent is 5
    bits), in the region the encoder puts it (no escape of a ranked symbol). Others decode to
    some value, but to one that re-encodes differently."""
    limit = 1 << (8 if fmt.byte_coded else fmt.exp_bits)
    if symbols.size and int(symbols.max()) >= limit:
        i = int(np.argmax(symbols >= limit))
        raise StreamError(f"symbol {i} is {int(symbols[i])}, past {fmt.name}'s {limit} symbols")
    bad = table.encoder_lut()[0][symbols] != prefix
    if bad.any():
        i = int(np.argmax(bad))
        raise StreamError(
            f"symbol {i} ({int(symbols[i])}) is escaped in literal region {int(prefix[i])} but "
            "the table ranks it"
        )


def decode(buf: bytes) -> tuple[FloatFormat, np.ndarray]:
    """Decompress a buffer made by :func:`encode` (or any bit-exact twin of it)."""
    if not isinstance(buf, bytes | bytearray | memoryview):
        raise TypeError(f"expected a bytes-like buffer, got {type(buf).__name__}")
    buf = bytes(buf)
    head = Header.unpack(buf)
    fmt, numel = head.fmt, head.numel
    if head.layout == LAYOUT_RAW:
        want = raw_size(fmt, numel)
        if len(buf) != want:
            raise StreamError(f"raw buffer is {len(buf)} bytes, header says {want}")
        data = np.frombuffer(buf, f"<u{fmt.bits // 8}", offset=HEADER_BYTES)
        check_values(head, data)
        return fmt, data.astype(fmt.uint).reshape(head.shape)
    assert head.table is not None
    want = split_size(fmt, numel, head.block, head.payload_bytes)
    if len(buf) != want:
        raise StreamError(f"buffer is {len(buf)} bytes, header says {want} (truncated or padded)")
    sec = Sections.of(fmt, numel, head.block)
    plane_len = (numel + 7) // 8
    arr = np.frombuffer(buf, np.uint8)
    check_gaps(arr, sec)
    planes = np.stack([arr[at : at + plane_len] for at in sec.prefix])
    nb = num_blocks(numel, head.block)
    offsets = np.frombuffer(buf, "<u8", count=nb, offset=sec.offsets).astype(np.uint64)
    split = SplitStream(planes, offsets, buf[sec.payload :])
    cw = parse_split(split, numel, head.table, head.block)
    symbols = resolve(cw, head.table)
    check_codewords(cw.prefix, symbols, head.table, fmt)
    raw = np.zeros(numel, np.uint32)
    for b, at in enumerate(sec.raw_bytes):
        raw |= arr[at : at + numel].astype(np.uint32) << (8 * b)
    if sec.raw_bits:
        top = np.stack([arr[at : at + plane_len] for at in sec.raw_bits])
        raw |= from_planes(top, numel) << (8 * len(sec.raw_bytes))
    values = fmt.join(symbols, raw)
    check_values(head, values)
    return fmt, values.reshape(head.shape)
