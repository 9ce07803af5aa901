"""Triton backend of the split layout: the same module contract and bytes as ``_torch``.

One program per block. Symbols come from the table's RTL word images (``Codebook.encoder_words``,
``region_words``, ``rank_words``) in one int32 tensor, so the kernels decode exactly the word
layouts golden/ defines for the hardware. Bit planes are packed 8 elements per byte; each
codeword's payload bit position inside its block is a ``tl.cumsum`` of widths.

Encode is three steps: a block kernel writes the raw and prefix planes and ORs each block's
payload bits into its own scratch slot (int32 words, big-endian bit order, ``tl.atomic_or``:
codewords own disjoint bits); an exclusive scan of the per-block byte counts gives the offsets;
a compaction kernel copies each block's bytes to its offset. Decode validates like ``_torch``: a
count kernel derives the offsets from the prefix planes, a block kernel decodes and flags corrupt
blocks, and the host raises the first problem in ``_torch``'s order after one read-back.

Runs on CUDA tensors, and on CPU tensors under ``TRITON_INTERPRET=1`` (what CI does).
"""

from __future__ import annotations

import functools
from typing import Final

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

from zipccl._torch import _VIEW
from zipccl.golden.codebook import (
    ALPHABET,
    ENC_PAYLOAD_BITS,
    ENC_PREFIX_SHIFT,
    ENC_WIDTH_SHIFT,
    NUM_REGIONS,
    PREFIX_BITS,
    REGION_BASE_BITS,
    REGION_LITERAL_SHIFT,
    REGION_WIDTH_SHIFT,
    Codebook,
)
from zipccl.golden.container import Sections
from zipccl.golden.formats import FloatFormat
from zipccl.golden.streams import num_blocks

QUEUES: Final = False  # zipccl._codecs: codes before returning

MIN_BLOCK, MAX_BLOCK = 64, 16384  # one block's codewords are one program's vectors
MAX_WARPS = 16

# Globals the kernels read must be constexpr. Word layouts: golden.codebook's RTL images.
_PREFIX_BITS = tl.constexpr(PREFIX_BITS)
_PREFIX_MASK = tl.constexpr((1 << PREFIX_BITS) - 1)
_PAYLOAD_MASK = tl.constexpr((1 << ENC_PAYLOAD_BITS) - 1)
_ENC_PREFIX_SHIFT = tl.constexpr(ENC_PREFIX_SHIFT)
_ENC_WIDTH_SHIFT = tl.constexpr(ENC_WIDTH_SHIFT)
_BASE_MASK = tl.constexpr((1 << REGION_BASE_BITS) - 1)
_REGION_WIDTH_SHIFT = tl.constexpr(REGION_WIDTH_SHIFT)
_REGION_WIDTH_MASK = tl.constexpr((1 << (REGION_LITERAL_SHIFT - REGION_WIDTH_SHIFT)) - 1)
_REGION_LITERAL_SHIFT = tl.constexpr(REGION_LITERAL_SHIFT)
_REGION_AT = tl.constexpr(ALPHABET)  # table tensor: encoder words, region words, rank words
_RANK_AT = tl.constexpr(ALPHABET + NUM_REGIONS)
_LAST_RANK = tl.constexpr(ALPHABET - 1)

OFFSETS_DISAGREE = "payload block offsets disagree with the prefix planes"


def supports(block: int) -> bool:
    return MIN_BLOCK <= block <= MAX_BLOCK and block & (block - 1) == 0


# ---------------------------------------------------------------------- device helpers
@triton.jit
def _split(bits, MANT: tl.constexpr, BITS: tl.constexpr, BYTE_CODED: tl.constexpr):
    """(symbol, raw) of int32 bit patterns (golden.formats symbols() and raw())."""
    if BYTE_CODED:
        sym = bits & 0xFF
        raw = tl.zeros_like(bits)
    else:
        sym = (bits >> MANT) & ((1 << (BITS - 1 - MANT)) - 1)
        sign = (bits >> (BITS - 1)) & 1
        raw = (sign << MANT) | (bits & ((1 << MANT) - 1))
    return sym, raw


@triton.jit
def _join(sym, raw, MANT: tl.constexpr, BITS: tl.constexpr, BYTE_CODED: tl.constexpr):
    """Inverse of :func:`_split`."""
    if BYTE_CODED:
        bits = sym
    else:
        sign = (raw >> MANT) & 1
        bits = (sign << (BITS - 1)) | (sym << MANT) | (raw & ((1 << MANT) - 1))
    return bits


@triton.jit
def _store_planes(
    out_ptr,
    sec_ptr,
    FIRST: tl.constexpr,
    COUNT: tl.constexpr,
    values,
    pid,
    plane_len,
    BLOCK: tl.constexpr,
):
    """Bit k of ``values`` into plane ``FIRST + k`` of ``sec``, LSB-first, 8 elements a byte."""
    byte = pid * (BLOCK // 8) + tl.arange(0, BLOCK // 8)
    weight = 1 << tl.arange(0, 8)
    for k in tl.static_range(COUNT):
        at = tl.load(sec_ptr + FIRST + k)
        bit = tl.reshape((values >> k) & 1, (BLOCK // 8, 8))
        packed = tl.sum(bit * weight[None, :], axis=1)
        tl.store(out_ptr + at + byte, packed.to(tl.uint8), mask=byte < plane_len)


@triton.jit
def _load_planes(buf_ptr, sec_ptr, FIRST: tl.constexpr, COUNT: tl.constexpr, idx, n, plane_len):
    """Inverse of :func:`_store_planes` -> (values, mask whose bit k says plane k has a padding
    bit past ``n`` set). Values past ``n`` are the padding bits: callers mask them."""
    valid = idx < n
    byte = idx >> 3
    values = tl.zeros_like(idx).to(tl.int32)
    stray = tl.sum(values, axis=0)
    for k in tl.static_range(COUNT):
        at = tl.load(sec_ptr + FIRST + k)
        plane = tl.load(buf_ptr + at + byte, mask=byte < plane_len, other=0).to(tl.int32)
        bit = (plane >> (idx & 7).to(tl.int32)) & 1
        values |= bit << k
        stray |= tl.max(tl.where(valid, 0, bit), axis=0) << k
    return values, stray


# ---------------------------------------------------------------------- encode kernels
@triton.jit
def _encode_blocks(
    x_ptr,
    out_ptr,
    sec_ptr,
    table_ptr,
    bits_ptr,
    scratch_ptr,
    n,
    plane_len,
    MANT: tl.constexpr,
    BITS: tl.constexpr,
    BYTE_CODED: tl.constexpr,
    RAW_BYTES: tl.constexpr,
    RAW_PLANES: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Raw and prefix planes of one block; its payload bits into its scratch slot."""
    pid = tl.program_id(0).to(tl.int64)
    idx = pid * BLOCK + tl.arange(0, BLOCK)
    valid = idx < n
    bits = tl.load(x_ptr + idx, mask=valid, other=0).to(tl.int32)
    sym, raw = _split(bits, MANT, BITS, BYTE_CODED)
    for b in tl.static_range(RAW_BYTES):
        at = tl.load(sec_ptr + b)
        tl.store(out_ptr + at + idx, ((raw >> (8 * b)) & 0xFF).to(tl.uint8), mask=valid)
    _store_planes(
        out_ptr, sec_ptr, RAW_BYTES, RAW_PLANES, raw >> (8 * RAW_BYTES), pid, plane_len, BLOCK
    )
    word = tl.load(table_ptr + sym)
    prefix = tl.where(valid, (word >> _ENC_PREFIX_SHIFT) & _PREFIX_MASK, 0)
    _store_planes(
        out_ptr, sec_ptr, RAW_BYTES + RAW_PLANES, _PREFIX_BITS, prefix, pid, plane_len, BLOCK
    )
    width = tl.where(valid, word >> _ENC_WIDTH_SHIFT, 0)
    within = tl.cumsum(width, axis=0) - width
    tl.store(bits_ptr + pid, tl.sum(width, axis=0))
    # MSB first: bit r of word q (r = within % 32) starts the payload. Place it in a 40-bit
    # window whose top 32 bits are word q and low 8 the head of word q + 1 (w <= 8 spills).
    r = within & 31
    window = (word & _PAYLOAD_MASK).to(tl.int64) << (40 - r - width)
    slot = scratch_ptr + pid * (BLOCK // 4) + (within >> 5)
    tl.atomic_or(slot, (window >> 8).to(tl.int32), mask=width > 0, sem="relaxed")
    tl.atomic_or(slot + 1, ((window & 0xFF) << 24).to(tl.int32), mask=r + width > 32, sem="relaxed")


@triton.jit
def _compact(scratch_ptr, nbytes_ptr, offsets_ptr, out_ptr, payload_at, BLOCK: tl.constexpr):
    """Copy one block's payload bytes from its scratch words to its offset in the stream."""
    pid = tl.program_id(0).to(tl.int64)
    j = tl.arange(0, BLOCK)
    keep = j < tl.load(nbytes_ptr + pid)
    word = tl.load(scratch_ptr + pid * (BLOCK // 4) + (j >> 2), mask=keep, other=0)
    byte = (word >> (24 - 8 * (j & 3))) & 0xFF
    at = payload_at + tl.load(offsets_ptr + pid) + j
    tl.store(out_ptr + at, byte.to(tl.uint8), mask=keep)


# ---------------------------------------------------------------------- decode kernels
@triton.jit
def _block_widths(buf_ptr, sec_ptr, table_ptr, idx, n, plane_len, FIRST: tl.constexpr):
    """(payload width, region word, prefix padding mask) of one block's elements."""
    prefix, stray = _load_planes(buf_ptr, sec_ptr, FIRST, _PREFIX_BITS, idx, n, plane_len)
    region = tl.load(table_ptr + _REGION_AT + prefix)
    width = tl.where(idx < n, (region >> _REGION_WIDTH_SHIFT) & _REGION_WIDTH_MASK, 0)
    return width, region, stray


@triton.jit
def _decode_counts(
    buf_ptr,
    sec_ptr,
    table_ptr,
    bits_ptr,
    stray_ptr,
    n,
    plane_len,
    FIRST: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Each block's payload bit count from its prefixes, and its prefix padding mask."""
    pid = tl.program_id(0).to(tl.int64)
    idx = pid * BLOCK + tl.arange(0, BLOCK)
    width, _, stray = _block_widths(buf_ptr, sec_ptr, table_ptr, idx, n, plane_len, FIRST)
    tl.store(bits_ptr + pid, tl.sum(width, axis=0))
    tl.store(stray_ptr + pid, stray)


@triton.jit
def _decode_blocks(
    buf_ptr,
    out_ptr,
    sec_ptr,
    table_ptr,
    bits_ptr,
    offsets_ptr,
    flags_ptr,
    n,
    plane_len,
    payload_at,
    payload_bytes,
    num_ranked,
    MANT: tl.constexpr,
    BITS: tl.constexpr,
    BYTE_CODED: tl.constexpr,
    RAW_BYTES: tl.constexpr,
    RAW_PLANES: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Decode one block at the offset its prefixes imply; every read stays inside the payload,
    so a corrupt buffer only sets flags: payload padding, illegal rank, raw plane padding."""
    pid = tl.program_id(0).to(tl.int64)
    idx = pid * BLOCK + tl.arange(0, BLOCK)
    valid = idx < n
    width, region, _ = _block_widths(
        buf_ptr, sec_ptr, table_ptr, idx, n, plane_len, RAW_BYTES + RAW_PLANES
    )
    start = tl.load(offsets_ptr + pid)
    pos = start * 8 + tl.cumsum(width, axis=0) - width
    byte = pos >> 3
    stream = buf_ptr + payload_at
    hi = tl.load(stream + byte, mask=(width > 0) & (byte < payload_bytes), other=0)
    lo = tl.load(stream + byte + 1, mask=(width > 0) & (byte + 1 < payload_bytes), other=0)
    window = (hi.to(tl.int32) << 8) | lo.to(tl.int32)
    value = (window >> (16 - (pos & 7) - width).to(tl.int32)) & ((1 << width) - 1)
    bits = tl.load(bits_ptr + pid)
    tail = (bits & 7).to(tl.int32)
    last = start + (bits + 7) // 8 - 1
    end = tl.load(stream + last, mask=(tail > 0) & (last < payload_bytes), other=0)
    padding = tl.where(tail > 0, end.to(tl.int32) & ((1 << (8 - tail)) - 1), 0)
    literal = (region >> _REGION_LITERAL_SHIFT) & 1
    rank = (region & _BASE_MASK) + value
    illegal = valid & (literal == 0) & (rank >= num_ranked)
    ranked = tl.load(table_ptr + _RANK_AT + tl.minimum(rank, _LAST_RANK))
    sym = tl.where(literal == 1, value, ranked)
    raw = tl.zeros_like(sym)
    for b in tl.static_range(RAW_BYTES):
        at = tl.load(sec_ptr + b)
        raw |= tl.load(buf_ptr + at + idx, mask=valid, other=0).to(tl.int32) << (8 * b)
    top, stray = _load_planes(buf_ptr, sec_ptr, RAW_BYTES, RAW_PLANES, idx, n, plane_len)
    raw |= top << (8 * RAW_BYTES)
    out = _join(sym, raw, MANT, BITS, BYTE_CODED)
    tl.store(out_ptr + idx, out.to(out_ptr.dtype.element_ty), mask=valid)
    tl.store(flags_ptr + pid * 3, padding != 0)
    tl.store(flags_ptr + pid * 3 + 1, tl.max(illegal.to(tl.int32), axis=0))
    tl.store(flags_ptr + pid * 3 + 2, stray)


# ---------------------------------------------------------------------- host side
@functools.lru_cache(maxsize=64)
def _table_tensor(table: Codebook, device: torch.device) -> torch.Tensor:
    words = table.encoder_words() + table.region_words() + table.rank_words()
    return torch.tensor(words, dtype=torch.int32, device=device)


@functools.lru_cache(maxsize=256)
def _sections(fmt: FloatFormat, n: int, block: int, device: torch.device) -> torch.Tensor:
    """The plane offsets the kernels index: raw byte planes, raw bit planes, prefix planes."""
    sec = Sections.of(fmt, n, block)
    return torch.tensor(sec.raw_bytes + sec.raw_bits + sec.prefix, dtype=torch.int64, device=device)


def _format_args(fmt: FloatFormat) -> dict[str, int | bool]:
    return {
        "MANT": fmt.mant_bits,
        "BITS": fmt.bits,
        "BYTE_CODED": fmt.byte_coded,
        "RAW_BYTES": fmt.raw_bits // 8,
        "RAW_PLANES": fmt.raw_bits % 8,
    }


def _plane_bits(mask: torch.Tensor, count: int) -> list[torch.Tensor]:
    """Per plane k: whether any block set bit k of its padding mask."""
    return [(mask & (1 << k) != 0).any() for k in range(count)]


def _problems(fmt: FloatFormat, table: Codebook) -> list[str]:
    """_torch.decode_into's messages, in the order it checks (one per flag of decode_into)."""
    return [
        *(f"prefix plane {k} padding bits are not zero" for k in range(PREFIX_BITS)),
        OFFSETS_DISAGREE,
        "payload padding bits are not zero",
        f"illegal codeword: a rank past the table's {table.num_ranked} symbols",
        *(f"raw bit plane {k} padding bits are not zero" for k in range(fmt.raw_bits % 8)),
    ]


def _warps(block: int) -> int:
    return max(1, min(MAX_WARPS, block // 256))


def _check(block: int, *tensors: torch.Tensor) -> None:
    if not supports(block):
        raise ValueError(
            f"the Triton codec takes power-of-two blocks in [{MIN_BLOCK}, {MAX_BLOCK}], got {block}"
        )
    device = tensors[0].device
    if any(t.device != device for t in tensors):
        raise ValueError("the Triton codec needs all tensors on one device")
    if device.type != "cuda" and not isinstance(_encode_blocks, InterpretedFunction):
        raise ValueError(
            f"the Triton codec runs on CUDA tensors (or TRITON_INTERPRET=1), got {device}"
        )


def encode_into(
    x: torch.Tensor, fmt: FloatFormat, table: Codebook, block: int, out: torch.Tensor
) -> int:
    """Same contract as ``_torch.encode_into``: the split sections after the header go into
    ``out``, the payload stream only where it fits; returns payload_bytes (one host sync)."""
    _check(block, x, out)
    n = x.numel()
    sec = Sections.of(fmt, n, block)
    if out.dtype != torch.uint8 or out.dim() != 1 or out.numel() < sec.payload:
        raise ValueError(f"out must be a 1-D uint8 tensor of at least {sec.payload} bytes")
    nb = num_blocks(n, block)
    out[: sec.payload].zero_()
    if nb == 0:
        return 0
    bits = torch.empty(nb, dtype=torch.int64, device=x.device)
    scratch = torch.zeros(nb * block // 4, dtype=torch.int32, device=x.device)
    _encode_blocks[(nb,)](
        x.reshape(-1).view(_VIEW[fmt.bits]),
        out,
        _sections(fmt, n, block, x.device),
        _table_tensor(table, x.device),
        bits,
        scratch,
        n,
        (n + 7) // 8,
        **_format_args(fmt),
        BLOCK=block,
        num_warps=_warps(block),
    )
    nbytes = (bits + 7) // 8
    offsets = nbytes.cumsum(0) - nbytes
    out[sec.offsets : sec.offsets + 8 * nb] = offsets.view(torch.uint8)
    total = int(nbytes.sum())
    if sec.payload + total <= out.numel():
        _compact[(nb,)](
            scratch, nbytes, offsets, out, sec.payload, BLOCK=block, num_warps=_warps(block)
        )
    return total


def decode_into(
    buf: torch.Tensor,
    fmt: FloatFormat,
    table: Codebook,
    block: int,
    payload_bytes: int,
    out: torch.Tensor,
) -> None:
    """Same contract as ``_torch.decode_into``: ValueError, with its message and precedence,
    for exactly the buffers it rejects; one host sync reads every check at once."""
    _check(block, buf, out)
    n = out.numel()
    sec = Sections.of(fmt, n, block)
    nb = num_blocks(n, block)
    if nb == 0:
        if payload_bytes:
            raise ValueError(OFFSETS_DISAGREE)
        return
    planes = _sections(fmt, n, block, buf.device)
    words = _table_tensor(table, buf.device)
    plane_len = (n + 7) // 8
    bits = torch.empty(nb, dtype=torch.int64, device=buf.device)
    stray = torch.empty(nb, dtype=torch.int32, device=buf.device)
    first = len(sec.raw_bytes) + len(sec.raw_bits)
    _decode_counts[(nb,)](
        buf,
        planes,
        words,
        bits,
        stray,
        n,
        plane_len,
        FIRST=first,
        BLOCK=block,
        num_warps=_warps(block),
    )
    nbytes = (bits + 7) // 8
    expect = nbytes.cumsum(0) - nbytes
    stored = buf[sec.offsets : sec.offsets + 8 * nb].clone().view(torch.int64)
    flags = torch.empty(nb, 3, dtype=torch.int32, device=buf.device)
    _decode_blocks[(nb,)](
        buf,
        out.view(-1).view(_VIEW[fmt.bits]),
        planes,
        words,
        bits,
        expect,
        flags,
        n,
        plane_len,
        sec.payload,
        payload_bytes,
        table.num_ranked,
        **_format_args(fmt),
        BLOCK=block,
        num_warps=_warps(block),
    )
    mismatch = (stored != expect).any() | (nbytes.sum() != payload_bytes)
    found = torch.stack(
        [
            *_plane_bits(stray, PREFIX_BITS),
            mismatch,
            flags[:, 0].any(),
            flags[:, 1].any(),
            *_plane_bits(flags[:, 2], len(sec.raw_bits)),
        ]
    ).tolist()
    for bad, why in zip(found, _problems(fmt, table), strict=True):
        if bad:
            raise ValueError(why)
