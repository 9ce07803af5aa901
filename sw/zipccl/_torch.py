"""Vectorised torch backend of the split layout: the CPU path and the reference for the kernels.

Runs on any device (CPU in CI, CUDA as the fallback when the CUDA kernels cannot be built). Every
step is a torch op over a chunk of whole blocks (:data:`CHUNK` elements): no Python loop touches
elements, and the temporaries stay a few MiB whatever the tensor's size. Inside a chunk the bit
patterns and fields are int32 (every field and in-chunk offset fits; FP32's sign bit is masked),
half the memory traffic of int64; block offsets, which span the tensor, are int64.
"""

from __future__ import annotations

import functools
from typing import Final

import torch

from zipccl.golden.codebook import ALPHABET, PREFIX_BITS, Codebook
from zipccl.golden.container import HEADER_BYTES, Sections
from zipccl.golden.formats import FloatFormat
from zipccl.golden.streams import num_blocks

QUEUES: Final = False  # zipccl._codecs: codes before returning

_VIEW = {8: torch.uint8, 16: torch.int16, 32: torch.int32}


def bits_of(x: torch.Tensor, fmt: FloatFormat) -> torch.Tensor:
    """Flat int64 unsigned bit patterns of a contiguous tensor."""
    return x.reshape(-1).view(_VIEW[fmt.bits]).to(torch.int64) & ((1 << fmt.bits) - 1)


def _bits32(x: torch.Tensor, fmt: FloatFormat) -> torch.Tensor:
    """Flat int32 bit patterns of a contiguous tensor (FP32's as signed int32: the fields are
    taken with masks, so the sign extension never shows)."""
    bits = x.reshape(-1).view(_VIEW[fmt.bits]).to(torch.int32)
    return bits & 0xFFFF if fmt.bits == 16 else bits


def from_bits(bits: torch.Tensor, fmt: FloatFormat, dtype: torch.dtype) -> torch.Tensor:
    """Inverse of :func:`bits_of` and :func:`_bits32` (two's-complement fold so the narrowing
    cast is exact; int32 patterns of FP32 are already its signed view)."""
    if fmt.bits == 32 and bits.dtype == torch.int32:
        return bits.view(dtype)
    half = 1 << (fmt.bits - 1)
    if fmt.bits > 8:
        bits = torch.where(bits >= half, bits - (half << 1), bits)
    return bits.to(_VIEW[fmt.bits]).view(dtype)


def symbols_raw(bits: torch.Tensor, fmt: FloatFormat) -> tuple[torch.Tensor, torch.Tensor]:
    """golden.formats symbols() and raw() on int64 (or :func:`_bits32`'s) bit patterns."""
    if fmt.byte_coded:
        return bits, torch.zeros_like(bits)
    sym = (bits >> fmt.mant_bits) & ((1 << fmt.exp_bits) - 1)
    sign = (bits >> (fmt.bits - 1)) & 1
    raw = (sign << fmt.mant_bits) | (bits & ((1 << fmt.mant_bits) - 1))
    return sym, raw


def join(sym: torch.Tensor, raw: torch.Tensor, fmt: FloatFormat) -> torch.Tensor:
    if fmt.byte_coded:
        return sym
    sign = raw >> fmt.mant_bits
    mant = raw & ((1 << fmt.mant_bits) - 1)
    return (sign << (fmt.bits - 1)) | (sym << fmt.mant_bits) | mant


_GATHER = 0x0102040810204080  # byte i's low bit to bit 56 + i of the product (no carries)


def pack_bits(bits: torch.Tensor) -> torch.Tensor:
    """One bit plane: ceil(m/8) uint8 bytes of the 0/1 values ``bits``, LSB first within bytes
    (golden.streams.to_planes' row). Eight bytes read as one little-endian int64 and multiplied
    by :data:`_GATHER` put their low bits side by side in the top byte."""
    eight = torch.nn.functional.pad(bits.to(torch.uint8), (0, -bits.numel() % 8))
    return ((eight.view(torch.int64) * _GATHER) >> 56).to(torch.uint8)


_SPREAD: dict[torch.device, torch.Tensor] = {}


def _spread(device: torch.device) -> torch.Tensor:
    """byte -> int64 whose byte i is the byte's bit i (256 entries, per device)."""
    if device not in _SPREAD:
        byte = torch.arange(256, dtype=torch.int64)
        spread = torch.zeros_like(byte)
        for i in range(8):
            spread |= ((byte >> i) & 1) << (8 * i)
        _SPREAD[device] = spread.to(device)
    return _SPREAD[device]


def unpack_planes(planes: list[torch.Tensor], count: int) -> torch.Tensor:
    """Inverse of :func:`pack_bits` for planes ``0..k``: the first ``count`` elements' values,
    bit k from plane k, as uint8 -- one gather per plane byte of a spread table, not per bit."""
    spread = _spread(planes[0].device)
    acc = spread.index_select(0, planes[0].int())
    for k, plane in enumerate(planes[1:], 1):
        acc |= spread.index_select(0, plane.int()) << k
    return acc.view(torch.uint8)[:count]


def check_plane_padding(buf: torch.Tensor, planes: list[int], count: int, what: str) -> None:
    """The bits past ``count`` in each plane's last byte must be zero (golden checks the same)."""
    if not count % 8:
        return
    for k, at in enumerate(planes):
        if int(buf[at + (count + 7) // 8 - 1]) >> (count % 8):
            raise ValueError(f"{what} plane {k} padding bits are not zero")


class Luts:
    """A table's lookup tensors on one device, each field packed into one int32 per entry so
    that a chunk costs one gather (``index_select``, several times faster than indexing):

    * ``code``: symbol -> prefix | payload width << 3 | payload << 7 (the encoder's);
    * ``region``: prefix -> payload width | base rank << 4 (<= 256) | literal << 13;
    * ``rank``: rank -> symbol (the decoder's, past ``num_ranked``: illegal).
    """

    def __init__(self, table: Codebook, device: torch.device) -> None:
        def t(a: object) -> torch.Tensor:
            return torch.as_tensor(a, dtype=torch.int32, device=device)

        prefix, payload, length = (t(a) for a in table.encoder_lut())
        self.code = prefix | (length - PREFIX_BITS) << 3 | payload << 7
        width, base, literal = (t(a) for a in table.region_table())
        self.region = width | base << 4 | literal << 13
        self.rank = t(table.rank_lut())
        self.num_ranked = table.num_ranked


@functools.lru_cache(maxsize=64)
def _luts(table: Codebook, device: torch.device) -> Luts:
    """A table's Luts, built once per device: a small call spends more building them than
    coding."""
    return Luts(table, device)


CHUNK = 1 << 16  # elements coded at once (whole blocks): bounds the temporaries, ~50 B each


def _step(block: int) -> int:
    """Elements per chunk: whole blocks, at least one."""
    return max(block, CHUNK // block * block)


def _positions(offsets: torch.Tensor, within: torch.Tensor, block: int) -> torch.Tensor:
    """Each codeword's bit position in the stream: its block's byte offset, plus its bit offset
    inside the block (whole blocks but the last: broadcast, no per-element index)."""
    n = within.numel()
    grid = torch.nn.functional.pad(within, (0, -n % block)).view(-1, block)
    return (grid + offsets[:, None] * 8).view(-1)[:n]


def _block_bits(width: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each codeword's bit offset inside its block, and each block's payload bit count."""
    n = width.numel()
    nb = num_blocks(n, block)
    grid = torch.nn.functional.pad(width, (0, nb * block - n)).view(nb, block)
    csum = grid.cumsum(1, dtype=width.dtype)
    within = (csum - grid).reshape(-1)[:n]
    return within, csum[:, -1].clone() if nb else csum.new_zeros(0)  # (not a view of csum)


def _pack_payload(
    value: torch.Tensor, width: torch.Tensor, block: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """MSB-first codeword payloads of whole blocks, each block byte aligned -> (payload bytes,
    each block's byte count).

    Each codeword lands in a 16-bit window at its byte; codewords own disjoint bits, so adding the
    windows' bytes into the stream equals OR-ing them.
    """
    within, bits = _block_bits(width, block)
    nbytes = (bits + 7) // 8
    offsets = nbytes.cumsum(0, dtype=nbytes.dtype) - nbytes
    total = int(nbytes.sum())
    pos = _positions(offsets, within, block)
    window = value << (16 - (pos & 7) - width)
    byte = pos >> 3
    acc = torch.zeros(total + 2, dtype=value.dtype, device=width.device)
    acc.index_add_(0, byte, window >> 8)
    acc.index_add_(0, byte + 1, window & 0xFF)
    return acc[:total].to(torch.uint8), nbytes


def encode_into(
    x: torch.Tensor, fmt: FloatFormat, table: Codebook, block: int, out: torch.Tensor
) -> int:
    """Write the split layout's sections of ``x`` into ``out`` (uint8, at least the fixed part
    long); the payload stream is written only where it fits. Returns payload_bytes.

    Chunk by chunk of whole blocks (:data:`CHUNK` elements), so the temporaries stay a few MiB
    whatever the tensor's size."""
    n = x.numel()
    sec = Sections.of(fmt, n, block)
    luts = _luts(table, x.device)
    out[: sec.payload].zero_()  # the alignment gaps
    flat, step, total = x.reshape(-1), _step(block), 0
    for start in range(0, n, step):
        total += _encode_chunk(flat[start : start + step], start, fmt, luts, block, sec, out, total)
    return total


def _encode_chunk(
    chunk: torch.Tensor,
    start: int,
    fmt: FloatFormat,
    luts: Luts,
    block: int,
    sec: Sections,
    out: torch.Tensor,
    base: int,
) -> int:
    """Elements ``start..`` (a block boundary) of every section; their payload goes at byte
    ``base`` of the stream where it fits. Returns their payload's bytes."""
    m = chunk.numel()
    sym, raw = symbols_raw(_bits32(chunk, fmt), fmt)
    for b, at in enumerate(sec.raw_bytes):
        out[at + start : at + start + m] = (raw >> (8 * b)).to(torch.uint8)  # (wraps: & 0xFF)
    top = 8 * len(sec.raw_bytes)
    code = luts.code.index_select(0, sym)
    planes = [(raw >> (top + k)) & 1 for k in range(len(sec.raw_bits))]
    planes += [(code >> k) & 1 for k in range(PREFIX_BITS)]
    for bits, at in zip(planes, sec.raw_bits + sec.prefix, strict=True):
        plane = pack_bits(bits)
        out[at + start // 8 : at + start // 8 + plane.numel()] = plane
    payload, nbytes = _pack_payload(code >> 7, (code >> 3) & 15, block)
    offsets = nbytes.long().cumsum(0) - nbytes + base  # (int64: the u64 on the wire)
    at = sec.offsets + 8 * (start // block)
    out[at : at + 8 * offsets.numel()] = offsets.view(torch.uint8)
    at = sec.payload + base
    if at + payload.numel() <= out.numel():
        out[at : at + payload.numel()] = payload
    return payload.numel()


def check_canonical(
    buf: torch.Tensor,
    fmt: FloatFormat,
    table: Codebook,
    block: int,
    payload_bytes: int,
    out: torch.Tensor,
) -> None:
    """After any backend's decode of the split-layout ``buf`` into ``out``: ``buf`` must be the
    bytes the encoder writes for ``out`` (zero alignment gaps, no escape of a ranked symbol, no
    symbol past the format's exponent field -- what decoding alone does not check), by encoding
    ``out`` again. Separate from :func:`decode_into`, whose checks and their order every backend
    shares; it costs one encode, so the CUDA kernels check those conditions themselves."""
    again = torch.empty_like(buf)
    size = encode_into(out.contiguous(), fmt, table, block, again)
    if size != payload_bytes or not torch.equal(again[HEADER_BYTES:], buf[HEADER_BYTES:]):
        raise ValueError(
            "buffer is not in canonical form: its sections are not what an encoder writes for "
            "the values they decode to (non-zero gap, escaped ranked symbol or symbol out of "
            f"{fmt.name}'s range)"
        )


def decode_into(
    buf: torch.Tensor,
    fmt: FloatFormat,
    table: Codebook,
    block: int,
    payload_bytes: int,
    out: torch.Tensor,
) -> None:
    """Decode a split-layout buffer whose length the caller has checked; ValueError if corrupt.

    Chunk by chunk of whole blocks, as :func:`encode_into`. The checks keep one order whatever
    the chunking (the Triton decoder's too): the prefix planes' padding, the block offsets
    against the prefix planes (a first pass over them), each block's payload padding, then the
    codewords (``out`` is left partly written where one is illegal), the raw bit planes'
    padding."""
    n = out.numel()
    sec = Sections.of(fmt, n, block)
    luts = _luts(table, buf.device)
    step = _step(block)
    check_plane_padding(buf, sec.prefix, n, "prefix")
    bits = torch.cat(
        [
            _block_bits(_widths(buf, sec, luts, start, min(step, n - start)), block)[1].long()
            for start in range(0, n, step)
        ]
        or [torch.zeros(0, dtype=torch.int64, device=buf.device)]
    )
    nbytes = (bits + 7) // 8
    expect = nbytes.cumsum(0) - nbytes
    stored = buf[sec.offsets : sec.offsets + 8 * expect.numel()].clone().view(torch.int64)
    if not torch.equal(stored, expect) or int(nbytes.sum()) != payload_bytes:
        raise ValueError("payload block offsets disagree with the prefix planes")
    tail = bits % 8
    ragged = tail > 0  # blocks whose last payload byte has padding bits (so nbytes >= 1)
    last = buf[sec.payload + (expect + nbytes - 1)[ragged]].to(torch.int64)
    if (last & ((1 << (8 - tail[ragged])) - 1)).any():
        raise ValueError("payload padding bits are not zero")
    flat = out.view(-1)
    for start in range(0, n, step):
        m = min(step, n - start)
        patterns = _decode_chunk(buf, fmt, luts, block, sec, expect, start, m)
        flat[start : start + m] = from_bits(patterns, fmt, out.dtype)
    check_plane_padding(buf, sec.raw_bits, n, "raw bit")


def _widths(buf: torch.Tensor, sec: Sections, luts: Luts, start: int, m: int) -> torch.Tensor:
    """Payload widths of elements ``start..start + m`` from their prefix planes (int32)."""
    return luts.region.index_select(0, _prefix(buf, sec, start, m)) & 15


def _prefix(buf: torch.Tensor, sec: Sections, start: int, m: int) -> torch.Tensor:
    """The prefixes of elements ``start..start + m`` (int32, for index_select)."""
    return unpack_planes(_planes(buf, sec.prefix, start, m), m).int()


def _planes(buf: torch.Tensor, at: list[int], start: int, m: int) -> list[torch.Tensor]:
    """The bytes of planes starting at ``at`` that hold elements ``start..start + m``."""
    p0, length = start // 8, (m + 7) // 8
    return [buf[a + p0 : a + p0 + length] for a in at]


def _decode_chunk(
    buf: torch.Tensor,
    fmt: FloatFormat,
    luts: Luts,
    block: int,
    sec: Sections,
    expect: torch.Tensor,
    start: int,
    m: int,
) -> torch.Tensor:
    """The int32 bit patterns of elements ``start..start + m`` (a block boundary); the block
    offsets are checked already (``expect``)."""
    region = luts.region.index_select(0, _prefix(buf, sec, start, m))
    width = region & 15
    within, bits = _block_bits(width, block)
    first = start // block
    offsets = expect[first : first + bits.numel()]  # (m > 0: at least one block)
    begin = sec.payload + int(offsets[0])
    size = int(offsets[-1] - offsets[0] + (bits[-1] + 7) // 8)
    stream = torch.nn.functional.pad(buf[begin : begin + size].to(torch.int32), (0, 2))
    pairs = stream[:-1] << 8 | stream[1:]  # the 16-bit window at each byte
    pos = _positions((offsets - offsets[0]).int(), within, block)  # (< 2^23: int32)
    window = pairs.index_select(0, pos >> 3)
    value = (window >> (16 - (pos & 7) - width)) & ((1 << width) - 1)
    literal = (region >> 13).bool()
    rank = ((region >> 4) & 511) + value
    if (~literal & (rank >= luts.num_ranked)).any():
        raise ValueError(f"illegal codeword: a rank past the table's {luts.num_ranked} symbols")
    sym = torch.where(literal, value, luts.rank.index_select(0, rank.clamp(max=ALPHABET - 1)))
    raw = torch.zeros_like(sym)
    for b, at in enumerate(sec.raw_bytes):
        raw |= buf[at + start : at + start + m].to(torch.int32) << (8 * b)
    if sec.raw_bits:
        top = unpack_planes(_planes(buf, sec.raw_bits, start, m), m)
        raw |= top.int() << (8 * len(sec.raw_bytes))
    return join(sym, raw, fmt)
