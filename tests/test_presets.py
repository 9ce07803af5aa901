"""Presets: checked-in QLC tables load, hash-verify, round-trip and match a rebuild."""

from __future__ import annotations

import json

import numpy as np
import pytest
from zipccl.golden import presets
from zipccl.golden.codebook import ALPHABET, Codebook, TableError
from zipccl.golden.formats import BF16, FP16, FP32
from zipccl.golden.streams import decode_serial, decode_split, encode_serial, encode_split
from zipccl.golden.theory import TensorStats, zipccl_table

ALL_BYTES = np.arange(ALPHABET, dtype=np.uint8)


@pytest.mark.parametrize("fmt", sorted(presets.QLC_FILES))
def test_checked_in_tables_load_and_verify(fmt):
    path = presets.TABLES_DIR / presets.QLC_FILES[fmt]
    doc = json.loads(path.read_text())
    book = Codebook.load(path)
    assert doc["sha256"] == book.sha256 and book.name == f"qlc-{fmt}-minilm"
    assert getattr(presets, f"qlc_{fmt}")() == book
    # the QLC paper's lengths: ranked payloads of 3/4/5 bits and the 8-bit escape last
    assert book.literal == 7 and set(book.widths[:7]) <= {3, 4, 5}
    assert sorted(set(book.code_lengths().tolist())) <= [6, 7, 8, 11]
    serial = encode_serial(ALL_BYTES, book)
    assert np.array_equal(decode_serial(serial, ALPHABET, book), ALL_BYTES)
    split = encode_split(ALL_BYTES, book, 64)
    assert np.array_equal(decode_split(split, ALPHABET, book, 64), ALL_BYTES)


def test_a_tampered_table_file_is_refused(tmp_path):
    doc = json.loads((presets.TABLES_DIR / presets.QLC_FILES["e4m3"]).read_text())
    ranks = doc["rank_to_symbol"]
    ranks[0], ranks[1] = ranks[1], ranks[0]  # still a valid table, but not the hashed one
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    with pytest.raises(TableError, match="hash"):
        Codebook.load(tmp_path / "bad.json")


def test_rebuild_reproduces_the_checked_in_tables(tmp_path):
    """Same layout, and the same expected length on the data to well under 0.01 bit (the capture
    is float32 CPU math, so a different CPU could reorder near-tied ranks)."""
    from zipccl.golden import data
    from zipccl.golden.baselines import histogram

    written = presets.rebuild(tmp_path)
    assert [p.name for p in written] == [presets.QLC_FILES[f] for f in presets.QLC_FILES]
    for fmt, file in presets.QLC_FILES.items():
        rebuilt, stored = Codebook.load(tmp_path / file), Codebook.load(presets.TABLES_DIR / file)
        assert rebuilt.widths == stored.widths and rebuilt.literal == stored.literal
        hist = histogram(data.concat(data.fp8_activations(fmt)))
        assert rebuilt.expected_bits(hist) == pytest.approx(stored.expected_bits(hist), abs=0.01)
        assert stored.expected_bits(hist) < 8.0  # it compresses the data it was built from


@pytest.mark.parametrize("fmt", [BF16, FP16, FP32])
def test_zipccl_exponent_is_the_theory_table(fmt):
    book = presets.zipccl_exponent(fmt, rms=1.0)
    assert book == zipccl_table(fmt, TensorStats(1.0, 0.0))
    # rms 1: m = floor(log2(1) - 0.72) = -1, the window is unbiased exponents [-5, 1]
    assert set(book.ranks) == {fmt.exp_bias + e for e in range(-5, 2)}
    assert book.ranks[0] == fmt.exp_bias - 1  # |x| in [0.5, 1) is the most probable octave


def test_zipccl_exponent_zero_fraction_ranks_zero_first():
    assert presets.zipccl_exponent(BF16, rms=0.01, zero_fraction=0.9).ranks[0] == 0


def test_preset_arguments_are_checked():
    with pytest.raises(ValueError, match="rms"):
        presets.zipccl_exponent(BF16, rms=0.0)
    with pytest.raises(ValueError, match="zero_fraction"):
        presets.zipccl_exponent(BF16, zero_fraction=1.5)
    with pytest.raises(ValueError, match="no QLC preset"):
        presets.build_qlc("e3m4")


def test_cli_lists_presets(capsys):
    assert presets.main([]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in presets.PRESETS)
