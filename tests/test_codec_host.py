"""The CUDA backend's host side on CPU: the table image, the section layout, the nvcc build."""

from __future__ import annotations

import ctypes
import shutil

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from zipccl import _cuda
from zipccl.golden import container
from zipccl.golden.codebook import Codebook
from zipccl.golden.formats import FORMATS, get_format

from tests.strategies import codebooks


@settings(max_examples=60, deadline=None)
@given(book=codebooks())
def test_table_words_describe_the_table(book: Codebook) -> None:
    words = np.array(book.gpu_words(), dtype=np.int64) & 0xFFFFFFFF
    prefix, payload, length = book.encoder_lut()
    assert np.array_equal(words[:256] & 0xFF, payload)
    assert np.array_equal((words[:256] >> 8) & 7, prefix)
    assert np.array_equal(words[:256] >> 12, length.astype(int) - 3)
    width, base, literal = book.region_table()
    assert np.array_equal(words[256:264] & 15, width)
    assert np.array_equal((words[256:264] >> 4) & 0x3FF, base)
    assert np.array_equal(words[256:264] >> 15, literal)
    assert np.array_equal(words[264:520], book.rank_lut()) and words[520] == book.num_ranked


@settings(max_examples=60, deadline=None)
@given(literal=st.integers(0, 7), n=st.integers(0, 7), seed=st.integers(0, 2**31))
def test_fast_words_of_byte_escape_tables(literal: int, n: int, seed: int) -> None:
    """The fast decoder's words: literal prefix, prefix -> symbol bytes, illegal-prefix bytes."""
    widths = [0] * 8
    widths[literal] = 8
    ranks = tuple(int(s) for s in np.random.default_rng(seed).permutation(256)[:n])
    book = Codebook(tuple(widths), literal, ranks)
    assert book.byte_escape
    f = [w & 0xFFFFFFFF for w in book.gpu_words()[521:]]
    assert len(f) == 5 and f[0] == literal
    sym = (f[1] | f[2] << 32).to_bytes(8, "little")
    bad = (f[3] | f[4] << 32).to_bytes(8, "little")
    prefix, _, _ = book.encoder_lut()
    for s in ranks:  # every ranked symbol's prefix maps back to it
        assert sym[prefix[s]] == s and not bad[prefix[s]]
    legal = {int(prefix[s]) for s in ranks} | {literal}
    assert all(bad[p] == (0 if p in legal else 0xFF) for p in range(8))


def test_mixed_width_tables_are_not_byte_escape() -> None:
    assert not Codebook((8, 3, 3, 3, 4, 4, 4, 5), 0, tuple(range(100))).byte_escape
    assert not Codebook((8,) * 8, None, tuple(range(256))).byte_escape


@pytest.mark.parametrize("name", sorted(FORMATS))
@pytest.mark.parametrize("n", [1, 7, 4096, 100003])
def test_layout_gaps_are_golden_zero_padding(name: str, n: int) -> None:
    """Sections plus the gaps the encode kernel zeroes tile header..payload exactly."""
    fmt = get_format(name)
    lay = _cuda._layout(fmt, n, 1024, 10**9, 0, 0)
    sec = container.Sections.of(fmt, n, 1024)
    plane = (n + 7) // 8
    spans = [(at, at + n) for at in sec.raw_bytes]
    spans += [(at, at + plane) for at in sec.raw_bits + sec.prefix]
    spans += [(sec.offsets, sec.offsets + 8 * lay.nb)]
    spans += [(lay.gap_lo[i], lay.gap_hi[i]) for i in range(lay.ngaps)]
    covered = np.zeros(sec.payload, bool)
    for lo, hi in spans:
        assert not covered[lo:hi].any()
        covered[lo:hi] = True
    assert covered[container.HEADER_BYTES :].all()
    assert lay.payload_at == sec.payload


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_cuda_source_builds_and_exports(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """codec.cu compiles and its launchers are exported (no GPU needed to build or load)."""
    monkeypatch.setenv("ZIPCCL_CACHE_DIR", str(tmp_path))
    lib = _cuda.build("90")
    for name in ("zipccl_encode", "zipccl_decode", "zipccl_error_string", "zipccl_work_bytes"):
        assert hasattr(lib, name)
    lib.zipccl_work_bytes.restype = ctypes.c_longlong
    nb, block = 1000, 4096  # a scratch slot of `block` bytes per block, plus counts and sums
    assert lib.zipccl_work_bytes(ctypes.c_longlong(nb), ctypes.c_longlong(block)) > nb * (block + 4)
    (built,) = tmp_path.glob("*.so")
    stamp = built.stat().st_mtime_ns
    assert hasattr(_cuda.build("90"), "zipccl_encode")  # cached (verified again), not rebuilt
    assert list(tmp_path.glob("*.so")) == [built] and built.stat().st_mtime_ns == stamp


def test_backend_choice_on_cpu() -> None:
    from zipccl import codec

    assert codec._backend(torch.device("cpu"), 4096).__name__ == "zipccl._torch"
