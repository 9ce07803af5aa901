"""zipccl._triton: golden's bytes, round trips and _torch's errors, on CPU under TRITON_INTERPRET=1.

The kernels always write the split sections, so the reference is golden's split-layout buffer
even where golden itself would fall back to the raw layout (``golden_split``). Run with
TRITON_INTERPRET=0 on a GPU machine, the same tests check the compiled kernels on CUDA.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from unittest import mock

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported: kernels run on CPU

import pytest

pytest.importorskip("triton", reason="the Triton backend needs triton (the zipccl[triton] extra)")

import numpy as np
import torch
import zipccl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from triton.runtime.interpreter import InterpretedFunction
from zipccl import _torch, _triton
from zipccl.golden import container
from zipccl.golden.codebook import Codebook
from zipccl.golden.formats import FORMATS, FloatFormat, get_format
from zipccl.golden.streams import num_blocks

from tests.strategies import QLC, ZIPCCL, codebooks

DTYPES = [torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn, torch.float8_e5m2]
UINT = {8: torch.uint8, 16: torch.int16, 32: torch.int32}
SENTINEL = 0xAB
ROOT = Path(__file__).resolve().parents[1]
CHECKS = ("prefix plane", "payload block offsets", "payload padding", "illegal", "raw bit plane")
INTERPRETED = isinstance(_triton._encode_blocks, InterpretedFunction)
DEVICE = torch.device("cpu" if INTERPRETED else "cuda")
if not INTERPRETED and not torch.cuda.is_available():
    pytest.skip("compiled Triton kernels need a CUDA GPU", allow_module_level=True)


def fmt_of(dtype: torch.dtype) -> FloatFormat:
    return get_format(str(dtype).removeprefix("torch."))


def bits_np(x: torch.Tensor) -> np.ndarray:
    fmt = fmt_of(x.dtype)
    return x.contiguous().cpu().view(UINT[fmt.bits]).numpy().view(fmt.uint)


def gaussian(n: int, dtype: torch.dtype, seed: int, scale: float = 3.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, generator=g) * scale).to(dtype).to(DEVICE)


def bit_patterns(dtype: torch.dtype) -> torch.Tensor:
    """Every bit pattern of an 8/16-bit format (2**16 random ones for FP32), shuffled."""
    bits = fmt_of(dtype).bits
    g = torch.Generator().manual_seed(1)
    if bits == 32:
        every = torch.randint(-(1 << 31), 1 << 31, (1 << 16,), generator=g, dtype=torch.int64)
    else:
        every = torch.arange(1 << bits, dtype=torch.int64)[torch.randperm(1 << bits, generator=g)]
        every = torch.where(every >= 1 << (bits - 1), every - (1 << bits), every)
    return every.to(UINT[bits]).view(dtype).to(DEVICE)


def golden_split(x: torch.Tensor, table: Codebook, block: int) -> bytes:
    """golden's split-layout buffer, even where golden would store the raw layout instead."""
    with mock.patch.object(container, "raw_size", lambda *_: math.inf):
        return container.encode(bits_np(x), fmt_of(x.dtype), table, block)


def encode(backend: ModuleType, x: torch.Tensor, table: Codebook, block: int) -> bytes:
    """A whole buffer: the backend's sections behind golden's header; checks nothing past the
    payload stream was written."""
    fmt = fmt_of(x.dtype)
    sec = container.Sections.of(fmt, x.numel(), block)
    out = torch.full((sec.payload + x.numel() + 8,), SENTINEL, dtype=torch.uint8, device=DEVICE)
    payload = backend.encode_into(x, fmt, table, block, out)
    end = sec.payload + payload
    assert bool((out[end:] == SENTINEL).all())
    head = container.Header(container.LAYOUT_SPLIT, fmt, tuple(x.shape), block, payload, table)
    return head.pack() + bytes(out[container.HEADER_BYTES : end].cpu().numpy())


def decode(backend: ModuleType, buf: bytes, dtype: torch.dtype) -> np.ndarray | str:
    """The decoded bit patterns, or the ValueError's message."""
    head = container.Header.unpack(buf[: container.HEADER_BYTES])
    assert head.table is not None
    data = torch.frombuffer(bytearray(buf), dtype=torch.uint8).to(DEVICE)
    out = torch.empty(head.shape, dtype=dtype, device=DEVICE)
    try:
        backend.decode_into(data, head.fmt, head.table, head.block, head.payload_bytes, out)
    except ValueError as exc:
        return str(exc)
    return bits_np(out)


def check(x: torch.Tensor, table: Codebook, block: int) -> bytes:
    """Triton bytes == _torch bytes == golden bytes; Triton and golden decode them exactly."""
    ours = encode(_triton, x, table, block)
    assert ours == encode(_torch, x, table, block)
    assert ours == golden_split(x, table, block)
    back = decode(_triton, ours, x.dtype)
    assert isinstance(back, np.ndarray) and np.array_equal(back, bits_np(x))
    assert np.array_equal(container.decode(ours)[1], bits_np(x))
    return ours


@pytest.mark.parametrize("block", [64, 256, 4096])
@pytest.mark.parametrize("n", [0, 1, 7, 8, 63, 64, 1000, 2500])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_sizes_and_blocks(dtype: torch.dtype, n: int, block: int) -> None:
    x = gaussian(n, dtype, seed=n + block)
    check(x, zipccl.histogram_table(x.cpu()), block)


@pytest.mark.parametrize("table", [QLC, ZIPCCL], ids=["qlc", "zipccl"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_bit_pattern(dtype: torch.dtype, table: Codebook) -> None:
    """NaN payloads, infinities, -0 and subnormals: every symbol and raw value of the format."""
    check(bit_patterns(dtype), table, 4096)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float8_e5m2], ids=str)
def test_largest_block(dtype: torch.dtype) -> None:
    x = gaussian(_triton.MAX_BLOCK + 999, dtype, seed=6)
    check(x, zipccl.histogram_table(x.cpu()), _triton.MAX_BLOCK)


def test_shaped_input() -> None:
    x = gaussian(5 * 7 * 9, torch.float32, seed=2).view(5, 7, 9)
    head = container.Header.unpack(check(x, QLC, 64)[: container.HEADER_BYTES])
    assert head.shape == (5, 7, 9)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    table=codebooks(),
    dtype=st.sampled_from(DTYPES),
    n=st.integers(0, 1500),
    block=st.sampled_from([64, 128, 1024]),
    seed=st.integers(0, 2**31 - 1),
    scale=st.sampled_from([1e-3, 0.5, 40.0]),
)
def test_any_table(
    table: Codebook, dtype: torch.dtype, n: int, block: int, seed: int, scale: float
) -> None:
    """Any complete table: widths 0..8, with or without a literal region, partial ranks."""
    check(gaussian(n, dtype, seed, scale), table, block)


def agree(buf: bytes, dtype: torch.dtype) -> str | None:
    """_triton decodes ``buf`` as _torch does: the same ValueError (its message is returned) or
    the same bits."""
    ours, want = decode(_triton, buf, dtype), decode(_torch, buf, dtype)
    if isinstance(want, str):
        assert ours == want
        return want
    assert isinstance(ours, np.ndarray) and np.array_equal(ours, want)
    return None


def corrupt_cases(
    buf: bytes, fmt: FloatFormat, n: int, block: int, rng: np.random.Generator
) -> Iterator[bytes]:
    """Buffers with one byte changed where each kind of check looks (the last bytes of planes
    and of blocks hold the padding bits), plus a wrong payload size."""
    sec = container.Sections.of(fmt, n, block)
    last = (n + 7) // 8 - 1
    spots = [at + last for at in sec.prefix + sec.raw_bits]
    ends = np.frombuffer(buf, "<u8", num_blocks(n, block), sec.offsets)[1:]
    spots += [sec.payload + int(end) - 1 for end in ends] + [len(buf) - 1]
    spots += list(sec.offsets + rng.integers(0, 8 * num_blocks(n, block), 4))
    spots += list(rng.integers(sec.payload, len(buf), 40))
    for at in spots:
        bad = bytearray(buf)
        bad[at] ^= int(rng.integers(1, 256))
        yield bytes(bad)
    head = container.Header.unpack(buf[: container.HEADER_BYTES])
    longer = container.Header(
        head.layout, fmt, head.shape, block, head.payload_bytes + 1, head.table
    )
    yield longer.pack() + buf[container.HEADER_BYTES :] + b"\0"


def test_corruption_matches_torch() -> None:
    """Corrupt buffers: the same ValueError as _torch (message and precedence), else the same
    decoded bits; every kind of check is reached."""
    table = Codebook((8, 1, 2, 3, 0, 0, 2, 1), 0, (15, 14, 16, 13, 17, 12, 18, 11, 19, 10, 9))
    fmt, n, block = fmt_of(torch.float16), 1003, 256
    buf = check(gaussian(n, torch.float16, seed=3, scale=0.01), table, block)
    seen = set()
    for bad in corrupt_cases(buf, fmt, n, block, np.random.default_rng(4)):
        why = agree(bad, torch.float16)
        if why is not None:
            seen.add(next(kind for kind in CHECKS if why.startswith(kind)))
    assert seen == set(CHECKS)


@settings(max_examples=20, deadline=None)
@given(
    table=codebooks(),
    dtype=st.sampled_from(DTYPES),
    seed=st.integers(0, 2**31 - 1),
    flips=st.integers(1, 3),
)
def test_random_corruption_matches_torch(
    table: Codebook, dtype: torch.dtype, seed: int, flips: int
) -> None:
    """Any table and format, bytes flipped anywhere past the header: same error or same bits."""
    buf = bytearray(encode(_triton, gaussian(700, dtype, seed, scale=0.3), table, 128))
    rng = np.random.default_rng(seed)
    for at in rng.integers(container.HEADER_BYTES, len(buf), flips):
        buf[int(at)] ^= int(rng.integers(1, 256))
    agree(bytes(buf), dtype)


@pytest.mark.parametrize("backend", [_torch, _triton], ids=["torch", "triton"])
def test_empty_tensor_with_a_payload_is_corrupt(backend: ModuleType) -> None:
    fmt = fmt_of(torch.bfloat16)
    buf = torch.zeros(
        container.Sections.of(fmt, 0, 64).payload + 1, dtype=torch.uint8, device=DEVICE
    )
    empty = torch.empty(0, dtype=torch.bfloat16, device=DEVICE)
    with pytest.raises(ValueError, match=r"^payload block offsets disagree"):
        backend.decode_into(buf, fmt, ZIPCCL, 64, 1, empty)


@pytest.mark.skipif(not INTERPRETED, reason="the other tests run the compiled kernels")
def test_kernels_compile_for_sm90(tmp_path: Path) -> None:
    """What the interpreter cannot check: the compiler accepts every kernel (no GPU needed)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path)  # compile, don't hit a cache
    paths = [str(ROOT), str(ROOT / "sw"), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    done = subprocess.run(
        [sys.executable, "-m", "tests._triton_compile", str(container.DEFAULT_BLOCK)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("compiled") == len(FORMATS)


def test_bad_arguments() -> None:
    fmt, x = fmt_of(torch.bfloat16), gaussian(100, torch.bfloat16, seed=5)
    out = torch.zeros(container.raw_size(fmt, 100), dtype=torch.uint8, device=DEVICE)
    with pytest.raises(ValueError, match="power-of-two blocks"):
        _triton.encode_into(x, fmt, ZIPCCL, 32768, out)
    with pytest.raises(ValueError, match="at least"):
        _triton.encode_into(x, fmt, ZIPCCL, 64, out[:600])
    with pytest.raises(ValueError, match="power-of-two blocks"):
        _triton.decode_into(out, fmt, ZIPCCL, 100, 0, torch.empty_like(x))


def test_public_api_selects_triton(monkeypatch: pytest.MonkeyPatch) -> None:
    """ZIPCCL_BACKEND=triton routes zipccl.compress/decompress through these kernels: the same
    buffer as the default backend, and a bit-exact round trip."""
    x = gaussian(3000, torch.bfloat16, seed=5).to(DEVICE)
    want = zipccl.compress(x, block=256)
    monkeypatch.setenv("ZIPCCL_BACKEND", "triton")
    from zipccl import codec

    assert codec._backend(x.device, 256) is _triton
    c = zipccl.compress(x, want.table, block=256)
    assert c.layout == "split" and torch.equal(c.buffer.cpu(), want.buffer.cpu())
    assert torch.equal(zipccl.decompress(c).view(torch.int16), x.view(torch.int16))


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2], ids=str)
def test_fp8_default_table(dtype: torch.dtype) -> None:
    """The CPU default for FP8 (the staircase table of the sample, w=0 heads and a w=8 tail on
    zero-heavy data) gives golden's bytes here too."""
    x = gaussian(20000, dtype, seed=9, scale=torch.finfo(dtype).max / 5)
    x[::3] = 0
    check(x, zipccl.default_table(x.cpu()), 4096)
