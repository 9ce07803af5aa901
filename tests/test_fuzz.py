"""Bounded mutation fuzzing of the golden and torch decoders.

Every mutated buffer either decodes -- in both decoders, to the same bits, which re-encode to
exactly the mutated bytes (the decoders accept only canonical buffers) -- or raises ValueError in
both: never another exception, a hang (the test has a timeout) or a huge allocation (peak RSS is
checked). Mutations: bit flips, byte writes, truncation, extension, insertion and deletion, and
header fields set to boundary values with the CRC (and table hash) recomputed so that the checks
behind the CRC are reached. Fixed seeds; a failure names the seed and the mutation number.
"""

from __future__ import annotations

import hashlib
import resource
import struct
import zlib
from collections.abc import Callable

import numpy as np
import pytest
import torch
import zipccl
from hypothesis import given, settings
from hypothesis import strategies as st
from zipccl import _torch
from zipccl.golden import container
from zipccl.golden.codebook import ALPHABET, TABLE_BYTES, Codebook
from zipccl.golden.container import CRC_AT, HEADER_BYTES, LAYOUT_SPLIT, Header
from zipccl.golden.formats import BF16, E4M3, E5M2, FP16, FP32, FloatFormat
from zipccl.golden.theory import TensorStats, zipccl_table

from tests.strategies import QLC

SEED = 20261201
MUTATIONS = 6000  # golden + torch decode of each: ~6 s on one core
RSS_GROWTH_LIMIT = 512 << 20  # bytes: no mutation may make a decoder touch this much memory

ODD = Codebook((8, 1, 2, 3, 0, 0, 2, 1), 0, tuple(range(11)))  # payload widths 1/2/3: padding
_TABLE_AT, _HASH_AT = 104, 96
# (offset, size) of every header field a mutation may set, then fix the CRC of
_FIELDS = [
    (5, 1),
    (6, 1),
    (7, 1),
    (8, 4),
    (12, 4),
    (16, 8),
    (24, 8),
    (32, 8),
    (40, 8),
    (88, 8),
    (_HASH_AT, 8),
]
_BOUNDARY = [
    0,
    1,
    2,
    7,
    8,
    63,
    64,
    65,
    127,
    128,
    255,
    256,
    4095,
    4096,
    2**20,
    2**20 + 1,
    2**31,
    2**32 - 1,
    2**32,
    2**48,
    2**48 + 1,
    2**61 + 50,
    2**63,
    2**64 - 1,
]


def _corpus() -> dict[str, bytes]:
    """Small buffers of every format and both layouts (small so the fuzz can be long)."""
    rng = np.random.default_rng(SEED)

    def normal(fmt: FloatFormat, n: int, scale: float = 1.0) -> np.ndarray:
        x = (rng.standard_normal(n) * scale).astype(np.float32)
        return {16: (x.view(np.uint32) >> 16).astype(np.uint16), 32: x.view(np.uint32)}[fmt.bits]

    def theory(fmt: FloatFormat) -> Codebook:
        return zipccl_table(fmt, TensorStats(1.0, 0.0))

    fp8 = rng.geometric(0.15, 3000).clip(0, 255).astype(np.uint8)  # small bytes: short codes
    half = np.float16(rng.standard_normal(2000)).view(np.uint16)
    out = {
        "bf16": container.encode(normal(BF16, 2000), BF16, theory(BF16), 256),
        "bf16-shaped": container.encode(
            normal(BF16, 2100).reshape(3, 100, 7), BF16, theory(BF16), 64
        ),
        "fp16": container.encode(half, FP16, theory(FP16), 256),
        "fp32": container.encode(normal(FP32, 1000), FP32, theory(FP32), 128),
        "e4m3": container.encode(fp8, E4M3, QLC, 1024),
        "e5m2-odd-widths": container.encode(fp8, E5M2, ODD, 64),
        "raw": container.encode(
            rng.integers(0, 1 << 16, 100, dtype=np.uint16), BF16, theory(BF16), 128
        ),
        "empty": container.encode(np.zeros(0, np.uint16), BF16, theory(BF16), 4096),
    }
    for name, buf in out.items():  # the corpus covers both layouts
        assert (Header.unpack(buf).layout == LAYOUT_SPLIT) == (name not in ("raw", "empty"))
    return out


CORPUS = _corpus()


# ---------------------------------------------------------------------- mutations
def _fix_crc(buf: bytearray) -> None:
    if len(buf) >= HEADER_BYTES:
        struct.pack_into("<I", buf, CRC_AT, zlib.crc32(buf[:CRC_AT]))


def _set_field(buf: bytearray, rng: np.random.Generator) -> None:
    if len(buf) < HEADER_BYTES:
        return
    at, size = _FIELDS[rng.integers(len(_FIELDS))]
    old = int.from_bytes(buf[at : at + size], "little")
    value = int(rng.choice([*_BOUNDARY, old + 1, old - 1, old * 2, old // 2])) % (1 << 8 * size)
    buf[at : at + size] = value.to_bytes(size, "little")
    _fix_crc(buf)


def _set_table_byte(buf: bytearray, rng: np.random.Generator) -> None:
    """A table byte changed with hash and CRC fixed: reaches the table's own validation."""
    if len(buf) < HEADER_BYTES:
        return
    buf[_TABLE_AT + int(rng.integers(TABLE_BYTES))] = int(rng.integers(ALPHABET))
    table = bytes(buf[_TABLE_AT : _TABLE_AT + TABLE_BYTES])
    buf[_HASH_AT : _HASH_AT + 8] = hashlib.sha256(table).digest()[:8]  # hash64
    _fix_crc(buf)


def _flip_bit(buf: bytearray, rng: np.random.Generator) -> None:
    if buf:
        at = int(rng.integers(len(buf)))
        buf[at] ^= 1 << int(rng.integers(8))


def _write_body_byte(buf: bytearray, rng: np.random.Generator) -> None:
    if len(buf) > HEADER_BYTES:
        buf[int(rng.integers(HEADER_BYTES, len(buf)))] = int(rng.integers(ALPHABET))


def _truncate(buf: bytearray, rng: np.random.Generator) -> None:
    del buf[int(rng.integers(len(buf) + 1)) :]


def _extend(buf: bytearray, rng: np.random.Generator) -> None:
    buf.extend(rng.integers(0, 2, int(rng.integers(1, 9)), dtype=np.uint8).tobytes())


def _insert_or_delete(buf: bytearray, rng: np.random.Generator) -> None:
    at = int(rng.integers(len(buf) + 1))
    if rng.integers(2) and at < len(buf):
        del buf[at]
    else:
        buf.insert(at, 0)


MUTATORS: list[Callable[[bytearray, np.random.Generator], None]] = [
    _set_field,
    _set_table_byte,
    _flip_bit,
    _flip_bit,
    _write_body_byte,
    _truncate,
    _extend,
    _insert_or_delete,
]


def mutate(buf: bytes, rng: np.random.Generator) -> bytes:
    out = bytearray(buf)
    for _ in range(int(rng.integers(1, 4))):
        MUTATORS[rng.integers(len(MUTATORS))](out, rng)
    return bytes(out)


# ---------------------------------------------------------------------- the oracles
def golden_decode(buf: bytes) -> np.ndarray | None:
    """golden's bits, None if rejected; accepted bits must re-encode to ``buf`` exactly."""
    try:
        fmt, bits = container.decode(buf)
    except ValueError:
        return None
    head = Header.unpack(buf)
    if head.table is None:
        again = container.encode_raw(bits, fmt, head.block)
    else:
        again = container.encode(bits, fmt, head.table, head.block)
    assert again == buf, "an accepted buffer is not what the encoder writes for its content"
    return bits


def torch_decode(buf: bytes) -> np.ndarray | None:
    """zipccl.decompress (the torch backend on CPU) plus the canonical-form check that
    codec.decompress is to call (issue 18 item 6, see test_codec_rejects_non_canonical_buffers);
    None if rejected."""
    data = torch.tensor(list(buf), dtype=torch.uint8)
    try:
        out = zipccl.decompress(data)
        head = Header.unpack(buf)
        if head.table is not None:
            _torch.check_canonical(data, head.fmt, head.table, head.block, head.payload_bytes, out)
    except ValueError:
        return None
    bits = _torch.bits_of(out.contiguous(), head.fmt).numpy().astype(head.fmt.uint)
    return bits.reshape(head.shape)


def check(buf: bytes, where: str) -> bool:
    """Both decoders agree on ``buf`` (accepted: same bits, re-encoding exact); True if accepted."""
    try:
        want, got = golden_decode(buf), torch_decode(buf)
    except AssertionError:
        raise
    except Exception as exc:  # anything but ValueError is a bug
        raise AssertionError(f"{where}: {type(exc).__name__}: {exc}") from exc
    verdict = {True: "rejects", False: "accepts"}
    assert (want is None) == (got is None), (
        f"{where}: golden {verdict[want is None]}, torch {verdict[got is None]}"
    )
    assert want is None or np.array_equal(got, want), f"{where}: the decoders' bits differ"
    return want is not None


# ---------------------------------------------------------------------- the tests
@pytest.mark.parametrize("name", sorted(CORPUS))
def test_corpus_is_accepted(name: str) -> None:
    assert check(CORPUS[name], name)


@pytest.mark.timeout(180)
def test_mutation_fuzz() -> None:
    """A few thousand mutations over the corpus; per-mutation seeds make any failure replayable
    alone: ``mutate(CORPUS[name], np.random.default_rng([SEED, i]))``."""
    names = sorted(CORPUS)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    accepted = 0
    for i in range(MUTATIONS):
        name = names[i % len(names)]
        bad = mutate(CORPUS[name], np.random.default_rng([SEED, i]))
        accepted += check(bad, f"seed [{SEED}, {i}] on {name!r}") and bad != CORPUS[name]
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - rss
    assert grown < RSS_GROWTH_LIMIT, f"seed {SEED}: peak memory grew by {grown >> 20} MiB"
    assert accepted > 0, f"seed {SEED}: no mutation was accepted, the oracle went unused"


@settings(max_examples=150, deadline=None)
@given(name=st.sampled_from(sorted(CORPUS)), seed=st.integers(0, 2**63 - 1))
def test_accepted_mutations_re_encode_to_the_same_bytes(name: str, seed: int) -> None:
    check(mutate(CORPUS[name], np.random.default_rng(seed)), f"seed {seed} on {name!r}")


def _escaped_ranked_symbol() -> bytes:
    """Element 0 escaped (its 8-bit payload is the block's first byte), then made a ranked
    symbol while still escaped."""
    bits = np.ones(3000, np.uint8)
    bits[0] = 200
    buf = bytearray(container.encode(bits, E5M2, ODD, 64))
    at = container.Sections.of(E5M2, bits.size, 64).payload
    assert buf[at] == 200 and ODD.literal == 0
    buf[at] = 3
    return bytes(buf)


def _fp16_symbol_past_its_exponent() -> bytes:
    """Element 0 (a zero: exponent 0, escaped) given the escape value 200, which no 5-bit FP16
    exponent is: it decoded to some value whose exponent is 200 mod 32."""
    bits = np.full(3000, np.float16(1.0).view(np.uint16))
    bits[0] = 0
    table = zipccl_table(FP16, TensorStats(1.0, 0.0))
    buf = bytearray(container.encode(bits, FP16, table, 64))
    at = container.Sections.of(FP16, bits.size, 64).payload
    assert 0 not in table.ranks and buf[at] == 0
    buf[at] = 200
    return bytes(buf)


def gap_set() -> bytes:
    buf = bytearray(CORPUS["bf16"])
    head = Header.unpack(buf)
    lo, _ = container.Sections.of(head.fmt, head.numel, head.block).gaps[0]
    buf[lo] = 1
    return bytes(buf)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (gap_set, "gap"),
        (_escaped_ranked_symbol, "ranks it"),
        (_fp16_symbol_past_its_exponent, "past float16"),
    ],
)
def test_non_canonical_buffers_are_rejected(make: Callable[[], bytes], message: str) -> None:
    """Both decode to valid values (before the fix golden accepted them) but no encoder writes
    them."""
    buf = make()
    with pytest.raises(ValueError, match=message):
        container.decode(buf)
    assert torch_decode(buf) is None


@pytest.mark.parametrize("make", [gap_set, _escaped_ranked_symbol, _fp16_symbol_past_its_exponent])
def test_codec_rejects_non_canonical_buffers(make: Callable[[], bytes]) -> None:
    with pytest.raises(ValueError):
        zipccl.decompress(torch.tensor(list(make()), dtype=torch.uint8))


@pytest.mark.parametrize(
    ("shape", "numel"), [((40, 2**61 + 50), 2000), ((0, 2**63), 0), ((2**49,), 2**49)]
)
def test_torch_decoder_checks_shapes_with_exact_integers(shape, numel) -> None:
    """Before: (40, 2**61 + 50) passed as 2000 elements (int64 product), into a 2000-element
    output, and (0, 2**63) reached torch.empty."""
    buf = bytearray(CORPUS["bf16"])
    buf[7] = len(shape)
    struct.pack_into("<Q", buf, 16, numel)
    struct.pack_into("<8Q", buf, 32, *shape, *[0] * (8 - len(shape)))
    _fix_crc(buf)
    with pytest.raises(ValueError, match="does not hold"):
        zipccl.decompress(torch.tensor(list(buf), dtype=torch.uint8))
