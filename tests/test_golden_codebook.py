"""The table format: validation, lookup tables, canonical bytes, JSON files, RTL images."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
from hypothesis import given, settings
from zipccl.golden.codebook import (
    ALPHABET,
    ENC_PREFIX_SHIFT,
    ENC_WIDTH_SHIFT,
    MAX_TABLE_FILE_BYTES,
    REGION_LITERAL_SHIFT,
    REGION_WIDTH_SHIFT,
    TABLE_BYTES,
    Codebook,
    TableError,
)
from zipccl.golden.streams import decode_serial, encode_serial

from tests.strategies import QLC, ZIPCCL, codebooks


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"widths": (8,) * 7, "literal": 0, "ranks": ()}, "8 regions"),
        ({"widths": (9,) + (0,) * 7, "literal": None, "ranks": ()}, "width 9"),
        ({"widths": (-1,) + (8,) * 7, "literal": None, "ranks": ()}, "width -1"),
        ({"widths": (4,) + (0,) * 7, "literal": 0, "ranks": ()}, "must have width 8"),
        ({"widths": (8,) * 8, "literal": 8, "ranks": ()}, "literal region 8"),
        ({"widths": (8,) + (0,) * 7, "literal": 0, "ranks": (3, 3)}, "more than once"),
        ({"widths": (8,) + (0,) * 7, "literal": 0, "ranks": (256,)}, "outside 0..255"),
        ({"widths": (8,) + (0,) * 7, "literal": 0, "ranks": tuple(range(8))}, "hold only 7"),
        ({"widths": (3,) * 8, "literal": None, "ranks": tuple(range(64))}, "incomplete"),
    ],
)
def test_invalid_tables_are_rejected_with_the_reason(kwargs: dict, message: str) -> None:
    with pytest.raises(TableError, match=message):
        Codebook(**kwargs)


def test_table_error_is_a_value_error() -> None:
    assert issubclass(TableError, ValueError)


def test_qlc_layout_bases_and_lengths() -> None:
    assert QLC.bases == (0, 8, 16, 24, 40, 56, 72, 104)
    assert QLC.capacity == 360
    lengths = QLC.code_lengths()
    assert list(lengths[:8]) == [6] * 8  # ranks 0..23 take the 6-bit codes
    assert lengths[23] == 6 and lengths[24] == 7 and lengths[71] == 7 and lengths[72] == 8
    assert lengths[104] == 11 and lengths[255] == 11


def test_zipccl_encoder_lut_escapes_everything_unranked() -> None:
    prefix, payload, length = ZIPCCL.encoder_lut()
    for rank, sym in enumerate(ZIPCCL.ranks):
        assert (prefix[sym], payload[sym], length[sym]) == (rank + 1, 0, 3)
    others = np.setdiff1d(np.arange(ALPHABET), ZIPCCL.ranks)
    assert (prefix[others] == 0).all() and (length[others] == 11).all()
    assert (payload[others] == others).all()


def test_region_table_saturates_bases_past_the_rank_lut() -> None:
    book = Codebook((8, 8, 8, 8, 0, 0, 0, 0), None, tuple(range(ALPHABET)))
    width, base, literal = book.region_table()
    assert list(base) == [0, 256, 256, 256, 256, 256, 256, 256]
    assert not literal.any() and list(width) == [8, 8, 8, 8, 0, 0, 0, 0]


@settings(max_examples=60, deadline=None)
@given(codebooks())
def test_every_symbol_round_trips_through_its_codeword(book: Codebook) -> None:
    symbols = np.arange(ALPHABET, dtype=np.uint8)
    assert np.array_equal(decode_serial(encode_serial(symbols, book), ALPHABET, book), symbols)


@settings(max_examples=60, deadline=None)
@given(codebooks())
def test_codewords_are_unique(book: Codebook) -> None:
    prefix, payload, _ = book.encoder_lut()
    pairs = set(zip(prefix.tolist(), payload.tolist(), strict=True))
    assert len(pairs) == ALPHABET


@settings(max_examples=60, deadline=None)
@given(codebooks())
def test_canonical_bytes_and_json_round_trip(book: Codebook) -> None:
    raw = book.to_bytes()
    assert len(raw) == TABLE_BYTES
    assert Codebook.from_bytes(raw) == book
    again = Codebook.from_json(book.to_json())
    assert again == book and again.sha256 == book.sha256


def test_table_file_round_trip(tmp_path) -> None:
    path = tmp_path / "qlc.json"
    QLC.save(path)
    loaded = Codebook.load(path)
    assert loaded == QLC and loaded.name == "qlc"


def test_hash_distinguishes_tables_and_ignores_names() -> None:
    renamed = Codebook(QLC.widths, QLC.literal, QLC.ranks, name="other")
    assert renamed.sha256 == QLC.sha256
    swapped = Codebook(QLC.widths, QLC.literal, (1, 0, *range(2, ALPHABET)))
    assert swapped.sha256 != QLC.sha256 and swapped.hash64 != QLC.hash64


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d.update(sha256="0" * 64), "does not match"),
        (lambda d: d.update(format="other"), "not a zipccl-region-code"),
        (lambda d: d.update(version=99), "version 99"),
        (lambda d: d["regions"].pop(), "prefixes 0..7"),
        (lambda d: d["regions"][1].update(kind="weird"), "unknown region kind"),
        (lambda d: d.pop("rank_to_symbol"), "missing or mistypes"),
        (lambda d: d["rank_to_symbol"].append(126), "more than once"),
    ],
)
def test_corrupt_table_files_are_rejected(edit, message: str) -> None:
    doc = json.loads(ZIPCCL.to_json())
    edit(doc)
    with pytest.raises(TableError, match=message):
        Codebook.from_json(json.dumps(doc))


def _with_token(token: str) -> str:
    """ZIPCCL's table file with its first rank replaced by the raw JSON ``token``."""
    doc = json.loads(ZIPCCL.to_json())
    doc["rank_to_symbol"][0] = "@@"
    return json.dumps(doc).replace('"@@"', token)


@pytest.mark.parametrize(
    "token",
    [
        "Infinity",
        "-Infinity",
        "NaN",
        "1e400",
        "126.0",
        "126.9",
        '"126"',
        '"a"',
        "true",
        "null",
        "[126]",
        '{"126": 1}',
        "1" * 5000,
        "[" * 20000 + "]" * 20000,
    ],
    ids=lambda t: t[:12],
)
def test_malformed_rank_entries_raise_table_error(token: str) -> None:
    """Before: OverflowError, RecursionError, bare ValueError, or silently int()-converted."""
    with pytest.raises(TableError):
        Codebook.from_json(_with_token(token))


def _set_region_field(key: str, value: object):
    return lambda d: d["regions"][1].update({key: value})


@pytest.mark.parametrize(
    "edit",
    [
        _set_region_field("width", 0.0),
        _set_region_field("width", "0"),
        _set_region_field("width", False),
        _set_region_field("prefix", 1.0),
        _set_region_field("extra", 1),
        lambda d: d.update(version=True),
        lambda d: d.update(version=1.0),
        lambda d: d.update(name={"a": 1}),
        lambda d: d.update(name="x" * 10_000),
        lambda d: d.update(comment="unknown keys are refused"),
        lambda d: d.update(rank_to_symbol="~}|{zyx"),
        lambda d: d.update(rank_to_symbol={"126": 0}),
        lambda d: d.update(regions={"0": d["regions"][0]}),
        lambda d: d["regions"].__setitem__(1, [1, 0, "ranked"]),
        lambda d: d["regions"].append(d["regions"][0]),
        lambda d: d.update(sha256=ZIPCCL.sha256.upper()),
    ],
)
def test_mistyped_table_file_fields_raise_table_error(edit) -> None:
    """Every edit keeps the content's hash, so before strict typing most were accepted."""
    doc = json.loads(ZIPCCL.to_json())
    edit(doc)
    with pytest.raises(TableError):
        Codebook.from_json(json.dumps(doc))


@pytest.mark.parametrize("document", ["[]", '"zipccl"', "7", "null", b"{}"], ids=repr)
def test_table_file_must_be_an_object_in_text(document: str | bytes) -> None:
    with pytest.raises(TableError):
        Codebook.from_json(document)  # type: ignore[arg-type]


def test_table_file_size_is_bounded_before_parsing(tmp_path) -> None:
    huge = _with_token(", ".join(["126"] * 40_000))
    assert len(huge) > MAX_TABLE_FILE_BYTES
    with pytest.raises(TableError, match="exceeds"):
        Codebook.from_json(huge)
    (tmp_path / "big.json").write_bytes(b" " * (MAX_TABLE_FILE_BYTES + 1))
    with pytest.raises(TableError, match="exceeds"):
        Codebook.load(tmp_path / "big.json")
    (tmp_path / "latin.json").write_bytes(b"\xff{}")
    with pytest.raises(TableError, match="UTF-8"):
        Codebook.load(tmp_path / "latin.json")


def test_long_rank_tables_are_rejected_in_linear_time() -> None:
    """40,000 ranks took 19 s in the quadratic duplicate check; now the length is checked first,
    and the duplicate check itself is linear (a full 256-symbol table of repeats)."""
    start = time.perf_counter()
    with pytest.raises(TableError, match="more than 256"):
        Codebook(QLC.widths, None, tuple(range(ALPHABET)) * 157)
    with pytest.raises(TableError, match="more than once"):
        Codebook(QLC.widths, None, (0,) * ALPHABET)
    assert time.perf_counter() - start < 1.0


@pytest.mark.parametrize(
    "kwargs",
    [
        {"widths": (8.0,) + (0,) * 7, "literal": 0, "ranks": ()},
        {"widths": (8,) + (0,) * 7, "literal": 0.0, "ranks": ()},
        {"widths": (8,) + (0,) * 7, "literal": 0, "ranks": (126.5,)},
        {"widths": (8,) + (0,) * 7, "literal": 0, "ranks": ("7",)},
        {"widths": "80000000", "literal": 0, "ranks": ()},
        {"widths": (8,) + (0,) * 7, "literal": 0, "ranks": 7},
    ],
)
def test_constructor_refuses_non_integers(kwargs: dict) -> None:
    with pytest.raises(TableError, match="integer"):
        Codebook(**kwargs)


def test_constructor_takes_numpy_integers() -> None:
    book = Codebook(np.array(ZIPCCL.widths), np.int64(0), np.array(ZIPCCL.ranks, np.uint8))
    assert book == ZIPCCL and all(type(v) is int for v in book.widths + book.ranks)


def test_non_json_table_file_is_rejected() -> None:
    with pytest.raises(TableError, match="not JSON"):
        Codebook.from_json("{")


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ((0, 0x48), "reserved bits"),
        ((8, 0x05, 0x01), "exceeds 256"),
        ((TABLE_BYTES - 1, 1), "padding is not zero"),
    ],
)
def test_corrupt_canonical_bytes_are_rejected(patch: tuple[int, ...], message: str) -> None:
    raw = bytearray(ZIPCCL.to_bytes())
    at, *values = patch
    raw[at : at + len(values)] = bytes(values)
    with pytest.raises(TableError, match=message):
        Codebook.from_bytes(bytes(raw))


def test_two_literal_regions_in_bytes_are_rejected() -> None:
    raw = bytearray(ZIPCCL.to_bytes())
    raw[1] = 0x88
    with pytest.raises(TableError, match="more than one literal"):
        Codebook.from_bytes(bytes(raw))


def test_memh_images_follow_the_documented_word_layouts(tmp_path) -> None:
    paths = ZIPCCL.write_memh(tmp_path, "zipccl")
    enc = [int(line, 16) for line in paths["enc"].read_text().split()]
    region = [int(line, 16) for line in paths["region"].read_text().split()]
    rank = [int(line, 16) for line in paths["rank"].read_text().split()]
    assert len(enc) == ALPHABET and len(region) == 8 and len(rank) == ALPHABET
    assert paths["count"].read_text().split() == ["007"]
    sym = ZIPCCL.ranks[2]
    assert enc[sym] == (0 << ENC_WIDTH_SHIFT) | (3 << ENC_PREFIX_SHIFT)
    assert enc[5] == (8 << ENC_WIDTH_SHIFT) | (0 << ENC_PREFIX_SHIFT) | 5
    assert region[0] == (1 << REGION_LITERAL_SHIFT) | (8 << REGION_WIDTH_SHIFT)
    assert region[3] == 2  # ranked, width 0, base 2
    assert rank[:7] == list(ZIPCCL.ranks) and not any(rank[7:])


def test_expected_bits_weights_code_lengths() -> None:
    hist = np.zeros(ALPHABET)
    hist[ZIPCCL.ranks[0]] = 3
    hist[0] = 1
    assert ZIPCCL.expected_bits(hist) == pytest.approx((3 * 3 + 11) / 4)
    assert ZIPCCL.expected_bits(np.zeros(ALPHABET)) == 0.0
