"""The region code: the one table format shared by golden/, hw/ and sw/.

A codeword is a 3-bit prefix ``p`` (one of 8 regions) followed by ``w_p`` payload bits, both MSB
first. A *ranked* region maps its payload to ``rank_to_symbol[base_p + payload]``; the single
optional *literal* region (``w = 8``) carries the symbol itself (the escape). Everything about the
format -- validation, the encoder/decoder lookup tables, the canonical binary form and its hash,
the JSON table file, the ``$readmemh`` images for the RTL and the GPU kernels' table image -- is
defined here and nowhere else.
"""

from __future__ import annotations

import hashlib
import json
import operator
import os
import re
import stat
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import SupportsIndex

import numpy as np

NUM_REGIONS = 8
PREFIX_BITS = 3
MAX_WIDTH = 8
ALPHABET = 256
MAX_CODE_LENGTH = PREFIX_BITS + MAX_WIDTH

TABLE_FILE_FORMAT = "zipccl-region-code"
TABLE_FILE_VERSION = 1
# A table file is a few KiB (to_json of 256 ranks is ~3.5 KiB); anything far larger is refused
# before it is parsed, so a hostile file costs bounded time and memory.
MAX_TABLE_FILE_BYTES = 1 << 16
MAX_NAME_CHARS = 256
_FILE_KEYS = {"format", "version", "name", "regions", "rank_to_symbol", "sha256"}
_REGION_KEYS = {"prefix", "width", "kind"}
_SHA256 = re.compile(r"[0-9a-f]{64}")

# Canonical binary form (also embedded verbatim in every compressed buffer's header):
#   bytes 0..7    region descriptors: bits 0-3 width, bit 7 literal flag
#   bytes 8..9    number of ranked symbols n (uint16, little endian)
#   bytes 10..265 rank_to_symbol, zero padded to 256 entries
TABLE_BYTES = NUM_REGIONS + 2 + ALPHABET
_LITERAL_FLAG = 0x80
_WIDTH_MASK = 0x0F

# $readmemh word layouts for the RTL (hw/ builds its memories from these constants).
#   encoder LUT, 256 words:  {width[3:0], prefix[2:0], payload[7:0]}              = 15 bits
#   region table, 8 words:   {literal, width[3:0], base[8:0]}  (base saturates at 256) = 14 bits
#   rank LUT, 256 words:     {symbol[7:0]}; the rank count n is a separate 9-bit register
ENC_PAYLOAD_BITS = 8
ENC_PREFIX_SHIFT = ENC_PAYLOAD_BITS
ENC_WIDTH_SHIFT = ENC_PREFIX_SHIFT + PREFIX_BITS
ENC_WORD_BITS = ENC_WIDTH_SHIFT + 4
REGION_BASE_BITS = 9
REGION_WIDTH_SHIFT = REGION_BASE_BITS
REGION_LITERAL_SHIFT = REGION_WIDTH_SHIFT + 4
REGION_WORD_BITS = REGION_LITERAL_SHIFT + 1
RANK_COUNT_BITS = 9

# The GPU's table image: int32 words that sw/zipccl/csrc/ reads (table.cuh builds the same image on
# the device; tests/test_cuda_constants.py checks its constants against these).
#   [0, 256)    encoder, by symbol:  payload | prefix << 8 | width << 12
#   [256, 264)  regions, by prefix:  width | base << 4 | literal << 15  (base saturates at 256)
#   [264, 520)  rank -> symbol;  [520] the rank count
#   [521, 526)  byte-escape tables only, else 0: the literal prefix, prefix -> symbol bytes (two
#               words), prefix -> 0xFF where the prefix holds no symbol (two words)
GPU_ENC_PREFIX_SHIFT = 8
GPU_ENC_WIDTH_SHIFT = 12
GPU_REGION_BASE_SHIFT = 4
GPU_REGION_LITERAL_SHIFT = 15
GPU_REGION_AT = ALPHABET
GPU_RANK_AT = GPU_REGION_AT + NUM_REGIONS
GPU_COUNT_AT = GPU_RANK_AT + ALPHABET
GPU_FAST_AT = GPU_COUNT_AT + 1
GPU_FAST_WORDS = 5
GPU_TABLE_WORDS = GPU_FAST_AT + GPU_FAST_WORDS


class TableError(ValueError):
    """A table that is not a valid, complete region code."""


@dataclass(frozen=True)
class Codebook:
    """A complete region code over the 8-bit alphabet.

    ``widths[p]`` is region p's payload width; ``literal`` is the index of the escape region (or
    None); ``ranks`` is rank_to_symbol, most probable first by convention. Ranked regions take
    consecutive ranks in prefix order, so region p starts at ``base_p = sum(2**w)`` over the ranked
    regions before it.
    """

    widths: tuple[int, ...]
    literal: int | None
    ranks: tuple[int, ...]
    name: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "widths", _int_tuple(self.widths, "widths", NUM_REGIONS))
        object.__setattr__(self, "ranks", _int_tuple(self.ranks, "ranks", ALPHABET))
        if self.literal is not None:
            object.__setattr__(self, "literal", _int(self.literal, "literal region"))
        self._validate()

    def _validate(self) -> None:
        if len(self.widths) != NUM_REGIONS:
            raise TableError(f"a table has {NUM_REGIONS} regions, got {len(self.widths)} widths")
        if len(self.ranks) > ALPHABET:
            raise TableError(f"rank table has {len(self.ranks)} entries, more than {ALPHABET}")
        for p, w in enumerate(self.widths):
            if not 0 <= w <= MAX_WIDTH:
                raise TableError(f"region {p} width {w} is outside 0..{MAX_WIDTH}")
        if self.literal is not None:
            if not 0 <= self.literal < NUM_REGIONS:
                raise TableError(f"literal region {self.literal} is outside 0..{NUM_REGIONS - 1}")
            if self.widths[self.literal] != MAX_WIDTH:
                raise TableError(
                    f"literal region {self.literal} must have width {MAX_WIDTH}, "
                    f"got {self.widths[self.literal]}"
                )
        bad = [s for s in self.ranks if not 0 <= s < ALPHABET]
        if bad:
            raise TableError(f"rank table holds symbols outside 0..255: {bad[:5]}")
        if len(set(self.ranks)) != len(self.ranks):
            dup = sorted(s for s, k in Counter(self.ranks).items() if k > 1)
            raise TableError(f"rank table lists symbols more than once: {dup[:5]}")
        if len(self.ranks) > self.capacity:
            raise TableError(
                f"rank table has {len(self.ranks)} symbols but the ranked regions hold only "
                f"{self.capacity}"
            )
        if self.literal is None and len(self.ranks) < ALPHABET:
            raise TableError(
                f"incomplete table: no literal region and only {len(self.ranks)} of {ALPHABET} "
                "symbols ranked, so unseen symbols could not be coded"
            )

    # ----------------------------------------------------------------- derived region facts
    @property
    def ranked(self) -> tuple[bool, ...]:
        return tuple(p != self.literal for p in range(NUM_REGIONS))

    @property
    def bases(self) -> tuple[int, ...]:
        """First rank of each ranked region (0 for the literal region)."""
        out, acc = [], 0
        for p, w in enumerate(self.widths):
            out.append(acc if self.ranked[p] else 0)
            if self.ranked[p]:
                acc += 1 << w
        return tuple(out)

    @property
    def capacity(self) -> int:
        return sum(1 << w for p, w in enumerate(self.widths) if p != self.literal)

    @property
    def num_ranked(self) -> int:
        return len(self.ranks)

    @property
    def byte_escape(self) -> bool:
        """One literal region and every ranked region of width 0 (the ZipCCL exponent layout):
        the payload is whole escape bytes, which the GPU's BF16 fast path decodes byte-wise."""
        return self.literal is not None and all(
            w == 0 for p, w in enumerate(self.widths) if p != self.literal
        )

    # ----------------------------------------------------------------- lookup tables
    def encoder_lut(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """symbol -> (prefix, payload, code length), each a 256-entry array."""
        prefix = np.zeros(ALPHABET, np.uint8)
        payload = np.zeros(ALPHABET, np.uint8)
        if self.literal is not None:
            prefix[:] = self.literal
            payload[:] = np.arange(ALPHABET, dtype=np.uint8)
        ranks = np.arange(self.num_ranked)
        region = self._rank_regions()[ranks]
        symbols = np.asarray(self.ranks, np.int64)
        prefix[symbols] = region
        payload[symbols] = ranks - np.asarray(self.bases)[region]
        width = np.asarray(self.widths, np.uint8)[prefix]
        return prefix, payload, (PREFIX_BITS + width).astype(np.uint8)

    def _rank_regions(self) -> np.ndarray:
        """rank -> its region, for every rank the ranked regions hold (they take consecutive
        ranks in prefix order)."""
        sizes = [1 << w if r else 0 for w, r in zip(self.widths, self.ranked, strict=True)]
        return np.repeat(np.arange(NUM_REGIONS), sizes)

    def region_table(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """prefix -> (width, base saturated at 256, literal flag): the decoder's 8-entry table."""
        width = np.asarray(self.widths, np.uint8)
        base = np.minimum(np.asarray(self.bases, np.int64), ALPHABET).astype(np.uint16)
        literal = np.asarray([not r for r in self.ranked], np.bool_)
        return width, base, literal

    def rank_lut(self) -> np.ndarray:
        """rank -> symbol, 256 entries; ranks >= num_ranked are illegal and read as 0."""
        lut = np.zeros(ALPHABET, np.uint8)
        lut[: self.num_ranked] = self.ranks
        return lut

    def code_lengths(self) -> np.ndarray:
        return self.encoder_lut()[2]

    def expected_bits(self, hist: np.ndarray) -> float:
        """Mean code length in bits under a 256-bin histogram."""
        hist = np.asarray(hist, np.float64)
        total = hist.sum()
        return float((hist * self.code_lengths()).sum() / total) if total else 0.0

    # ----------------------------------------------------------------- canonical form and hash
    def to_bytes(self) -> bytes:
        desc = bytes(
            w | (_LITERAL_FLAG if p == self.literal else 0) for p, w in enumerate(self.widths)
        )
        n = self.num_ranked.to_bytes(2, "little")
        return desc + n + bytes(self.ranks) + bytes(ALPHABET - self.num_ranked)

    @classmethod
    def from_bytes(cls, data: bytes, name: str = "") -> Codebook:
        if len(data) != TABLE_BYTES:
            raise TableError(f"a table is {TABLE_BYTES} bytes, got {len(data)}")
        desc = data[:NUM_REGIONS]
        if any(d & ~(_LITERAL_FLAG | _WIDTH_MASK) for d in desc):
            raise TableError("region descriptor has reserved bits set")
        literals = [p for p, d in enumerate(desc) if d & _LITERAL_FLAG]
        if len(literals) > 1:
            raise TableError(f"more than one literal region: {literals}")
        n = int.from_bytes(data[NUM_REGIONS : NUM_REGIONS + 2], "little")
        if n > ALPHABET:
            raise TableError(f"rank count {n} exceeds {ALPHABET}")
        ranks = data[NUM_REGIONS + 2 : NUM_REGIONS + 2 + n]
        if any(data[NUM_REGIONS + 2 + n :]):
            raise TableError("rank table padding is not zero")
        return cls(
            widths=tuple(d & _WIDTH_MASK for d in desc),
            literal=literals[0] if literals else None,
            ranks=tuple(ranks),
            name=name,
        )

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.to_bytes()).hexdigest()

    @property
    def hash64(self) -> int:
        """First 8 bytes of the SHA-256, as carried in compressed-buffer headers."""
        return int.from_bytes(hashlib.sha256(self.to_bytes()).digest()[:8], "little")

    # ----------------------------------------------------------------- table file (JSON)
    def to_doc(self) -> dict:
        """The table file's JSON object (also each entry of a model's table set)."""
        return {
            "format": TABLE_FILE_FORMAT,
            "version": TABLE_FILE_VERSION,
            "name": self.name,
            "regions": [
                {"prefix": p, "width": w, "kind": "literal" if p == self.literal else "ranked"}
                for p, w in enumerate(self.widths)
            ],
            "rank_to_symbol": list(self.ranks),
            "sha256": self.sha256,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_doc(), indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Codebook:
        """Parse a table file strictly: exact keys and types, no floats or constants, bounded
        size; every malformed file is a TableError, checked in time linear in its length."""
        return cls.from_doc(parse_json(text, MAX_TABLE_FILE_BYTES, "table file"))

    @classmethod
    def from_doc(cls, doc: object) -> Codebook:
        """A parsed table file's object, checked strictly: exact keys and types, the hash."""
        doc = _dict(doc, _FILE_KEYS - {"name"}, _FILE_KEYS, "table file")
        if doc["format"] != TABLE_FILE_FORMAT:
            raise TableError(f"not a {TABLE_FILE_FORMAT} table file")
        if type(doc["version"]) is not int or doc["version"] != TABLE_FILE_VERSION:
            raise TableError(f"table file version {doc['version']!r} is not supported")
        name = doc.get("name", "")
        if not isinstance(name, str) or len(name) > MAX_NAME_CHARS:
            raise TableError(f"table name must be a string of at most {MAX_NAME_CHARS} characters")
        widths, literal = _regions(doc["regions"])
        ranks = doc["rank_to_symbol"]
        if not isinstance(ranks, list):
            raise TableError("rank_to_symbol must be a list of symbols")
        book = cls(widths, literal, _int_tuple(ranks, "rank_to_symbol", ALPHABET), name=name)
        digest = doc["sha256"]
        if not isinstance(digest, str) or not _SHA256.fullmatch(digest) or digest != book.sha256:
            raise TableError(
                f"table file hash {digest!r} does not match its content ({book.sha256})"
            )
        return book

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json())

    @classmethod
    def load(cls, path: str | Path) -> Codebook:
        """Read and parse a table file; a file over the size bound is refused unread."""
        return cls.from_json(read_text(path, MAX_TABLE_FILE_BYTES, "table file"))

    # ----------------------------------------------------------------- RTL memory images
    def encoder_words(self) -> list[int]:
        prefix, payload, length = self.encoder_lut()
        width = length.astype(int) - PREFIX_BITS
        return [
            (int(w) << ENC_WIDTH_SHIFT) | (int(p) << ENC_PREFIX_SHIFT) | int(v)
            for w, p, v in zip(width, prefix, payload, strict=True)
        ]

    def region_words(self) -> list[int]:
        width, base, literal = self.region_table()
        return [
            (int(lit) << REGION_LITERAL_SHIFT) | (int(w) << REGION_WIDTH_SHIFT) | int(b)
            for w, b, lit in zip(width, base, literal, strict=True)
        ]

    def rank_words(self) -> list[int]:
        return [int(s) for s in self.rank_lut()]

    # ----------------------------------------------------------------- GPU table image
    def gpu_words(self) -> tuple[int, ...]:
        """The GPU_TABLE_WORDS int32 words (as signed Python ints) that the CUDA kernels read."""
        prefix, payload, length = self.encoder_lut()
        width = length.astype(int) - PREFIX_BITS
        enc = [
            int(v) | int(p) << GPU_ENC_PREFIX_SHIFT | int(w) << GPU_ENC_WIDTH_SHIFT
            for p, v, w in zip(prefix, payload, width, strict=True)
        ]
        rw, base, lit = self.region_table()
        regions = [
            int(w) | int(b) << GPU_REGION_BASE_SHIFT | int(x) << GPU_REGION_LITERAL_SHIFT
            for w, b, x in zip(rw, base, lit, strict=True)
        ]
        words = [*enc, *regions, *self.rank_words(), self.num_ranked, *self._gpu_fast_words()]
        assert len(words) == GPU_TABLE_WORDS
        return tuple(w - (1 << 32) if w >= 1 << 31 else w for w in words)

    def _gpu_fast_words(self) -> list[int]:
        """The BF16 fast-path decoder's words: the literal prefix, prefix -> symbol bytes and
        prefix -> 0xFF where a prefix has no symbol (illegal in a stream); zeros unless
        byte_escape."""
        if self.literal is None or not self.byte_escape:
            return [0] * GPU_FAST_WORDS
        sym, bad = [0] * NUM_REGIONS, [0] * NUM_REGIONS
        for p, base in enumerate(self.bases):
            if p == self.literal:
                continue
            if base < self.num_ranked:
                sym[p] = self.ranks[base]
            else:
                bad[p] = 0xFF
        halves = (bytes(v[i : i + 4]) for v in (sym, bad) for i in (0, 4))
        return [self.literal, *(int.from_bytes(h, "little") for h in halves)]

    def write_memh(self, directory: str | Path, stem: str) -> dict[str, Path]:
        """Write ``{stem}_enc.hex``, ``{stem}_region.hex``, ``{stem}_rank.hex`` and
        ``{stem}_count.hex`` (the rank count) for ``$readmemh``."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        images = {
            "enc": (self.encoder_words(), ENC_WORD_BITS),
            "region": (self.region_words(), REGION_WORD_BITS),
            "rank": (self.rank_words(), 8),
            "count": ([self.num_ranked], RANK_COUNT_BITS),
        }
        paths = {}
        for kind, (words, bits) in images.items():
            digits = (bits + 3) // 4
            path = directory / f"{stem}_{kind}.hex"
            path.write_text("".join(f"{w:0{digits}x}\n" for w in words))
            paths[kind] = path
        return paths

    def describe(self) -> str:
        kinds = "".join("L" if p == self.literal else str(w) for p, w in enumerate(self.widths))
        return f"{self.name or 'table'} [{kinds}] n={self.num_ranked} sha256={self.sha256[:12]}"


# ---------------------------------------------------------------------- strict JSON files
def read_text(path: str | Path, limit: int, what: str) -> str:
    """A UTF-8 file of at most ``limit`` bytes; a larger one is refused unread (TableError),
    and so is anything but a regular file (a directory, or a FIFO, which would block the read
    until a writer came; opened non-blocking so that the check is reached). OSError where the
    path cannot be opened."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise TableError(f"{what} {path} is not a regular file")
    with os.fdopen(fd, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise TableError(f"{what} {path} exceeds {limit} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TableError(f"{what} {path} is not UTF-8: {exc}") from None


def parse_json(text: object, limit: int, what: str) -> object:
    """JSON text of at most ``limit`` characters holding only objects with distinct keys, lists,
    strings and integers; anything else is a TableError."""
    if not isinstance(text, str):
        raise TableError(f"a {what} is text, got {type(text).__name__}")
    if len(text) > limit:
        raise TableError(f"{what} of {len(text)} characters exceeds {limit}")
    try:
        return json.loads(
            text, parse_float=_no_float, parse_constant=_no_float, object_pairs_hook=_distinct_keys
        )
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, digit limits, nesting
        raise TableError(f"{what} is not JSON of a table: {exc}") from None


def _distinct_keys(pairs: list[tuple[str, object]]) -> dict:
    doc = dict(pairs)
    if len(doc) != len(pairs):
        dup = sorted(k for k, n in Counter(k for k, _ in pairs).items() if n > 1)
        raise TableError(f"a JSON object repeats the keys {dup[:5]}")
    return doc


# ---------------------------------------------------------------------- strict field parsing
def _int(value: object, what: str) -> int:
    """An integer (Python or NumPy), never a bool, float or string: nothing is silently cut."""
    if type(value) is int:  # the common case, without the slow runtime protocol check
        return value
    if isinstance(value, bool) or not isinstance(value, SupportsIndex):
        raise TableError(f"{what} must be an integer, got {value!r}")
    return operator.index(value)


def _int_tuple(values: object, what: str, limit: int) -> tuple[int, ...]:
    """A sequence of at most ``limit`` integers, its length checked before any element."""
    if isinstance(values, str | bytes) or not isinstance(values, Sequence | np.ndarray):
        raise TableError(f"{what} must be a sequence of integers, got {type(values).__name__}")
    if len(values) > limit:
        raise TableError(f"{what} has {len(values)} entries, more than {limit}")
    return tuple(_int(v, f"{what} entry") for v in values)


def _no_float(token: str) -> None:
    raise TableError(f"table files hold only integers and strings, got {token}")


def _dict(value: object, required: set[str], allowed: set[str], what: str) -> dict:
    if not isinstance(value, dict):
        raise TableError(f"{what} must be a JSON object, got {type(value).__name__}")
    missing, extra = required - value.keys(), value.keys() - allowed
    if missing or extra:
        raise TableError(
            f"{what} is missing or mistypes a field: missing {sorted(missing)}, "
            f"unknown {sorted(extra)}"
        )
    return value


def _regions(regions: object) -> tuple[tuple[int, ...], int | None]:
    """The table file's region list -> (widths by prefix, literal prefix or None)."""
    if not isinstance(regions, list) or len(regions) != NUM_REGIONS:
        raise TableError(f"table file must list prefixes 0..{NUM_REGIONS - 1} once each")
    by_prefix: dict[int, dict] = {}
    for r in regions:
        r = _dict(r, _REGION_KEYS, _REGION_KEYS, "region")
        by_prefix[_int(r["prefix"], "region prefix")] = r
    if sorted(by_prefix) != list(range(NUM_REGIONS)):
        raise TableError(f"table file must list prefixes 0..{NUM_REGIONS - 1} once each")
    kinds = [by_prefix[p]["kind"] for p in range(NUM_REGIONS)]
    if any(k not in ("ranked", "literal") for k in kinds):
        raise TableError(f"unknown region kind in {kinds}")
    literals = [p for p, k in enumerate(kinds) if k == "literal"]
    if len(literals) > 1:
        raise TableError(f"more than one literal region: {literals}")
    widths = tuple(_int(by_prefix[p]["width"], f"region {p} width") for p in range(NUM_REGIONS))
    return widths, literals[0] if literals else None
