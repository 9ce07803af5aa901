"""CUDA C++ backend: csrc/codec.cu compiled with nvcc at first use, loaded with ctypes.

No torch headers are involved (building a torch extension takes about a minute; this file builds
in about two seconds), so the shared library is plain CUDA with two ``extern "C"`` launchers that
take raw device pointers and torch's current stream. The build is cached per source hash and GPU
architecture under ``$ZIPCCL_CACHE_DIR`` (default ``~/.cache/zipccl``).
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

from golden.codebook import ALPHABET, NUM_REGIONS, Codebook
from golden.container import CRC_AT, HEADER_BYTES, PAYLOAD_BYTES_AT, Sections, align
from golden.formats import FloatFormat
from golden.streams import num_blocks

SOURCE = Path(__file__).with_name("csrc") / "codec.cu"
MAX_BLOCK = 16384  # one warp stages a block's payload in shared memory
MAX_HEADER = 512  # codec.cu kMaxHeader: the kernel that writes the header stages it in shared
assert CRC_AT + 4 == HEADER_BYTES <= MAX_HEADER
GAPS = 10
KIND = {"bfloat16": 0, "float16": 1, "float32": 2, "float8_e4m3fn": 3, "float8_e5m2": 3}
FAST_BF16 = 4  # BF16 under a byte-escape table (ZIPCCL_FAST=0 selects the generic kernels)
ERRORS = {
    1: "block offsets out of order or out of range",
    2: "a block's payload size disagrees with its prefix planes",
    4: "illegal codeword: a rank past the table's ranked symbols",
    8: "payload padding bits are not zero",
    16: "bit plane padding bits are not zero",
    32: "the header's payload size exceeds the payload's room",
}
ROOM_ERROR = 32  # a collective resends such a buffer raw: not corruption


class Layout(ctypes.Structure):
    """Mirror of ``struct Layout`` in codec.cu (all 64-bit, so no padding)."""

    _fields_ = [
        (name, ctypes.c_longlong)
        for name in ("n", "nb", "block", "ngaps")
    ] + [
        ("raw_byte_at", ctypes.c_longlong * 3),
        ("raw_bit_at", ctypes.c_longlong * 3),
        ("prefix_at", ctypes.c_longlong * 3),
        ("offsets_at", ctypes.c_longlong),
        ("payload_at", ctypes.c_longlong),
        ("capacity", ctypes.c_longlong),
        ("payload_bytes", ctypes.c_longlong),
        ("payload_cap", ctypes.c_longlong),
        ("size_field_at", ctypes.c_longlong),
        ("crc_at", ctypes.c_longlong),
        ("gap_lo", ctypes.c_longlong * GAPS),
        ("gap_hi", ctypes.c_longlong * GAPS),
    ]


def supports(block: int) -> bool:
    return block <= MAX_BLOCK


def _cache_dir() -> Path:
    return Path(os.environ.get("ZIPCCL_CACHE_DIR", Path.home() / ".cache" / "zipccl"))


def build(arch: str) -> Path:
    """Compile codec.cu for ``arch`` (e.g. "90") unless a cached build exists; return the .so."""
    src = SOURCE.read_bytes()
    key = hashlib.sha256(src + arch.encode()).hexdigest()[:16]
    lib = _cache_dir() / f"zipccl_codec_{key}_sm{arch}.so"
    if lib.exists():
        return lib
    home = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))
    nvcc = shutil.which("nvcc") or str(home / "bin" / "nvcc")
    lib.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=lib.parent) as tmp:
        out = Path(tmp) / lib.name
        cmd = [
            nvcc, "-O3", "-std=c++17", "-shared", "-Xcompiler", "-fPIC", "-lineinfo",
            f"-gencode=arch=compute_{arch},code=sm_{arch}", "-o", str(out), str(SOURCE),
        ]
        subprocess.run(cmd, check=True, capture_output=True, text=True)
        os.replace(out, lib)
    return lib


@functools.cache
def _lib() -> ctypes.CDLL | None:
    major, minor = torch.cuda.get_device_capability()
    try:
        lib = ctypes.CDLL(str(build(f"{major}{minor}")))
    except (OSError, subprocess.CalledProcessError) as exc:
        detail = getattr(exc, "stderr", "") or exc
        warnings.warn(f"zipccl: CUDA kernels unavailable, using torch ops ({detail})", stacklevel=3)
        return None
    ptr, layout = ctypes.c_void_p, ctypes.POINTER(Layout)
    lib.zipccl_encode.argtypes = [ctypes.c_int, ptr, ptr, layout, ptr, ptr, ptr, ptr]
    lib.zipccl_decode.argtypes = [ctypes.c_int, ptr, ptr, ptr, layout, ptr, ptr, ctypes.c_int, ptr]
    lib.zipccl_encode.restype = lib.zipccl_decode.restype = ctypes.c_int
    lib.zipccl_summary.argtypes = [ctypes.c_int, ptr, ctypes.c_longlong, ctypes.c_longlong, ptr,
                                   ptr]
    lib.zipccl_summary.restype = ctypes.c_int
    lib.zipccl_work_bytes.argtypes = [ctypes.c_longlong, ctypes.c_longlong]
    lib.zipccl_work_bytes.restype = ctypes.c_longlong
    lib.zipccl_error_string.argtypes = [ctypes.c_int]
    lib.zipccl_error_string.restype = ctypes.c_char_p
    return lib


def available() -> bool:
    return torch.cuda.is_available() and _lib() is not None


def byte_escape(table: Codebook) -> bool:
    """One literal region and every ranked region of width 0 (the ZipCCL exponent layout): the
    payload is whole escape bytes, which the BF16 fast path handles with byte-wise SIMD."""
    return table.literal is not None and all(
        w == 0 for p, w in enumerate(table.widths) if p != table.literal
    )


_byte_escape = functools.lru_cache(maxsize=64)(byte_escape)


def _fast_words(table: Codebook) -> list[int]:
    """The fast-path decoder's table words (codec.cu kFastAt): the literal prefix, prefix -> symbol
    bytes and prefix -> 0xFF where a prefix has no symbol (illegal in a stream)."""
    if not byte_escape(table):
        return [0] * 5
    sym, bad = [0] * NUM_REGIONS, [0] * NUM_REGIONS
    for p, base in enumerate(table.bases):
        if p == table.literal:
            continue
        if base < table.num_ranked:
            sym[p] = table.ranks[base]
        else:
            bad[p] = 0xFF
    return [int(table.literal), *(int.from_bytes(bytes(v[i : i + 4]), "little")
                                  for v in (sym, bad) for i in (0, 4))]


@functools.lru_cache(maxsize=64)
def _table_words(table: Codebook) -> tuple[int, ...]:
    """The int32 table image codec.cu reads (encoder codes, regions, ranks, rank count, fast)."""
    pre, value, length = table.encoder_lut()
    width = length.astype(int) - 3
    enc = [int(v) | int(p) << 8 | int(w) << 12 for p, v, w in zip(pre, value, width, strict=True)]
    rw, base, lit = table.region_table()
    regions = [int(w) | int(b) << 4 | int(x) << 15 for w, b, x in zip(rw, base, lit, strict=True)]
    assert len(enc) == ALPHABET and len(regions) == NUM_REGIONS
    words = [*enc, *regions, *(int(s) for s in table.rank_lut()), table.num_ranked]
    words += _fast_words(table)
    return tuple(w - (1 << 32) if w >= 1 << 31 else w for w in words)  # as int32


def _kind(fmt: FloatFormat, table: Codebook, block: int) -> int:
    """Kernel choice: BF16 under a byte-escape table takes the SIMD fast path."""
    fast = fmt.name == "bfloat16" and _byte_escape(table)
    return FAST_BF16 if fast and os.environ.get("ZIPCCL_FAST", "1") != "0" else KIND[fmt.name]


_KEPT = 64  # device copies kept per cache (the newest)
_TABLES: collections.OrderedDict[tuple[int, torch.device], tuple[object, torch.Tensor]] = (
    collections.OrderedDict()
)
_HEADERS: collections.OrderedDict[tuple[bytes, torch.device], tuple[object, torch.Tensor]] = (
    collections.OrderedDict()
)


def _uploaded(cache: collections.OrderedDict, key: tuple, owner: object,
              make: Callable[[], torch.Tensor]) -> torch.Tensor:
    """The device tensor ``make()`` cached under ``key``, remade when the entry belongs to
    another ``owner`` object; only the newest ``_KEPT`` entries stay."""
    hit = cache.get(key)
    if hit is None or hit[0] is not owner:
        hit = cache[key] = (owner, make())
        if len(cache) > _KEPT:
            cache.popitem(last=False)
    return hit[1]


def _to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A small host tensor's copy queued on the current stream without a host sync (from pinned
    memory; a copy from pageable memory waits for everything queued on the stream first -- in a
    collective, for the transfer whose buffers the decode is about to read)."""
    return host.pin_memory().to(device, non_blocking=True)


def _table_tensor(table: Codebook, device: torch.device) -> torch.Tensor:
    """Device copy of the table image, per table object and device (an entry keeps its table
    alive, so the id cannot be reused while cached)."""
    return _uploaded(_TABLES, (id(table), device), table,
                     lambda: _to_device(torch.tensor(_table_words(table), dtype=torch.int32),
                                        device))


def _header_tensor(header: bytes, device: torch.device) -> torch.Tensor:
    """Device copy of a header template: one upload per tensor shape and table."""
    return _uploaded(_HEADERS, (header, device), None,
                     lambda: _to_device(torch.frombuffer(bytearray(header), dtype=torch.uint8),
                                        device))


def _stream(device: torch.device) -> int:
    """The current stream's raw handle; torch's private one-call getter where it exists (the
    public ``torch.cuda.current_stream()`` builds a Stream object: ~10 µs per call)."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return raw(device.index) if raw is not None else torch.cuda.current_stream(device).cuda_stream


def _on(device: torch.device) -> contextlib.AbstractContextManager:
    """The launchers run on the host thread's current device: switch only when it differs."""
    if torch.cuda.current_device() == device.index:
        return contextlib.nullcontext()
    return torch.cuda.device(device)


@functools.lru_cache(maxsize=256)
def _payload_at(fmt: FloatFormat, n: int, block: int) -> int:
    return Sections.of(fmt, n, block).payload


@functools.lru_cache(maxsize=256)
def _layout(fmt: FloatFormat, n: int, block: int, capacity: int, payload_bytes: int,
            payload_cap: int) -> Layout:
    sec = Sections.of(fmt, n, block)
    nb = num_blocks(n, block)
    plane = (n + 7) // 8
    lay = Layout(n=n, nb=nb, block=block)
    ends = [(at, n) for at in sec.raw_bytes] + [(at, plane) for at in sec.raw_bits + sec.prefix]
    ends.append((sec.offsets, 8 * nb))
    gaps = [(at + size, align(at + size)) for at, size in ends]
    lay.ngaps = len(gaps)
    for i, (lo, hi) in enumerate(gaps):
        lay.gap_lo[i], lay.gap_hi[i] = lo, hi
    for name, starts in (
        ("raw_byte_at", sec.raw_bytes), ("raw_bit_at", sec.raw_bits), ("prefix_at", sec.prefix)
    ):
        for i, at in enumerate(starts):
            getattr(lay, name)[i] = at
    lay.offsets_at, lay.payload_at = sec.offsets, sec.payload
    lay.capacity, lay.payload_bytes, lay.payload_cap = capacity, payload_bytes, payload_cap
    lay.size_field_at, lay.crc_at = PAYLOAD_BYTES_AT, CRC_AT
    return lay


def _check_dense(*tensors: torch.Tensor) -> None:
    """The kernels take raw pointers: every tensor must be contiguous on the same device."""
    device = tensors[0].device
    for t in tensors:
        if not t.is_contiguous() or t.device != device:
            raise ValueError("the CUDA codec kernels need contiguous tensors on one device")


def _check(rc: int) -> None:
    if rc:
        lib = _lib()
        msg = lib.zipccl_error_string(rc).decode() if lib else str(rc)
        raise RuntimeError(f"zipccl CUDA launch failed: {msg}")


def launch_encode(
    x: torch.Tensor,
    fmt: FloatFormat,
    table: Codebook,
    block: int,
    out: torch.Tensor,
    header: bytes | None = None,
) -> torch.Tensor:
    """Queue the encode (four kernels, no host sync); returns a one-element int64 device tensor
    that will hold payload_bytes. The payload is written only if it fits in ``out``. ``header``:
    golden's split-layout header with payload_bytes 0, written with the real size and CRC."""
    _check_dense(x, out)
    n = x.numel()
    lay = _layout(fmt, n, block, out.numel(), 0, 0)
    lib = _lib()
    assert lib is not None
    words = -(-lib.zipccl_work_bytes(lay.nb, block) // 8)
    work = torch.empty(words, dtype=torch.int64, device=x.device)
    head = _header_tensor(header, x.device).data_ptr() if header is not None else None
    with _on(x.device):
        _check(lib.zipccl_encode(
            _kind(fmt, table, block), x.data_ptr(), out.data_ptr(), ctypes.byref(lay),
            _table_tensor(table, x.device).data_ptr(), work.data_ptr(), head, _stream(x.device),
        ))
    return work[:1]


WRITES_HEADER = True  # encode_into takes codec's header template and writes the header itself


def encode_into(
    x: torch.Tensor,
    fmt: FloatFormat,
    table: Codebook,
    block: int,
    out: torch.Tensor,
    header: bytes | None = None,
) -> int:
    """Same contract as ``_torch.encode_into``, plus the header written on the device when a
    template is given; one host sync to read the payload size."""
    return int(launch_encode(x, fmt, table, block, out, header).item())


def launch_decode(
    buf: torch.Tensor,
    fmt: FloatFormat,
    table: Codebook,
    block: int,
    payload_bytes: int | None,
    out: torch.Tensor,
    flag: torch.Tensor,
    clear: bool = False,
    payload: torch.Tensor | None = None,
) -> None:
    """Queue the decode kernel; problems are OR-ed into ``flag`` (int32 on the device), which
    it zeroes first when ``clear``. Nothing syncs: read the flag later (raise_on_flag).

    ``payload``: the payload stream in a tensor of its own, when ``buf`` holds only the fixed part
    (a received buffer need not be joined into one first). ``payload_bytes`` None: the kernel
    reads it from the header at ``buf``'s start and, where it exceeds the payload's room, decodes
    nothing and sets ROOM_ERROR (the host has not seen that header yet).
    """
    tensors = (buf, out) if payload is None else (buf, out, payload)
    _check_dense(*tensors)
    n = out.numel()
    fixed = _payload_at(fmt, n, block)
    if payload is None:  # the container's own payload section (no slicing: host time matters)
        at, room = buf.data_ptr() + fixed, buf.numel() - fixed
    else:
        at, room = payload.data_ptr(), payload.numel()
    if buf.numel() < fixed or room < (payload_bytes or 0):
        raise ValueError(
            f"compressed buffer too short: {buf.numel()} fixed-part bytes (need {fixed}) and "
            f"{max(room, 0)} payload bytes (need {payload_bytes})"
        )
    lay = _layout(fmt, n, block, buf.numel(), -1 if payload_bytes is None else payload_bytes,
                  room)
    lib = _lib()
    assert lib is not None
    with _on(buf.device):
        _check(lib.zipccl_decode(
            _kind(fmt, table, block), buf.data_ptr(), at, out.data_ptr(),
            ctypes.byref(lay), _table_tensor(table, buf.device).data_ptr(), flag.data_ptr(),
            int(clear), _stream(buf.device),
        ))


def launch_summary(x: torch.Tensor, fmt: FloatFormat, stride: int, count: int,
                   out: torch.Tensor) -> None:
    """Queue codec.sample_summary of the contiguous ``x`` (``count`` values ``stride`` apart)
    into the int64 ``out``: one kernel, no host sync (torch's bincount would sync twice)."""
    _check_dense(x, out)
    lib = _lib()
    assert lib is not None
    with _on(x.device):
        _check(lib.zipccl_summary(KIND[fmt.name], x.data_ptr(), stride, count, out.data_ptr(),
                                  _stream(x.device)))


def raise_on_flag(code: int) -> None:
    if code:
        why = "; ".join(msg for bit, msg in ERRORS.items() if code & bit)
        raise ValueError(f"corrupt compressed buffer: {why}")


def decode_into(
    buf: torch.Tensor,
    fmt: FloatFormat,
    table: Codebook,
    block: int,
    payload_bytes: int,
    out: torch.Tensor,
) -> None:
    """Same contract as ``_torch.decode_into``; one host sync to read the error flag."""
    flag = torch.empty(1, dtype=torch.int32, device=buf.device)
    launch_decode(buf, fmt, table, block, payload_bytes, out, flag, clear=True)
    raise_on_flag(int(flag.item()))
