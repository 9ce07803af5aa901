"""How a piece travels: golden's split layout in a *slot* whose width both ends compute before
any data moves, from the exchanged sample summaries or from what the plan's calls measured.

:class:`Agreed` is what every rank knows after the descriptor exchange; :func:`pack` queues a
piece into its slot, :class:`Unpack` decodes received slots as they land and, after the last
data collective, reads what only the headers and the decoders can tell in one host copy.
"""

from __future__ import annotations

import math
import threading
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import NamedTuple

import numpy as np
import torch

from zipccl import _plans, codec, settings
from zipccl._codecs import QueuedCodec
from zipccl.collectives import _exchange, _transport
from zipccl.golden import theory
from zipccl.golden.codebook import Codebook
from zipccl.golden.container import (
    CHECKSUM_AT,
    CRC_AT,
    DEFAULT_BLOCK,
    HEADER_BYTES,
    LAYOUT_SPLIT,
    PAYLOAD_BYTES_AT,
    Header,
    Sections,
)
from zipccl.golden.formats import FloatFormat

BYTE_VIEW = {torch.float8_e4m3fn, torch.float8_e5m2}  # gloo cannot move fp8: send the bytes


class WireStats(threading.local):
    """Bytes this rank handed to the transport for other ranks inside zipccl (benchmarks), and
    the last top-level call's strategy; per thread, as calls run concurrently on the backend's
    lanes (zipccl._lanes)."""

    def __init__(self) -> None:
        self.sent = 0
        self.strategy = ""

    def reset(self) -> None:
        self.sent, self.strategy = 0, ""


STATS = WireStats()


SLOT_ALIGN = 256  # every piece's size on the wire: NCCL moves odd sizes far slower (run D)


MARGIN = {False: 1.25, True: 1.05}  # payload room / predicted payload: exponent formats, FP8


#  payload room / the largest payload the plan's calls measured: exponent formats, FP8. An
#  exponent format's payload (its escapes) is a few percent of the piece and varies by more than
#  5 % from call to call (gradients), and an overflow resends the whole piece raw: a quarter of
#  the payload is cheap room. FP8's payload is most of the piece, and steadier.
MEASURED_MARGIN = {False: 1.25, True: 1.05}


SLACK = 256  # bytes of payload room on top of the margin


@dataclass(frozen=True)
class Carried:
    """Every rank's input as a small call's descriptor exchange carried it (host transports):
    row r of ``data`` starts with rank r's input bytes; ``fields``: every rank's op fields (an
    all-to-all's splits). The op completes from it: no second round."""

    data: np.ndarray  # (world, bytes) uint8: at least the largest input of any rank
    fields: np.ndarray  # (world, op fields) int64

    def piece(self, rank: int, dtype: torch.dtype, start: int, numel: int) -> torch.Tensor:
        """Values ``start .. start + numel`` of ``rank``'s input, as ``dtype`` (a view)."""
        return torch.from_numpy(self.data[rank]).view(dtype)[start : start + numel]

    def pieces(self, dtype: torch.dtype, start: int, numel: int) -> list[torch.Tensor]:
        """The same values of every rank's input, in rank order."""
        return list(torch.from_numpy(self.data).view(dtype)[:, start : start + numel])

    def stack_into(self, out: torch.Tensor, start: int, nbytes: int) -> None:
        """Bytes ``start .. start + nbytes`` of every rank's input, rank after rank, into the
        contiguous ``out`` (of world x nbytes bytes)."""
        _bytes_into(out, self.data[:, start : start + nbytes])

    def copy_into(self, out: torch.Tensor, rank: int, nbytes: int) -> None:
        """The first ``nbytes`` bytes of ``rank``'s input into the contiguous ``out`` (of as
        many bytes)."""
        _bytes_into(out, self.data[rank, :nbytes])


def _bytes_into(out: torch.Tensor, data: np.ndarray) -> None:
    """Carried bytes into the contiguous ``out`` (of as many bytes): one copy, in numpy on the
    host (a torch copy of a few KiB, with the views it needs, costs several times more)."""
    flat = out.reshape(-1).view(torch.uint8)
    if flat.device.type == "cpu":
        flat.detach().numpy().reshape(data.shape)[:] = data
    else:  # a staged group's device tensor
        flat.copy_(torch.from_numpy(np.ascontiguousarray(data)).view(-1))


@dataclass(frozen=True)
class Agreed:
    """What every rank knows after the descriptor exchange, or on a key's later calls from the
    plan its previous call left (zipccl._plans)."""

    g: _transport.Group
    name: str  # the op the caller called, for error messages
    strategy: str  # switch.NATIVE | A2A_REDUCE | COMPRESSED
    table: Codebook | None
    chunks: int
    sources: tuple[Source, ...] = ()  # every rank's (table, predicted payload): compressed only
    #  payload bytes of each split piece (by Unpack's keys), the most the plan's calls measured;
    #  None: the pieces are sized by the sources' prediction (a first call)
    sizes: Mapping[object, int] | None = None
    halves: tuple[Agreed, ...] = ()  # a compressed all-reduce's reduce-scatter and all-gather
    #  a packed call's (Packed) pieces and every piece's exact payload bytes, by Unpack's keys
    packed: Packed | None = None
    payloads: Mapping[object, int] | None = None
    ticket: _plans.Ticket | None = None  # where a compressed call keeps what it measured
    carried: Carried | None = None  # every rank's input, where the exchange carried it
    #  a native repeat's input on its way to pinned memory since before the exchange (a staged
    #  group's call without async_op: the op then runs on the host bytes, _transport.Prestaged)
    down: _transport.Prestaged | None = None
    #  a piece of the call outgrew its room on some rank (every rank knows it alike): where the
    #  call ran on a plan, the plan's tables no longer fit the data (zipccl._plans: drop)
    overflowed: bool = False

    def measured(self, m: Measured) -> Agreed:
        """``self`` with what its compressed call's headers told: the next call sizes each piece
        by the largest payload the plan's calls have measured of it, as a piece's payload varies
        from call to call (a sparse gradient's zeros), and each overflow costs a raw resend."""
        seen = self.sizes or {}
        sizes = {k: max(size, seen.get(k, 0)) for k, size in m.sizes.items()}
        return replace(self, sizes=sizes, overflowed=m.overflowed)

    def seg(self, key: object, dtype: torch.dtype, numel: int, rank: int) -> Seg:
        """How the piece ``key`` of ``numel`` values from group rank ``rank`` travels: a packed
        call's in exactly its payload; else with room for its payload as the plan's calls
        measured it (raw where one went raw), else as ``rank``'s sample predicts it. Both ends
        compute the same: they read the same exchanged sizes or header, or the same summary."""
        if self.payloads is not None:
            return make_seg(dtype, numel, self.payloads[key] if numel else None)
        if self.sizes is None:
            return make_seg(dtype, numel, _predicted_room(dtype, numel, self.sources[rank]))
        size = self.sizes.get(key)
        if size is None:
            return make_seg(dtype, numel, None)
        margin = MEASURED_MARGIN[codec._fmt(dtype).byte_coded]
        return make_seg(dtype, numel, math.ceil(size * margin) + SLACK)


class Packed:
    """A planned all-gather's pieces (one per chunk, keys ``(chunk, rank)`` as Unpack's),
    encoded before the call's exchange on a host transport, under this rank's table from its
    own sample now, each in a store with room for any payload: the exchange row carries the
    summary and the payload sizes (:meth:`fill`), so every rank builds every rank's table from
    the data it codes and sizes every piece exactly before any data moves (:meth:`agreed`). No
    piece outgrows its room, and no table outlives its data: a plan's tables and measured
    rooms, kept for its calls, did not fit gradients that drift from step to step (every DDP
    bucket's all-reduce overflowed and went again raw).

    The work runs inside :meth:`fill`, which the exchange calls: where it raises, the rank still
    sends its row, reporting the failure, and every rank raises."""

    def __init__(self, a: Agreed, x: torch.Tensor) -> None:
        self.a, self.x = a, x
        self.stores: list[torch.Tensor] = []

    def fill(self, out: torch.Tensor) -> None:
        dtype, summary = self.x.dtype, out[: codec.SUMMARY_WORDS]
        codec.sample_summary(self.x, summary)
        own = sources(dtype, summary.cpu().numpy()[None], self.a.table)[0].table
        parts = pieces(self.x.numel(), self.a.chunks)
        segs = [open_seg(dtype, m) for _, m in parts]
        self.stores = buffers([seg.width for seg in segs], self.x.device)
        for (start, m), seg, store in zip(parts, segs, self.stores, strict=True):
            pack(self.x[start : start + m], seg, own, store)
        at = PAYLOAD_BYTES_AT
        fields = [
            st.new_zeros(8) if seg.raw else st[at : at + 8]
            for st, seg in zip(self.stores, segs, strict=True)
        ]
        sizes = out[codec.SUMMARY_WORDS :]
        sizes.zero_()
        sizes[: len(parts)].copy_(torch.cat(fields).view(torch.int64))

    def agreed(self, a: Agreed, tails: np.ndarray) -> Agreed:
        """``a`` (the plan's outcome) with every rank's table from its summary and every piece's
        payload from its size, as the exchange's ``tails`` (a row per rank: summary, sizes)
        carried them; a size no encoder writes raises on every rank alike."""
        dtype, numel, world = self.x.dtype, self.x.numel(), len(tails)
        sizes = tails[:, codec.SUMMARY_WORDS :]
        payloads: dict[object, int] = {}
        for k, (_, m) in enumerate(pieces(numel, a.chunks)):
            for r in range(world):
                size = int(sizes[r, k])
                if not 0 <= size <= m + -(-m // DEFAULT_BLOCK):  # a byte a value, at most
                    raise ValueError(f"rank {r} sent a corrupt payload size {size} for {m} values")
                payloads[(k, r)] = size
        found = sources(dtype, tails[:, : codec.SUMMARY_WORDS], a.table)
        return replace(a, sources=found, payloads=payloads, packed=self)


def open_seg(dtype: torch.dtype, numel: int) -> Seg:
    """The split layout with room for any payload whose piece could travel split (a store at
    least the raw values' size): a piece encoded before its room is agreed."""
    if numel == 0:
        return Seg(0, 0, 0)
    fmt = codec._fmt(dtype)
    fixed = codec._fixed(fmt, numel, DEFAULT_BLOCK)
    return Seg(numel, fixed, max(_aligned(numel * fmt.bits // 8), _aligned(fixed + SLACK)))


def flat(t: torch.Tensor) -> torch.Tensor:
    return t.view(-1)


def as_wire(t: torch.Tensor) -> torch.Tensor:
    """The tensor as torch.distributed can move it on every backend (fp8 as bytes)."""
    return t.view(torch.uint8) if t.dtype in BYTE_VIEW else t


def pieces(numel: int, chunks: int) -> list[tuple[int, int]]:
    """``chunks`` near-equal (start, length) pieces of ``numel``; both ends compute the same."""
    bounds = [numel * k // chunks for k in range(chunks + 1)]
    return [(bounds[k], bounds[k + 1] - bounds[k]) for k in range(chunks)]


def segments(flat: torch.Tensor, sizes: Sequence[int]) -> list[torch.Tensor]:
    out, at = [], 0
    for size in sizes:
        out.append(flat[at : at + size])
        at += size
    return out


def buffers(sizes: Sequence[int], device: torch.device) -> list[torch.Tensor]:
    """Views of one uint8 allocation, one per size: a call's buffers in one go, not per chunk."""
    return segments(torch.empty(sum(sizes), dtype=torch.uint8, device=device), sizes)


_TABLES: dict[Codebook, Codebook] = {}


def canonical(table: Codebook) -> Codebook:
    """One object per distinct table, so the codec's per-object device copy of it is reused."""
    if len(_TABLES) >= 1 << 12:  # theory tables are few, but a caller's own need not be
        _TABLES.clear()
    return _TABLES.setdefault(table, table)


@dataclass(frozen=True)
class Source:
    """One rank's data as every rank knows it after the exchange: the table it encodes with and
    the payload bits per value that its sample spends under that table."""

    table: Codebook
    bits: float


def sources(
    dtype: torch.dtype, summaries: np.ndarray, table: Codebook | None
) -> tuple[Source, ...]:
    """Every rank's :class:`Source` from the exchanged sample summaries (codec.sample_summary):
    the agreed ``table``, else each rank's theory table -- built alike on every rank."""
    found = []
    for rank, row in enumerate(summaries):
        _check_summary(rank, row)
        book = canonical(table if table is not None else codec.summary_table(dtype, row))
        found.append(Source(book, codec.payload_bits(book, row)))
    return tuple(found)


def _check_summary(rank: int, row: np.ndarray) -> None:
    """A summary sizes every rank's buffers, and every rank sees the same rows: one no sample
    gives (negative or too many counts, negative or non-finite sums) raises on every rank."""
    counts, sums = row[3:], row[:3].astype(np.int64).view(np.float64)
    fits = counts.min() >= 0 and counts.max() <= theory.SAMPLE_SIZE
    total = int(counts.sum()) if fits else -1
    if not (
        0 <= total <= theory.SAMPLE_SIZE
        and np.isfinite(sums).all()
        and sums.min() >= 0
        and sums[1] + sums[2] <= total
    ):
        raise ValueError(
            f"rank {rank} sent a corrupt sample summary: {total} counts, sums "
            f"{sums.tolist()} (at most {theory.SAMPLE_SIZE} values, sums >= 0)"
        )


def summary_fill(sample: torch.Tensor | None) -> Callable[[torch.Tensor], object] | None:
    """What writes a descriptor row's tail: codec.sample_summary of ``sample``; None (zeros)
    where ``sample`` is None (a broadcast's receivers, calls that cannot compress)."""
    if sample is None:
        return None

    def fill(out: torch.Tensor) -> None:
        out[codec.SUMMARY_WORDS :].zero_()  # a packed call's sizes (Packed) go there
        codec.sample_summary(sample, out[: codec.SUMMARY_WORDS])

    return fill


def shared_sources(
    g: _transport.Group,
    name: str,
    dtype: torch.dtype,
    sample: torch.Tensor | None,
    table: Codebook | None,
) -> tuple[Source, ...]:
    """Only the summaries, exchanged: all-reduce's second compressed half, whose shards exist
    only after the first, and the switch's profile of the protocols."""
    rows, _ = _exchange.exchange(
        g, [_exchange.OP_CODES[name], 0], name, codec.SUMMARY_WORDS, summary_fill(sample)
    )
    return sources(dtype, rows[:, 2:], table)


class Measured(NamedTuple):
    """What a compressed call's headers told: every split piece's payload bytes, and whether a
    piece outgrew its room on any rank."""

    sizes: dict[object, int]
    overflowed: bool


@dataclass(frozen=True)
class Seg:
    """How one piece of ``numel`` values travels, as both ends compute it: ``width`` bytes
    holding the split layout's fixed part (``fixed`` bytes) and room for the payload after it,
    or the raw values (``fixed`` 0)."""

    numel: int
    fixed: int
    width: int

    @property
    def raw(self) -> bool:
        return self.fixed == 0

    @property
    def room(self) -> int:
        return self.width - self.fixed


def _aligned(nbytes: int) -> int:
    return -(-nbytes // SLOT_ALIGN) * SLOT_ALIGN


def make_seg(dtype: torch.dtype, numel: int, room: int | None) -> Seg:
    """The split layout with ``room`` bytes for the payload, unless that is no smaller than the
    raw values or ``room`` is None. A collective that moves equal sizes widens every piece to
    the widest one's width (:func:`widened`)."""
    if numel == 0:
        return Seg(0, 0, 0)
    fmt = codec._fmt(dtype)
    raw = _aligned(numel * fmt.bits // 8)
    if room is None:
        return Seg(numel, 0, raw)
    fixed = codec._fixed(fmt, numel, DEFAULT_BLOCK)
    split = _aligned(fixed + room)
    return Seg(numel, 0, raw) if split >= raw else Seg(numel, fixed, split)


def _predicted_room(dtype: torch.dtype, numel: int, src: Source) -> int:
    """Payload room for ``numel`` values as ``src``'s sample predicts them: times MARGIN, plus a
    byte per block and SLACK."""
    fmt = codec._fmt(dtype)
    return (
        math.ceil(src.bits * numel / 8 * MARGIN[fmt.byte_coded])
        + SLACK
        + -(-numel // DEFAULT_BLOCK)
    )


def widened(segs: list[Seg]) -> list[Seg]:
    """The pieces as wide as the widest: the extra bytes are payload room (or unread padding)."""
    width = max(seg.width for seg in segs)
    return [replace(seg, width=width) for seg in segs]


def pack(x: torch.Tensor, seg: Seg, table: Codebook, store: torch.Tensor) -> None:
    """Queue the flat piece ``x`` into its ``seg.width``-byte store as it travels, without a host
    sync: the raw bytes, or golden's split layout (codec.compress_into's buffer for this table)
    whose payload is written only where it fits -- the header tells the receivers either way."""
    if seg.raw:
        store[: x.numel() * x.element_size()].copy_(x.view(torch.uint8))
        return
    fmt, shape = codec._fmt(x.dtype), (x.numel(),)
    checksum = settings.value("ZIPCCL_CHECKSUM")
    backend = codec._backend(x.device, DEFAULT_BLOCK)
    if backend.QUEUES:  # the kernels write golden's header too
        template = codec._header_template(LAYOUT_SPLIT, fmt, shape, DEFAULT_BLOCK, table, checksum)
        backend.launch_encode(x, fmt, table, DEFAULT_BLOCK, store, template, checksum)
        return
    payload = backend.encode_into(x, fmt, table, DEFAULT_BLOCK, store)
    check = codec._values_checksum(x) if checksum else None
    head = Header(LAYOUT_SPLIT, fmt, shape, DEFAULT_BLOCK, payload, table, check)
    codec._write_header(store, head)


def payload_size(head: bytes) -> int:
    return int.from_bytes(head[PAYLOAD_BYTES_AT : PAYLOAD_BYTES_AT + 8], "little")


class Unpack:
    """Decodes one call's received pieces as they land, without a host sync, and then
    (:meth:`settle`) reads, in one copy, what only the headers and the decoders can tell.

    A split piece's payload size is in its header, which the host has not seen when the decode
    is queued: the CUDA kernel reads it there and skips a piece whose payload overflowed its room
    (other backends read the header on the host first). ``note`` registers a header to read
    without decoding (a sender's own pieces): where a payload overflowed, the protocol resends
    the piece raw, and both ends must know.
    """

    def __init__(self, g: _transport.Group, dtype: torch.dtype) -> None:
        self.fmt = codec._fmt(dtype)
        self.checksum: bool = settings.value("ZIPCCL_CHECKSUM")  # the pieces carry one
        self.flag = _flag(g.device) if g.cuda else None  # zeroed by the call's first decode
        self.used: QueuedCodec | None = None  # the backend whose decodes set the flag
        self.heads: dict[object, tuple[torch.Tensor, Seg, Codebook]] = {}
        self.sizes: dict[object, int] = {}  # after settle: every noted piece's payload bytes

    def note(self, key: object, got: torch.Tensor, seg: Seg, table: Codebook) -> None:
        if not seg.raw and seg.numel:
            self.heads[key] = (got[:HEADER_BYTES], seg, table)

    def __call__(
        self, key: object, got: torch.Tensor, seg: Seg, table: Codebook, out: torch.Tensor
    ) -> None:
        """Decode the piece ``got`` (at least ``seg.width`` bytes, as received) into the
        contiguous ``out``."""
        if seg.raw:
            flat(out).view(torch.uint8).copy_(got[: out.numel() * out.element_size()])
            return
        self.note(key, got, seg, table)
        backend = codec._backend(got.device, DEFAULT_BLOCK)
        if backend.QUEUES:
            assert self.flag is not None  # (queued codecs run on CUDA groups, which keep a flag)
            backend.launch_decode(
                got[: seg.fixed],
                self.fmt,
                table,
                DEFAULT_BLOCK,
                None,
                out,
                self.flag,
                clear=self.used is None,
                payload=got[seg.fixed : seg.width],
                checksum=self.checksum,
            )
            self.used = backend
            return
        head = got[:HEADER_BYTES].cpu().numpy().tobytes()
        size = payload_size(head)
        if size <= seg.room:  # else resent raw after settle
            _check_gaps(got, self.fmt, seg.numel)
            backend.decode_into(got[: seg.fixed + size], self.fmt, table, DEFAULT_BLOCK, size, out)
            if self.checksum:
                codec._check_values(out, _stored_checksum(head))

    def settle(self, streams: _transport.Streams) -> set[object]:
        """After every decode: one copy of the flag and the noted headers to the host; raise
        ValueError on a corrupt piece; return the keys of the pieces whose payload overflowed
        (and keep every noted piece's payload size in :attr:`sizes`: the next call of the same
        key sizes its pieces by them)."""
        keys = list(self.heads)
        parts = [self.heads[k][0] for k in keys]
        if self.used is not None:
            assert self.flag is not None  # a backend used the flag
            parts.append(self.flag.view(torch.uint8))
        raw = read_back(streams, parts)
        if self.used is not None:
            self.used.raise_on_flag(int(raw[-4:].view(np.int32)[0]) & ~self.used.ROOM_ERROR)
        over = set()
        for i, key in enumerate(keys):
            _, seg, table = self.heads[key]
            head = raw[i * HEADER_BYTES : (i + 1) * HEADER_BYTES].tobytes()
            checked = checked_header(head, self.fmt, seg.numel, table, self.checksum)
            self.sizes[key] = payload_size(checked)
            if self.sizes[key] > seg.room:
                over.add(key)
        return over


def _check_gaps(got: torch.Tensor, fmt: FloatFormat, numel: int) -> None:
    """A received piece's alignment gaps must be zero, as every decoder of the format requires
    (the CUDA kernel checks them itself; the host decode does not)."""
    for lo, hi in Sections.of(fmt, numel, DEFAULT_BLOCK).gaps:
        if got[lo:hi].any():
            raise ValueError(
                f"received a corrupt piece: alignment gap bytes {lo}..{hi} are not zero"
            )


def _flag(device: torch.device) -> torch.Tensor:
    """The decoders' int32 error flag on ``device``, one per thread: a call reads it back (and so
    waits for it) before it returns, and the next call's first decode zeroes it."""
    return _transport.per_thread(
        ("flag", device), lambda: torch.zeros(1, dtype=torch.int32, device=device)
    )


def _stored_checksum(head: bytes) -> int:
    return int.from_bytes(head[CHECKSUM_AT : CHECKSUM_AT + 8], "little")


def checked_header(
    head: bytes, fmt: FloatFormat, numel: int, table: Codebook, checksum: bool = False
) -> bytes:
    """``head`` if it is golden's split-layout header of ``numel`` values under ``table`` (any
    payload size; with ``checksum``, the checksum flag and any checksum); ValueError otherwise."""
    want = codec._header_template(LAYOUT_SPLIT, fmt, (numel,), DEFAULT_BLOCK, table, checksum)
    fields = bytearray(head[:CRC_AT])
    fields[PAYLOAD_BYTES_AT : PAYLOAD_BYTES_AT + 8] = bytes(8)
    if checksum:
        fields[CHECKSUM_AT : CHECKSUM_AT + 8] = bytes(8)
    if fields != want[:CRC_AT] or int.from_bytes(head[CRC_AT:], "little") != zlib.crc32(
        head[:CRC_AT]
    ):
        raise ValueError(
            f"received a corrupt compressed header: not the split layout of {numel} "
            f"{fmt.name} values under the agreed table"
        )
    return head


def read_back(streams: _transport.Streams, parts: Sequence[torch.Tensor]) -> np.ndarray:
    """The bytes of device tensors on the host in one copy: a call's one sync between its exchange
    and its agreement. Runs on the decompress stream after the compress stream's queued work."""
    if not parts:
        return np.empty(0, dtype=np.uint8)
    if streams.decompress is not None:
        assert streams.compress is not None  # streams_for makes both or neither
        streams.decompress.wait_stream(streams.compress)
    with streams.on(streams.decompress):
        return torch.cat([t.reshape(-1).view(torch.uint8) for t in parts]).cpu().numpy()
