"""``compress(..., checksum=True)`` on the host paths: golden's bytes, and corruption that the
code alone cannot see is rejected by decompress."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import zipccl
from zipccl.golden import container
from zipccl.golden.formats import get_format

from tests.test_codec import DTYPES, bits_np, fitted, gaussian, random_bits

SEED = 20261202


def _golden(x: torch.Tensor, c: zipccl.Compressed) -> bytes:
    fmt = get_format(str(x.dtype).removeprefix("torch."))
    if c.layout == "raw":
        return container.encode_raw(bits_np(x), fmt, c.block, checksum=True)
    assert c.table is not None
    return container.encode(bits_np(x), fmt, c.table, c.block, checksum=True)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [0, 1, 7, 4097, 30001])
def test_checksummed_bytes_are_golden(dtype: torch.dtype, n: int) -> None:
    x = gaussian(n, dtype, seed=SEED + n, scale=3.0)
    c = zipccl.compress(x, fitted(dtype), checksum=True)
    assert c.checksummed and not zipccl.compress(x, fitted(dtype)).checksummed
    assert bytes(c.buffer.numpy()) == _golden(x, c)
    assert torch.equal(zipccl.decompress(c).view(torch.uint8), x.view(torch.uint8))
    got = zipccl.Compressed.from_buffer(c.buffer.clone())
    assert got.checksummed and torch.equal(
        zipccl.decompress(got).view(torch.uint8), x.view(torch.uint8)
    )


def test_raw_fallback_carries_the_checksum() -> None:
    x = random_bits(5000, torch.bfloat16, seed=SEED)
    c = zipccl.compress(x, checksum=True)
    assert c.layout == "raw" and bytes(c.buffer.numpy()) == _golden(x, c)


def test_compress_into_takes_the_checksum() -> None:
    x = gaussian(10_000, torch.float32, seed=SEED)
    out = torch.empty(zipccl.max_compressed_bytes(x.dtype, x.numel()), dtype=torch.uint8)
    c = zipccl.compress_into(x, out, checksum=True)
    assert c.checksummed and bytes(c.buffer.numpy()) == _golden(x, c)


@pytest.mark.parametrize(
    ("dtype", "table"), [(torch.bfloat16, None), (torch.float8_e4m3fn, "histogram")]
)
def test_flips_the_code_cannot_see_are_rejected(dtype: torch.dtype, table: str | None) -> None:
    """Random single-bit flips of the body: without the checksum some decode silently to other
    values; with it every one raises ValueError (seeded; the exhaustive sweep is golden's)."""
    x = gaussian(20_000, dtype, seed=SEED, scale=4.0)
    plain, checked = zipccl.compress(x, table), zipccl.compress(x, table, checksum=True)
    assert checked.layout == "split"
    rng = np.random.default_rng(SEED)
    silent = []
    for at in rng.integers(container.HEADER_BYTES, plain.nbytes, 300):
        bit = 1 << int(rng.integers(0, 8))
        for c, record in ((plain, True), (checked, False)):
            bad = c.buffer.clone()
            bad[int(at)] ^= bit
            try:
                zipccl.decompress(bad)
            except ValueError:
                continue
            assert record, f"flip of bit {bit} at byte {at} passed the checksum (seed {SEED})"
            silent.append(int(at))
    assert silent, "without a checksum some flips pass silently (else this test proves nothing)"


def test_a_checksum_mismatch_names_itself() -> None:
    x = gaussian(5000, torch.bfloat16, seed=SEED)
    c = zipccl.compress(x, checksum=True)
    sec = container.Sections.of(get_format("bfloat16"), x.numel(), c.block)
    bad = c.buffer.clone()
    bad[sec.raw_bytes[0] + 3] ^= 0x01  # a mantissa bit: a legal code either way
    with pytest.raises(ValueError, match="values checksum mismatch"):
        zipccl.decompress(bad)
    with pytest.raises(ValueError, match="values checksum mismatch"):
        container.decode(bytes(bad.numpy()))
