"""Vectorised torch backend of the split layout: the CPU path and the reference for the kernels.

Runs on any device (CPU in CI, CUDA as the fallback when the CUDA kernels cannot be built). Every
step is a whole-tensor torch op: no Python loop touches elements. Bit patterns are widened to int64
so the unsigned arithmetic of golden/ carries over unchanged.
"""

from __future__ import annotations

from typing import Final

import torch

from zipccl.golden.codebook import ALPHABET, PREFIX_BITS, Codebook
from zipccl.golden.container import HEADER_BYTES, Sections
from zipccl.golden.formats import FloatFormat
from zipccl.golden.streams import num_blocks

QUEUES: Final = False  # zipccl._codecs: codes before returning

_VIEW = {8: torch.uint8, 16: torch.int16, 32: torch.int32}
_POW8 = 1 << torch.arange(8)  # bit k of a plane byte holds element k (LSB first)


def bits_of(x: torch.Tensor, fmt: FloatFormat) -> torch.Tensor:
    """Flat int64 unsigned bit patterns of a contiguous tensor."""
    return x.reshape(-1).view(_VIEW[fmt.bits]).to(torch.int64) & ((1 << fmt.bits) - 1)


def from_bits(bits: torch.Tensor, fmt: FloatFormat, dtype: torch.dtype) -> torch.Tensor:
    """Inverse of :func:`bits_of` (two's-complement fold so the narrowing cast is exact)."""
    half = 1 << (fmt.bits - 1)
    if fmt.bits > 8:
        bits = torch.where(bits >= half, bits - (half << 1), bits)
    return bits.to(_VIEW[fmt.bits]).view(dtype)


def symbols_raw(bits: torch.Tensor, fmt: FloatFormat) -> tuple[torch.Tensor, torch.Tensor]:
    """golden.formats symbols() and raw() on int64 bit patterns."""
    if fmt.byte_coded:
        return bits, torch.zeros_like(bits)
    sym = (bits >> fmt.mant_bits) & ((1 << fmt.exp_bits) - 1)
    raw = ((bits >> (fmt.bits - 1)) << fmt.mant_bits) | (bits & ((1 << fmt.mant_bits) - 1))
    return sym, raw


def join(sym: torch.Tensor, raw: torch.Tensor, fmt: FloatFormat) -> torch.Tensor:
    if fmt.byte_coded:
        return sym
    sign = raw >> fmt.mant_bits
    mant = raw & ((1 << fmt.mant_bits) - 1)
    return (sign << (fmt.bits - 1)) | (sym << fmt.mant_bits) | mant


def to_planes(values: torch.Tensor, nbits: int) -> torch.Tensor:
    """(nbits, ceil(n/8)) uint8 bit planes, LSB first within bytes (golden.streams.to_planes)."""
    n = values.numel()
    pad = torch.nn.functional.pad(values, (0, -n % 8)).view(-1, 8)
    pow8 = _POW8.to(values.device)
    rows = [(((pad >> k) & 1) * pow8).sum(1) for k in range(nbits)]
    if not rows:
        return torch.zeros(0, (n + 7) // 8, dtype=torch.uint8, device=values.device)
    return torch.stack(rows).to(torch.uint8)


def from_planes(planes: list[torch.Tensor], count: int, what: str) -> torch.Tensor:
    """Inverse of :func:`to_planes`; bits past ``count`` must be zero (golden checks the same)."""
    out = None
    for k, plane in enumerate(planes):
        bits = (plane.to(torch.int64)[:, None] >> torch.arange(8, device=plane.device)) & 1
        bits = bits.reshape(-1)
        if bits[count:].any():
            raise ValueError(f"{what} plane {k} padding bits are not zero")
        term = bits[:count] << k
        out = term if out is None else out | term
    assert out is not None
    return out


class Luts:
    """A table's lookup tensors on one device: encoder (prefix, payload, width), decoder tables."""

    def __init__(self, table: Codebook, device: torch.device) -> None:
        def t(a: object) -> torch.Tensor:
            return torch.as_tensor(a, dtype=torch.int64, device=device)

        prefix, payload, length = table.encoder_lut()
        self.prefix, self.payload = t(prefix), t(payload)
        self.width = t(length.astype(int) - PREFIX_BITS)
        width, base, literal = table.region_table()
        self.region_width, self.region_base = t(width), t(base)
        self.region_literal = torch.as_tensor(literal, device=device)
        self.rank = t(table.rank_lut())
        self.num_ranked = table.num_ranked


def _block_bits(width: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each codeword's bit offset inside its block, and each block's payload bit count."""
    n = width.numel()
    nb = num_blocks(n, block)
    grid = torch.nn.functional.pad(width, (0, nb * block - n)).view(nb, block)
    csum = grid.cumsum(1)
    within = (csum - grid).reshape(-1)[:n]
    return within, csum[:, -1] if nb else csum.new_zeros(0)


def _pack_payload(
    value: torch.Tensor, width: torch.Tensor, block: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """MSB-first codeword payloads, each block byte aligned -> (payload bytes, block offsets).

    Each codeword lands in a 16-bit window at its byte; codewords own disjoint bits, so adding the
    windows' bytes into the stream equals OR-ing them.
    """
    within, bits = _block_bits(width, block)
    nbytes = (bits + 7) // 8
    offsets = nbytes.cumsum(0) - nbytes
    total = int(nbytes.sum())
    n = width.numel()
    blk = torch.arange(n, device=width.device) // block
    pos = offsets[blk] * 8 + within
    window = value << (16 - (pos & 7) - width)
    byte = pos >> 3
    acc = torch.zeros(total + 2, dtype=torch.int64, device=width.device)
    acc.index_add_(0, byte, window >> 8)
    acc.index_add_(0, byte + 1, window & 0xFF)
    return acc[:total].to(torch.uint8), offsets


def encode_into(
    x: torch.Tensor, fmt: FloatFormat, table: Codebook, block: int, out: torch.Tensor
) -> int:
    """Write the split layout's sections of ``x`` into ``out`` (uint8, at least the fixed part
    long); the payload stream is written only where it fits. Returns payload_bytes."""
    n = x.numel()
    sec = Sections.of(fmt, n, block)
    luts = Luts(table, x.device)
    sym, raw = symbols_raw(bits_of(x, fmt), fmt)
    out[: sec.payload].zero_()
    for b, at in enumerate(sec.raw_bytes):
        out[at : at + n] = ((raw >> (8 * b)) & 0xFF).to(torch.uint8)
    top = to_planes(raw >> (8 * len(sec.raw_bytes)), len(sec.raw_bits))
    planes = torch.cat([top, to_planes(luts.prefix[sym], PREFIX_BITS)])
    for plane, at in zip(planes, sec.raw_bits + sec.prefix, strict=True):
        out[at : at + plane.numel()] = plane
    payload, offsets = _pack_payload(luts.payload[sym], luts.width[sym], block)
    out[sec.offsets : sec.offsets + 8 * offsets.numel()] = offsets.view(torch.uint8)
    if sec.payload + payload.numel() <= out.numel():
        out[sec.payload : sec.payload + payload.numel()] = payload
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
    """Decode a split-layout buffer whose length the caller has checked; ValueError if corrupt."""
    n = out.numel()
    sec = Sections.of(fmt, n, block)
    plane_len = (n + 7) // 8
    luts = Luts(table, buf.device)
    prefix = from_planes([buf[at : at + plane_len] for at in sec.prefix], n, "prefix")
    width = luts.region_width[prefix]
    within, bits = _block_bits(width, block)
    nbytes = (bits + 7) // 8
    expect = nbytes.cumsum(0) - nbytes
    nb = expect.numel()
    stored = buf[sec.offsets : sec.offsets + 8 * nb].clone().view(torch.int64)
    if not torch.equal(stored, expect) or int(nbytes.sum()) != payload_bytes:
        raise ValueError("payload block offsets disagree with the prefix planes")
    stream = torch.nn.functional.pad(buf[sec.payload :].to(torch.int64), (0, 2))
    tail = bits % 8
    last = stream[(expect + nbytes - 1).clamp(min=0)]
    if ((last & ((1 << (8 - tail)) - 1)) * (tail > 0)).any():
        raise ValueError("payload padding bits are not zero")
    blk = torch.arange(n, device=buf.device) // block
    pos = expect[blk] * 8 + within
    byte = pos >> 3
    window = (stream[byte] << 8) | stream[byte + 1]
    value = (window >> (16 - (pos & 7) - width)) & ((1 << width) - 1)
    literal = luts.region_literal[prefix]
    rank = luts.region_base[prefix] + value
    if (~literal & (rank >= luts.num_ranked)).any():
        raise ValueError(f"illegal codeword: a rank past the table's {luts.num_ranked} symbols")
    sym = torch.where(literal, value, luts.rank[rank.clamp(max=ALPHABET - 1)])
    raw = torch.zeros_like(sym)
    for b, at in enumerate(sec.raw_bytes):
        raw |= buf[at : at + n].to(torch.int64) << (8 * b)
    if sec.raw_bits:
        top = from_planes([buf[at : at + plane_len] for at in sec.raw_bits], n, "raw bit")
        raw |= top << (8 * len(sec.raw_bytes))
    out.view(-1).copy_(from_bits(join(sym, raw, fmt), fmt, out.dtype))
