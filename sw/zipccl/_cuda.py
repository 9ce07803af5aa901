"""CUDA C++ backend: csrc/ compiled with nvcc at first use, loaded with ctypes.

No torch headers are involved (building a torch extension takes about a minute; this builds in
seconds), so the shared library is plain CUDA with ``extern "C"`` launchers that take raw device
pointers, the device index and torch's current stream. Each public codec call is one ctypes call
that launches all of its kernels (:func:`compress`, :func:`decompress`; a compress from a cached
CUDA graph of its launches, csrc/launch.cuh); the per-shape constants are a cached :class:`Plan`.
The build is cached per source hash and GPU architecture in a private directory
(zipccl._kernel_cache, ``$ZIPCCL_CACHE_DIR``, default ``~/.cache/zipccl``).
"""

from __future__ import annotations

import ctypes
import enum
import functools
import os
import shutil
import subprocess
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Final

import torch

from zipccl import _kernel_cache, settings
from zipccl.golden import builders, theory
from zipccl.golden.codebook import GPU_TABLE_WORDS, NUM_REGIONS, Codebook
from zipccl.golden.container import (
    CHECKSUM_MISMATCH,
    CRC_AT,
    HEADER_BYTES,
    LAYOUT_RAW,
    LAYOUT_SPLIT,
    Header,
    Sections,
    align,
    raw_size,
)
from zipccl.golden.formats import FloatFormat, get_format
from zipccl.golden.streams import num_blocks

QUEUES: Final = True  # zipccl._codecs: only queues device work

CSRC = Path(__file__).with_name("csrc")
SOURCE = CSRC / "codec.cu"  # includes the other files under csrc/
MAX_BLOCK = 16384  # one warp stages a block's payload in shared memory
MAX_HEADER = 512  # codec.cu kMaxHeader: the kernel that writes the header stages it in shared
assert CRC_AT + 4 == HEADER_BYTES <= MAX_HEADER
GAPS = 10
# the kernel instantiation per format (codec.cu by_kind; both FP8 formats code whole bytes alike),
# not a dtype code: those are golden.formats'
KIND = {"bfloat16": 0, "float16": 1, "float32": 2, "float8_e4m3fn": 3, "float8_e5m2": 3}
#  the fast path's: an exponent format under a byte-escape table (ZIPCCL_FAST=0 selects KIND's)
FAST = {"bfloat16": 4, "float16": 5, "float32": 6}


class DecodeError(enum.IntFlag):
    """The decoder's error bits (layout.cuh kErr*), OR-ed into its flag."""

    OFFSETS = 1
    SIZE = 2
    RANK = 4
    PADDING = 8
    PLANE_PADDING = 16
    ROOM = 32  # a collective resends such a buffer raw: not corruption
    CHECKSUM = 64
    GAPS = 128
    SYMBOL = 256


ERRORS = {
    DecodeError.OFFSETS: "block offsets out of order or out of range",
    DecodeError.SIZE: "a block's payload size disagrees with its prefix planes",
    DecodeError.RANK: "illegal codeword: a rank past the table's ranked symbols",
    DecodeError.PADDING: "payload padding bits are not zero",
    DecodeError.PLANE_PADDING: "bit plane padding bits are not zero",
    DecodeError.ROOM: "the header's payload size exceeds the payload's room",
    DecodeError.CHECKSUM: CHECKSUM_MISMATCH,
    DecodeError.GAPS: "alignment gap bytes are not zero",
    DecodeError.SYMBOL: "a decoded symbol is past the format's exponent field",
}
ROOM_ERROR = DecodeError.ROOM


class Layout(ctypes.Structure):
    """Mirror of ``struct Layout`` in codec.cu (all 64-bit, so no padding)."""

    _fields_: ClassVar[
        list[tuple[str, type[ctypes.c_longlong] | type[ctypes.Array[ctypes.c_longlong]]]]
    ] = [(name, ctypes.c_longlong) for name in ("n", "nb", "block", "ngaps")] + [
        ("raw_byte_at", ctypes.c_longlong * 3),
        ("raw_bit_at", ctypes.c_longlong * 3),
        ("prefix_at", ctypes.c_longlong * 3),
        ("offsets_at", ctypes.c_longlong),
        ("payload_at", ctypes.c_longlong),
        ("capacity", ctypes.c_longlong),
        ("payload_bytes", ctypes.c_longlong),
        ("payload_cap", ctypes.c_longlong),
        ("gap_lo", ctypes.c_longlong * GAPS),
        ("gap_hi", ctypes.c_longlong * GAPS),
        ("raw_size", ctypes.c_longlong),
        ("checksum", ctypes.c_longlong),
    ]


class CompressPlan(ctypes.Structure):
    """Mirror of ``struct CompressPlan`` in codec.cu: a Plan's arguments of zipccl_compress, the
    same for every call (passed by one pointer: each ctypes argument costs host time)."""

    _fields_: ClassVar[list[tuple[str, type]]] = [
        ("layout", ctypes.POINTER(Layout)),
        ("split_head", ctypes.c_void_p),
        ("raw_head", ctypes.c_void_p),
        ("rows", ctypes.c_void_p),
        ("stride", ctypes.c_longlong),
        ("count", ctypes.c_longlong),
        ("device", ctypes.c_int),
        ("nrows", ctypes.c_int),
    ]


# zipccl_compress's answer (codec.cu kCapturing) when the stream is being captured and the call
# brought the scratch that uncaptured calls share: it is then called with a scratch of its own
CAPTURING = 0x40000000


def supports(block: int) -> bool:
    return block <= MAX_BLOCK


def build(arch: str) -> ctypes.CDLL:
    """Compile csrc/ for ``arch`` (e.g. "90") unless a verified cached build exists, and load it
    (zipccl._kernel_cache: a private directory; the bytes loaded are the ones just hashed against
    the build record, so a file another user planted or swapped there is never loaded)."""
    key = [arch.encode()]
    for path in sorted(CSRC.iterdir()):  # every file: codec.cu includes the others
        key.append(path.name.encode() + b"\0" + path.read_bytes())
    home = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))
    nvcc = shutil.which("nvcc") or str(home / "bin" / "nvcc")

    def compile_to(out: Path) -> None:
        cmd = [
            nvcc,
            "-O3",
            "-std=c++17",
            "-shared",
            "-Xcompiler",
            "-fPIC",
            "-lineinfo",
            f"-gencode=arch=compute_{arch},code=sm_{arch}",
            "-o",
            str(out),
            str(SOURCE),
        ]
        subprocess.run(cmd, check=True, capture_output=True, text=True)

    name = f"zipccl_codec_sm{arch}"
    return _kernel_cache.cached_build(name, b"\0".join(key), compile_to, ctypes.CDLL)


_LIB: ctypes.CDLL | None = None  # _lib()'s library once loaded (the hot path skips the call)


@functools.cache
def _lib() -> ctypes.CDLL | None:
    global _LIB
    major, minor = torch.cuda.get_device_capability()
    try:
        lib = build(f"{major}{minor}")
    except _kernel_cache.UnsafeCacheError:
        raise  # a cache another user can write to is refused loudly, never worked around
    except (OSError, subprocess.CalledProcessError) as exc:
        detail = getattr(exc, "stderr", "") or exc
        warnings.warn(f"zipccl: CUDA kernels unavailable, using torch ops ({detail})", stacklevel=3)
        return None
    ptr, layout = ctypes.c_void_p, ctypes.POINTER(Layout)
    dev_kind = [ctypes.c_int, ctypes.c_int]  # every launcher's device index and kernel kind
    lib.zipccl_encode.argtypes = [*dev_kind, ptr, ptr, layout, ptr, ptr, ptr, ptr]
    lib.zipccl_decode.argtypes = [
        *dev_kind,
        *(ptr, ptr, ptr, layout, ptr, ptr, ctypes.c_int, ptr, ptr, ctypes.POINTER(ctypes.c_int)),
    ]
    lib.zipccl_encode.restype = lib.zipccl_decode.restype = ctypes.c_int
    lib.zipccl_compress.argtypes = [
        ctypes.POINTER(CompressPlan),
        ctypes.c_int,
        *(ptr, ptr, ptr, ptr, ctypes.c_int, ptr, ptr, ptr),
    ]
    lib.zipccl_compress.restype = ctypes.c_int
    lib.zipccl_seal_raw.argtypes = [ctypes.c_int, ptr, ptr, layout, ptr, ptr]
    lib.zipccl_seal_raw.restype = ctypes.c_int
    lib.zipccl_summary.argtypes = [*dev_kind, ptr, ctypes.c_longlong, ctypes.c_longlong, ptr, ptr]
    lib.zipccl_summary.restype = ctypes.c_int
    lib.zipccl_work_bytes.argtypes = [ctypes.c_longlong, ctypes.c_longlong]
    lib.zipccl_work_bytes.restype = ctypes.c_longlong
    lib.zipccl_error_string.argtypes = [ctypes.c_int]
    lib.zipccl_error_string.restype = ctypes.c_char_p
    _LIB = lib
    return lib


def available() -> bool:
    return torch.cuda.is_available() and _lib() is not None


@functools.lru_cache(maxsize=64)
def _byte_escape(table: Codebook) -> bool:
    """Codebook.byte_escape, cached: every call's kernel choice asks it."""
    return table.byte_escape


@functools.lru_cache(maxsize=64)
def _table_words(table: Codebook) -> tuple[int, ...]:
    """golden's GPU table image, cached: a collective uploads it per call."""
    return table.gpu_words()


def _kind(fmt: FloatFormat, table: Codebook | None, block: int) -> int:
    """Kernel choice: an exponent format under a byte-escape table (None: the theory table,
    always one) takes the SIMD fast path."""
    fast = fmt.name in FAST and (table is None or _byte_escape(table))
    return FAST[fmt.name] if fast and settings.value("ZIPCCL_FAST") else KIND[fmt.name]


_KEPT = 64  # device copies kept per cache (the newest)


def _uploaded(
    name: str, key: tuple, owner: object, make: Callable[[], torch.Tensor]
) -> torch.Tensor:
    """The device tensor ``make()`` cached under ``key`` in this host thread's cache ``name``,
    remade when the entry belongs to another ``owner`` object; only the newest ``_KEPT``
    entries stay. Per thread: the upload is queued on the thread's stream, which another
    thread's streams (the backend's lanes) are not ordered after."""
    cache = _kept(name)
    hit = cache.get(key)
    if hit is None or hit[0] is not owner:
        hit = cache[key] = (owner, make())
        if len(cache) > _KEPT:
            del cache[next(iter(cache))]  # the oldest (a dict keeps insertion order)
    return hit[1]


def _to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A small host tensor's copy queued on the current stream without a host sync (from pinned
    memory; a copy from pageable memory waits for everything queued on the stream first -- in a
    collective, for the transfer whose buffers the decode is about to read)."""
    return host.pin_memory().to(device, non_blocking=True)


def _table_tensor(table: Codebook, device: torch.device) -> torch.Tensor:
    """Device copy of the table image, per table object and device (an entry keeps its table
    alive, so the id cannot be reused while cached)."""
    return _uploaded(
        "tables",
        (id(table), device),
        table,
        lambda: _to_device(torch.tensor(_table_words(table), dtype=torch.int32), device),
    )


def _header_tensor(header: bytes, device: torch.device) -> torch.Tensor:
    """Device copy of a header template: one upload per tensor shape and table."""
    return _uploaded(
        "headers",
        (header, device),
        None,
        lambda: _to_device(torch.frombuffer(bytearray(header), dtype=torch.uint8), device),
    )


def _staircases(device: torch.device) -> torch.Tensor:
    """golden.builders.staircase_layouts() on ``device`` (uint8, 8 widths a row): the family
    the FP8 default table is chosen from on the device, uploaded once per device and thread."""
    return _uploaded(
        "staircases",
        (device,),
        None,
        lambda: _to_device(
            torch.from_numpy(builders.staircase_layouts().astype("uint8").reshape(-1)), device
        ),
    )


_RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _stream(device: torch.device) -> int:
    """The current stream's raw handle; torch's private one-call getter where it exists (the
    public ``torch.cuda.current_stream()`` builds a Stream object: ~10 µs per call)."""
    if _RAW_STREAM is not None:
        return _RAW_STREAM(device.index)
    return torch.cuda.current_stream(device).cuda_stream


@functools.lru_cache(maxsize=256)
def _payload_at(fmt: FloatFormat, n: int, block: int) -> int:
    return Sections.of(fmt, n, block).payload


@functools.lru_cache(maxsize=256)
def _layout(
    fmt: FloatFormat,
    n: int,
    block: int,
    capacity: int,
    payload_bytes: int,
    payload_cap: int,
    raw: int = 0,
    checksum: bool = False,
) -> Layout:
    """codec.cu's Layout; ``raw``: the raw layout's size where the buffer may hold it;
    ``checksum``: the kernels compute (encode) or check (decode) the header's values checksum."""
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
        ("raw_byte_at", sec.raw_bytes),
        ("raw_bit_at", sec.raw_bits),
        ("prefix_at", sec.prefix),
    ):
        for i, at in enumerate(starts):
            getattr(lay, name)[i] = at
    lay.offsets_at, lay.payload_at = sec.offsets, sec.payload
    lay.capacity, lay.payload_bytes, lay.payload_cap = capacity, payload_bytes, payload_cap
    lay.raw_size = raw
    lay.checksum = int(checksum)
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
    checksum: bool = False,
) -> torch.Tensor:
    """Queue the encode (four kernels, no host sync); returns a one-element int64 device tensor
    that will hold payload_bytes. The payload is written only if it fits in ``out``. ``header``:
    golden's split-layout header with payload_bytes 0, written with the real size and CRC;
    ``checksum``: with the values checksum too (``header`` must then carry its flag)."""
    _check_dense(x, out)
    n = x.numel()
    lay = _layout(fmt, n, block, out.numel(), 0, 0, checksum=checksum)
    lib = _lib()
    assert lib is not None
    words = -(-lib.zipccl_work_bytes(lay.nb, block) // 8)
    work = torch.empty(words, dtype=torch.int64, device=x.device)
    head = _header_tensor(header, x.device).data_ptr() if header is not None else None
    _check(
        lib.zipccl_encode(
            x.device.index,
            _kind(fmt, table, block),
            x.data_ptr(),
            out.data_ptr(),
            ctypes.byref(lay),
            _table_tensor(table, x.device).data_ptr(),
            work.data_ptr(),
            head,
            _stream(x.device),
        )
    )
    return work[:1]


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
    checksum: bool = False,
    wait: bool = False,
) -> int:
    """Queue the decode kernel; problems are OR-ed into ``flag`` (int32 on the device), which
    it zeroes first when ``clear``. Nothing syncs: read the flag later (raise_on_flag); or, with
    ``wait``, the call waits for the decode and returns the flag (see :func:`_queue_decode`).
    ``checksum``: the buffer's header carries a values checksum, checked against the output.

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
    size = -1 if payload_bytes is None else payload_bytes
    lay = _layout(fmt, n, block, buf.numel(), size, room, checksum=checksum)
    tab = _table_tensor(table, buf.device).data_ptr()
    kind = _kind(fmt, table, block)
    return _queue_decode(buf, at, out, lay, kind, tab, flag, clear, wait)


def launch_raw_decode(
    buf: torch.Tensor, fmt: FloatFormat, out: torch.Tensor, flag: torch.Tensor, wait: bool = False
) -> int:
    """Queue the copy of a raw-layout buffer with a values checksum into ``out``, checking the
    checksum on the way (the decode kernel's raw branch); a mismatch is OR-ed into ``flag``
    (``wait``: as for :func:`launch_decode`)."""
    _check_dense(buf, out)
    lay = _layout(fmt, out.numel(), MAX_BLOCK, buf.numel(), 0, 0, raw=buf.numel(), checksum=True)
    return _queue_decode(buf, buf.data_ptr(), out, lay, KIND[fmt.name], None, flag, False, wait)


def _queue_decode(
    buf: torch.Tensor,
    payload_at: int,
    out: torch.Tensor,
    lay: Layout,
    kind: int,
    table_at: int | None,
    flag: torch.Tensor,
    clear: bool,
    wait: bool = False,
) -> int:
    """One zipccl_decode launch on the buffer's device and current stream (the payload stream
    and the table words at device addresses); an accumulator goes with a layout that checks
    the values checksum. ``wait``: the same call then waits for the decode (one stream sync: the
    kernel stores a notice in mapped host memory where it reports a problem, and only then is the
    flag copied) and returns the flag, which must be zero and is left zero; else returns 0 at
    once. A wait cannot be captured in a CUDA graph: ValueError."""
    lib = _lib()
    assert lib is not None
    device = buf.device
    stream = _stream(device)
    if wait and torch._C._cuda_isCurrentStreamCapturing():
        raise ValueError(
            "a validating decode (sync=True) waits for the device, which a CUDA graph capture "
            "cannot: capture decompress(..., sync=False) and call check_errors() after replays"
        )
    result = ctypes.c_int(0)
    _check(
        lib.zipccl_decode(
            device.index,
            kind,
            buf.data_ptr(),
            payload_at,
            out.data_ptr(),
            ctypes.byref(lay),
            table_at,
            flag.data_ptr(),
            int(clear),
            _accumulator(device, stream) if lay.checksum else None,
            stream,
            ctypes.byref(result) if wait else None,
        )
    )
    return result.value


def launch_summary(
    x: torch.Tensor, fmt: FloatFormat, stride: int, count: int, out: torch.Tensor
) -> None:
    """Queue codec.sample_summary of the contiguous ``x`` (``count`` values ``stride`` apart)
    into the int64 ``out``: one kernel, no host sync (torch's bincount would sync twice)."""
    _check_dense(x, out)
    lib = _lib()
    assert lib is not None
    _check(
        lib.zipccl_summary(
            x.device.index,
            KIND[fmt.name],
            x.data_ptr(),
            stride,
            count,
            out.data_ptr(),
            _stream(x.device),
        )
    )


def raise_on_flag(code: int) -> None:
    if code:
        why = "; ".join(msg for bit, msg in ERRORS.items() if code & bit)
        raise ValueError(f"corrupt compressed buffer: {why}")


# ---------------------------------------------------------------------- the device-side codec
# a compressed buffer's record: int64 [bytes, payload], then the table words
META_BYTES = 16 + 4 * GPU_TABLE_WORDS


@dataclass(frozen=True, eq=False)
class Plan:
    """Everything a device-side compress or decompress of one format, shape and block on one device
    needs that does not depend on the data, made once: sizes, the kernels' layouts, golden.theory's
    sample (every ``stride``-th value, ``count`` of them) and golden's two headers on the device."""

    fmt: FloatFormat
    numel: int
    block: int
    cap: int  # the raw layout's size: the most a buffer can take
    fixed: int  # the split layout's bytes before its payload
    meta_at: int  # where codec.compress puts the buffer's META_BYTES record in its allocation
    stride: int
    count: int
    encode: Layout
    decode: Layout
    work_bytes: int
    split_head: torch.Tensor  # golden's split header, payload size and table zero
    raw_head: torch.Tensor  # golden's raw header, complete (without a checksum)
    staircases: torch.Tensor  # FP8's default-table family on the device (_staircases)
    checksum: bool  # the buffers carry the values checksum (the headers' flag is set)
    device_index: int
    # the launches' per-plan arguments, made once (each costs host time per call)
    encode_ref: object = field(init=False, repr=False)  # ctypes.byref(encode)
    args: CompressPlan = field(init=False, repr=False)
    args_ref: object = field(init=False, repr=False)  # ctypes.byref(args)

    def __post_init__(self) -> None:
        put = functools.partial(object.__setattr__, self)
        put("encode_ref", ctypes.byref(self.encode))
        args = CompressPlan(
            ctypes.pointer(self.encode),
            self.split_head.data_ptr(),
            self.raw_head.data_ptr(),
            self.staircases.data_ptr(),
            self.stride,
            self.count,
            self.device_index,
            self.staircases.numel() // NUM_REGIONS,
        )
        put("args", args)
        put("args_ref", ctypes.byref(args))

    @property
    def split_possible(self) -> bool:
        """Tiny tensors cannot be smaller split: they are stored raw without encoding."""
        return self.fixed < self.cap


def plan(
    fmt: FloatFormat,
    shape: tuple[int, ...],
    block: int,
    device: torch.device,
    checksum: bool = False,
) -> Plan:
    """The Plan of ``fmt`` tensors of ``shape`` in blocks of ``block`` on ``device``, made once
    (cached by the format's name: a FloatFormat hashes all its fields on every lookup; and by
    host thread, as the plan's header templates are uploads: _uploaded)."""
    return _plan(fmt.name, shape, block, device, checksum, threading.get_ident())


@functools.lru_cache(maxsize=256)
def _plan(
    name: str, shape: tuple[int, ...], block: int, device: torch.device, checksum: bool, thread: int
) -> Plan:
    fmt = get_format(name)
    n = 1
    for d in shape:
        n *= d
    cap, fixed = raw_size(fmt, n), _payload_at(fmt, n, block)
    stride = max(1, n // theory.SAMPLE_SIZE)  # golden.theory.sample_indices
    lib = _lib()
    assert lib is not None
    check = 0 if checksum else None  # a zero checksum with its flag: the kernels write it
    split = Header(LAYOUT_SPLIT, fmt, tuple(shape), block, 0, None, check).pack()
    raw = Header(LAYOUT_RAW, fmt, tuple(shape), block, 0, None, check).pack()
    return Plan(
        fmt,
        n,
        block,
        cap,
        fixed,
        meta_at=-(-cap // 16) * 16,
        stride=stride,
        count=min(theory.SAMPLE_SIZE, -(-n // stride)),
        encode=_layout(fmt, n, block, cap, 0, 0, cap, checksum),
        decode=_layout(fmt, n, block, cap, -1, max(cap - fixed, 0), cap, checksum),
        work_bytes=align(lib.zipccl_work_bytes(num_blocks(n, block), block)),
        split_head=_header_tensor(split, device),
        raw_head=_header_tensor(raw, device),
        staircases=_staircases(device),
        checksum=checksum,
        device_index=device.index,
    )


_THREAD = threading.local()


def _kept(name: str) -> dict:
    """This host thread's dict ``name`` of device buffers kept between calls (created empty)."""
    kept = getattr(_THREAD, name, None)
    if kept is None:
        kept = {}
        setattr(_THREAD, name, kept)
    return kept


SCRATCH_WORK_AT = 2048  # codec.cu kScratchWorkAt: header stage and theory control come first


def _scratch(device: int, stream: int, p: Plan) -> int:
    """Scratch for the compresses of this host thread on one stream, which run in order on the
    device (the address): allocated zeroed, since its table-kernel control must be zero when a
    call starts, and the kernels leave it so (codec.cu zipccl_compress). A call inside a CUDA
    graph capture takes :func:`_fresh_scratch` instead (the launcher says when)."""
    kept = _kept("scratch")
    scratch = kept.get((device, stream))
    if scratch is None or scratch.numel() < SCRATCH_WORK_AT + p.work_bytes:
        scratch = kept[device, stream] = _fresh_scratch(p)
    return scratch.data_ptr()


def _fresh_scratch(p: Plan) -> torch.Tensor:
    """A zeroed scratch of one call's own; inside a capture, from the graph's pool and zeroed
    inside the graph, so that replays share nothing with other work."""
    size = SCRATCH_WORK_AT + p.work_bytes
    return torch.zeros(size, dtype=torch.uint8, device=p.split_head.device)


def _accumulator(device: torch.device, stream: int) -> int:
    """The decoder's checksum accumulator (3 uint32, zero; every decode leaves it zero) for one
    host thread and stream, whose decodes run in order; inside a CUDA graph capture, a new one
    from the graph's pool per call (zeroed inside the graph). Returns its address."""
    if torch._C._cuda_isCurrentStreamCapturing():
        return torch.zeros(4, dtype=torch.int32, device=device).data_ptr()
    kept = _kept("accumulators")
    key = (device.index, stream)
    if key not in kept:
        kept[key] = torch.zeros(4, dtype=torch.int32, device=device)
    return kept[key].data_ptr()


def seal_raw(x: torch.Tensor, p: Plan, out: torch.Tensor) -> None:
    """Queue the raw layout with a values checksum of the contiguous ``x`` (a tensor too small
    for the split layout) into ``out``: one kernel copies, sums and writes the header."""
    assert _LIB is not None and p.checksum  # loaded: the plan p was made with it
    _check(
        _LIB.zipccl_seal_raw(
            x.device.index,
            x.data_ptr(),
            out.data_ptr(),
            p.encode_ref,
            p.args.raw_head,
            _stream(x.device),
        )
    )


def compress(
    x: torch.Tensor,
    p: Plan,
    table: Codebook | None,
    header: bytes | None,
    out: torch.Tensor,
    meta: int,
    device: torch.device,
) -> None:
    """Queue codec.compress of the contiguous ``x`` (on ``device``) into ``out`` (>= p.cap
    bytes): one call that launches every kernel, no host sync. ``meta``: the device address of a
    META_BYTES record that gets [buffer bytes, payload bytes] and, for ``table`` None, the
    default table's words (built on the device: golden.theory's table, or FP8's staircase
    table); a given ``table`` comes with its split ``header`` template."""
    stream = _stream(device)
    if table is None:
        tab = head = None
    else:
        tab = _table_tensor(table, device).data_ptr()
        assert header is not None  # a given table comes with its header template
        head = _header_tensor(header, device).data_ptr()
    kind = _kind(p.fmt, table, p.block)
    assert _LIB is not None  # loaded: the plan p was made with it
    at = x.data_ptr(), out.data_ptr(), meta
    rc = _LIB.zipccl_compress(
        p.args_ref, kind, *at, _scratch(p.device_index, stream, p), 0, tab, head, stream
    )
    if rc == CAPTURING:
        scratch = _fresh_scratch(p).data_ptr()
        rc = _LIB.zipccl_compress(p.args_ref, kind, *at, scratch, 1, tab, head, stream)
    _check(rc)


def decompress(
    buf: torch.Tensor,
    p: Plan,
    table: Codebook | None,
    meta: int,
    out: torch.Tensor,
    flag: torch.Tensor,
    clear: bool,
    wait: bool = False,
) -> int:
    """Queue the decode of a buffer that :func:`compress` wrote (layout and payload size read
    from its header on the device); ``table`` None: the default table whose words are in the
    record at ``meta``. Problems are OR-ed into ``flag`` (zeroed first when ``clear``), a values
    checksum mismatch too where the plan has one. ``wait``: as for :func:`launch_decode`."""
    tab = meta + 16 if table is None else _table_tensor(table, buf.device).data_ptr()
    kind = _kind(p.fmt, table, p.block)
    at = buf.data_ptr() + p.fixed
    return _queue_decode(buf, at, out, p.decode, kind, tab, flag, clear, wait)


def wait_flag(device: torch.device) -> torch.Tensor:
    """The flag of this host thread's validating (``wait``) decodes on ``device``: zero, and
    left zero by each of them, so that no call clears it first; each waits for its decode, so
    one flag serves every stream."""
    kept = _kept("wait_flags")
    flag = kept.get(device.index)
    if flag is None:
        flag = kept[device.index] = torch.zeros(1, dtype=torch.int32, device=device)
        torch.cuda.synchronize(device)  # zero before a decode on any stream reads it
    return flag
