"""A model's tables in one JSON file: a table per key (a layer's tensor), for software and RTL.

    {"format": "zipccl-table-set", "version": 1,
     "tables": {"<key>": {"dtype": "float8_e4m3fn", "table": <table file object>}, ...}}

Each ``table`` is exactly a golden/codebook.py table file's object (with its SHA-256), so
``Codebook.save`` of one entry is the single-table file that
``python -m zipccl.hw.generate --table`` takes; ``dtype`` (a golden.formats name) says which
symbols it codes: the FP8 byte or the exponent field.
Parsed as strictly as a table file: bounded size and count, exact and distinct keys, integers and
strings only; anything malformed is a TableError. Keys keep the order they were written in.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from zipccl.golden.codebook import MAX_NAME_CHARS, Codebook, TableError, parse_json, read_text
from zipccl.golden.formats import FORMATS, FloatFormat

SET_FORMAT = "zipccl-table-set"
SET_VERSION = 1
MAX_TABLES = 4096
MAX_KEY_CHARS = MAX_NAME_CHARS
MAX_SET_FILE_BYTES = 1 << 25  # 8 KiB per table at MAX_TABLES; a table takes ~4 KiB
_SET_KEYS = {"format", "version", "tables"}
_ENTRY_KEYS = {"dtype", "table"}


@dataclass(frozen=True)
class Entry:
    """One key's table and the format whose symbols it codes."""

    fmt: FloatFormat
    table: Codebook


def check_key(key: object) -> str:
    """A key is a non-empty string of at most MAX_KEY_CHARS characters."""
    if not isinstance(key, str):
        raise TypeError(f"a table key is a string, got {type(key).__name__}")
    if not 0 < len(key) <= MAX_KEY_CHARS:
        raise ValueError(f"a table key has 1..{MAX_KEY_CHARS} characters, got {len(key)}")
    return key


def dumps(entries: Mapping[str, Entry]) -> str:
    """The table set's JSON text; refuses what :func:`loads` would refuse."""
    if len(entries) > MAX_TABLES:
        raise TableError(f"a table set holds at most {MAX_TABLES} tables, got {len(entries)}")
    doc = {
        "format": SET_FORMAT,
        "version": SET_VERSION,
        "tables": {
            check_key(k): {"dtype": e.fmt.name, "table": e.table.to_doc()}
            for k, e in entries.items()
        },
    }
    text = json.dumps(doc, indent=1) + "\n"
    if len(text) > MAX_SET_FILE_BYTES:
        raise TableError(f"table set of {len(text)} characters exceeds {MAX_SET_FILE_BYTES}")
    return text


def loads(text: str) -> dict[str, Entry]:
    """Parse a table set strictly (TableError on anything malformed)."""
    doc = parse_json(text, MAX_SET_FILE_BYTES, "table set")
    doc = _exact(doc, _SET_KEYS, "table set")
    if doc["format"] != SET_FORMAT:
        raise TableError(f"not a {SET_FORMAT} file")
    if type(doc["version"]) is not int or doc["version"] != SET_VERSION:
        raise TableError(f"table set version {doc['version']!r} is not supported")
    tables = doc["tables"]
    if not isinstance(tables, dict) or len(tables) > MAX_TABLES:
        raise TableError(f"tables must be an object of at most {MAX_TABLES} keys")
    return {_key(k): _entry(k, v) for k, v in tables.items()}


def save(path: str | Path, entries: Mapping[str, Entry]) -> None:
    Path(path).write_text(dumps(entries))


def load(path: str | Path) -> dict[str, Entry]:
    """Read and parse a table set; a file over the size bound is refused unread."""
    return loads(read_text(path, MAX_SET_FILE_BYTES, "table set"))


def _exact(value: object, keys: set[str], what: str) -> dict:
    if not isinstance(value, dict) or value.keys() != keys:
        got = sorted(value) if isinstance(value, dict) else type(value).__name__
        raise TableError(f"{what} must be an object with exactly {sorted(keys)}, got {got}")
    return value


def _key(key: str) -> str:
    try:
        return check_key(key)
    except ValueError as exc:
        raise TableError(str(exc)) from None


def _entry(key: str, value: object) -> Entry:
    entry = _exact(value, _ENTRY_KEYS, f"table {key!r}")
    fmt = FORMATS.get(entry["dtype"]) if isinstance(entry["dtype"], str) else None
    if fmt is None:
        raise TableError(f"table {key!r}: dtype {entry['dtype']!r} is not one of {sorted(FORMATS)}")
    try:
        return Entry(fmt, Codebook.from_doc(entry["table"]))
    except TableError as exc:
        raise TableError(f"table {key!r}: {exc}") from None
