"""The CUDA sources' copies of the format's constants agree with golden/ and zipccl._cuda.

The kernels cannot import golden; every constant they share with it is named in csrc/ as a
``constexpr`` and checked here, on any machine (no GPU, no compiler needed).
"""

from __future__ import annotations

import ast
import contextlib
import operator
import re
import struct
from collections.abc import Iterable

import pytest
from zipccl import _cuda
from zipccl.golden import codebook, container, theory
from zipccl.golden.codebook import Codebook
from zipccl.golden.formats import get_format

DEFINITION = re.compile(r"constexpr\s+(?:int|long long|unsigned|uint8_t|uint32_t)\s+([^;(]+);")
LITERAL_SUFFIX = re.compile(r"\b(0x[0-9a-fA-F]+|\d+)(?:ull|ll|u)?\b")
OPERATORS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Div: operator.floordiv,
    ast.LShift: operator.lshift,
    ast.RShift: operator.rshift,
    ast.BitOr: operator.or_,
}


def _value(node: ast.AST, known: dict[str, int]) -> int:
    """An integer expression of literals, known names and C's integer operators."""
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.Name):
        return known[node.id]  # KeyError: a name that is not a format constant
    if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
        return OPERATORS[type(node.op)](_value(node.left, known), _value(node.right, known))
    raise KeyError(ast.dump(node))


def _constants(sources: Iterable[str]) -> dict[str, int]:
    """Every ``constexpr NAME = <integer expression>`` in the sources, in order."""
    found: dict[str, int] = {}
    for text in sources:
        for line in text.splitlines():
            for decls in DEFINITION.findall(line.split("//")[0]):
                for name, expr in (d.split("=", 1) for d in decls.split(",") if "=" in d):
                    _define(found, name.strip(), expr)
    return found


def _define(found: dict[str, int], name: str, expr: str) -> None:
    """Record ``name`` unless its value uses device-only names (not a format constant)."""
    with contextlib.suppress(KeyError, SyntaxError):
        tree = ast.parse(LITERAL_SUFFIX.sub(r"\1", expr.strip()), mode="eval")
        found[name] = _value(tree.body, found)


SOURCES = {path.name: path.read_text() for path in sorted(_cuda.CSRC.iterdir())}
CUDA = _constants(SOURCES.values())
# csrc/'s name -> the value golden (or _cuda, for the host/kernel interface) defines
GOLDEN = {
    "kTableBytes": codebook.TABLE_BYTES,
    "kLiteralFlag": codebook._LITERAL_FLAG,
    "kWidthMask": codebook._WIDTH_MASK,
    "kEncPrefixShift": codebook.GPU_ENC_PREFIX_SHIFT,
    "kEncWidthShift": codebook.GPU_ENC_WIDTH_SHIFT,
    "kRegionBaseShift": codebook.GPU_REGION_BASE_SHIFT,
    "kRegionLiteralShift": codebook.GPU_REGION_LITERAL_SHIFT,
    "kRegionAt": codebook.GPU_REGION_AT,
    "kRankAt": codebook.GPU_RANK_AT,
    "kCountAt": codebook.GPU_COUNT_AT,
    "kFastAt": codebook.GPU_FAST_AT,
    "kFastWords": codebook.GPU_FAST_WORDS,
    "kTableWords": codebook.GPU_TABLE_WORDS,
    "kTableAt": container._TABLE_AT,
    "kHeaderBytes": container.HEADER_BYTES,
    "kCrcAt": container.CRC_AT,
    "kSizeFieldAt": container.PAYLOAD_BYTES_AT,
    "kChecksumAt": container.CHECKSUM_AT,
    "kHashAt": container._TABLE_AT - 8,
    "kLayoutAt": struct.calcsize("<4sB"),
    "kLayoutRaw": container.LAYOUT_RAW,
    "kTop": theory.ZIPCCL_TOP,
    "kPrefixBits": codebook.PREFIX_BITS,
    "kSampleSize": theory.SAMPLE_SIZE,
    "kMaxHeader": _cuda.MAX_HEADER,
    "kGaps": _cuda.GAPS,
    "kScratchWorkAt": _cuda.SCRATCH_WORK_AT,
    "kCapturing": _cuda.CAPTURING,
    "kKinds": max(*_cuda.KIND.values(), *_cuda.FAST.values()) + 1,
    "kErrOffsets": _cuda.DecodeError.OFFSETS,
    "kErrSize": _cuda.DecodeError.SIZE,
    "kErrRank": _cuda.DecodeError.RANK,
    "kErrPadding": _cuda.DecodeError.PADDING,
    "kErrPlanePad": _cuda.DecodeError.PLANE_PADDING,
    "kErrRoom": _cuda.DecodeError.ROOM,
    "kErrChecksum": _cuda.DecodeError.CHECKSUM,
    "kErrGaps": _cuda.DecodeError.GAPS,
    "kErrSymbol": _cuda.DecodeError.SYMBOL,
    "kSumKey": container._KEY,
}


def _mismatches(cuda: dict[str, int]) -> list[str]:
    """The constants csrc/ lacks or defines otherwise than golden."""
    return [
        f"csrc/ {name} = {cuda.get(name)}, golden/_cuda say {want}"
        for name, want in GOLDEN.items()
        if cuda.get(name) != want
    ]


def test_cuda_constants_match_golden() -> None:
    assert not _mismatches(CUDA)


def test_a_changed_cuda_constant_fails_the_check() -> None:
    """The check reads the sources: an edited constant (and what derives from it) or a renamed
    one fails it."""
    edited = SOURCES["table.cuh"].replace("kFastAt = 521", "kFastAt = 522")
    assert edited != SOURCES["table.cuh"]
    found = _constants({**SOURCES, "table.cuh": edited}.values())
    assert [m.split()[1] for m in _mismatches(found)] == ["kFastAt", "kTableWords"]
    renamed = SOURCES["table.cuh"].replace("kRankAt", "kRanksAt")
    found = _constants({**SOURCES, "table.cuh": renamed}.values())
    assert "kRankAt" in " ".join(_mismatches(found))


def test_header_fields_sit_where_golden_packs_them() -> None:
    """The table's hash and bytes lie at kHashAt / kTableAt of golden's packed header."""
    book = Codebook((8, 0, 0, 0, 0, 0, 0, 0), 0, (126, 127, 125, 124, 123, 128, 122))
    head = container.Header(container.LAYOUT_SPLIT, container.BY_CODE[1], (10,), 4096, 0, book)
    data = head.pack()
    at, hashed = CUDA["kTableAt"], CUDA["kHashAt"]
    assert data[at : at + codebook.TABLE_BYTES] == book.to_bytes()
    assert int.from_bytes(data[hashed : hashed + 8], "little") == book.hash64
    assert data[CUDA["kLayoutAt"]] == container.LAYOUT_SPLIT


def test_table_words_are_laid_out_as_the_kernels_read_them() -> None:
    """golden's GPU image of a table puts each part where table.cuh's offsets say."""
    book = Codebook((8, 0, 0, 0, 0, 0, 0, 0), 0, (126, 127, 125, 124, 123, 128, 122))
    words = book.gpu_words()
    assert len(words) == CUDA["kTableWords"]
    width, base, literal = book.region_table()
    for p in range(codebook.NUM_REGIONS):
        want = int(width[p]) | int(base[p]) << 4 | int(literal[p]) << 15
        assert words[CUDA["kRegionAt"] + p] == want
    assert list(words[CUDA["kRankAt"] : CUDA["kRankAt"] + 7]) == list(book.ranks)
    assert words[CUDA["kCountAt"]] == book.num_ranked
    assert words[CUDA["kFastAt"]] == book.literal


def test_every_exponent_format_takes_the_fast_path_under_byte_escapes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The kernel kind per format and table (codec.cu by_kind): the theory table and any other
    byte-escape table take the fast path for BF16, FP16 and FP32; FP8, other tables and
    ZIPCCL_FAST=0 the generic kernels."""
    escapes = Codebook((0, 0, 8, 0, 0, 0, 0, 0), 2, (15, 14, 16))
    mixed = Codebook((8, 1, 0, 0, 0, 0, 0, 0), 0, (15, 14, 16))
    for name in ("bfloat16", "float16", "float32"):
        fmt = get_format(name)
        assert _cuda._kind(fmt, None, 4096) == _cuda._kind(fmt, escapes, 4096) == _cuda.FAST[name]
        assert _cuda._kind(fmt, mixed, 4096) == _cuda.KIND[name]
    for name in ("float8_e4m3fn", "float8_e5m2"):
        assert _cuda._kind(get_format(name), escapes, 4096) == _cuda.KIND[name]
    assert len({*_cuda.KIND.values(), *_cuda.FAST.values()}) == CUDA["kKinds"]
    monkeypatch.setenv("ZIPCCL_FAST", "0")
    assert _cuda._kind(get_format("float16"), None, 4096) == _cuda.KIND["float16"]
