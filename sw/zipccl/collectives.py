"""Compressed collectives with torch.distributed's signatures and results.

Every op is a drop-in for its torch.distributed namesake (same arguments, same result tensor
contents) plus two keyword-only extras: ``table`` (a Codebook every rank must pass identically;
default: each rank's own theory table, carried inside its buffers) and ``verify``.

The native fast path: each call first takes a *local* decision from values every rank shares in a
correct program -- op, dtype, the collective's size, reduce op, world size, ``ZIPCCL_MODE`` and
the rank-agreed switch profile -- cached per group and call shape, so it is a few dict lookups.
When that decision is native and no verification is asked for, zipccl calls the torch.distributed
op with the caller's own tensors and ``async_op`` and returns torch's own Work: no descriptor, no
allocation, no copy, no sync.

Verification (``verify=`` overrides ``ZIPCCL_VERIFY``): the descriptor exchange -- one small
all-gather and a host sync -- turns mismatched calls (dtype, sizes, splits, table, src, reduce op,
mode, different ops) into a CollectiveMismatchError on every rank.

* ``auto`` (default): verify every call that takes zipccl's own protocols (compressed,
  a2a_reduce) -- there a mismatch would otherwise hang or corrupt -- and hand native calls
  straight to torch, whose behaviour on mismatched arguments is then exactly torch's.
* ``1``: verify every call (debug mode); ``0``: never (the DDP hook, whose buckets DDP already
  keeps identical). ``ZIPCCL_MODE=never`` bypasses zipccl altogether, verification included.
* all_to_all_single with explicit splits exchanges the descriptor whenever the profile could
  compress it, whatever the policy: per-rank sizes differ, and the ranks must agree on the
  strategy and chunk count (see its docstring).

Protocols (the compressed buffer is golden/container.py's: a *fixed part* -- header, raw planes,
prefix planes, block offsets -- whose size follows from dtype and numel alone, then a variable
*payload* stream whose length is in the header):

* all-gather / broadcast: phase 1 moves the fixed parts (sizes known to all, no size exchange
  first); the headers they carry tell every rank every payload length, so phase 2 moves the
  payloads (all-gather: padded to the largest, the padding never decoded; broadcast: exact).
* all-to-all (uneven splits): phase 1 all-to-all of the fixed parts of every (src, dst) piece,
  whose sizes both ends compute from the agreed splits; phase 2 all-to-all of the payloads with
  the exact split sizes read from the received headers. Between two ranks each phase is one
  all-gather of the outgoing piece padded to the larger of the two (:func:`_swap`): both ranks
  know both sizes, and NCCL's all-gather outruns its all-to-all over sockets.
* reduce-scatter: all-to-all of the W row blocks (native, or the compressed protocol above), then
  a local reduction in fp32 in rank order 0..W-1, rounded once -- deterministic and equal to
  :func:`reference_reduce`. With W = 2 NCCL's native reduce-scatter gives the same bits (one
  correctly rounded operation), so the switch may take it; with W > 2 it does not, so auto mode
  there is *not* the backend's reduce-scatter (and pays the verification of its own protocol).
  ``ZIPCCL_NATIVE_REDUCE=1`` lets auto take the backend's reduce-scatter / all-reduce for any W
  where the cost model prefers it, trading rank-order determinism for speed.
* all-reduce: reduce-scatter + all-gather on a flat copy padded to a multiple of W.

Large messages go in chunks, pipelined over three CUDA streams: compress, NCCL's own,
decompress. In ``auto`` mode on CUDA the switch's cost model picks the chunk count
(``switch.best_chunks``: every chunk pays its collectives' latencies, so fast links get few);
``ZIPCCL_CHUNK_BYTES`` fixes the chunk size instead (default 32 MiB on CUDA, the ``always``
mode's). Host-side costs of one compressed call:

* once per call: the theory table (``codec.sample_stats`` on the device: three scalars to the
  host, one sync), one allocation for all chunks' compressed stores and (all-gather, broadcast,
  all-to-all of more than two ranks) one for all chunks' received fixed parts, the descriptor
  exchange where verified (one sync), and one read of the decoders' error flag at the end (one
  sync). A peer's table reaches the device through pinned memory, queued: a decode never waits
  on the host for its own transfer;
* per chunk: the encode is queued ``AHEAD`` (2) chunks early without a host sync (the CUDA
  kernel leaves the payload size on the device), and *one* device-to-host copy -- the only host
  sync per chunk -- reads chunk k's received headers together with chunk k+2's payload sizes;
  then chunk k+2 is sealed (on CUDA the encode kernels already wrote golden's split header;
  the host writes it only for the raw layout, where split does not shrink, or other backends) and
  its fixed parts sent, so the wire always has a later chunk queued behind the one the host waits
  for. Plus one sync for the first two chunks' sizes: chunks + 1 in all. Per chunk there is
  still one allocation (the payloads' receive buffer, sized by the headers; two ranks'
  all-to-all: both phases' buffers);
* phase-2 collectives are issued from the compress stream, so the wire never waits for the
  decompress stream's decodes; their send buffers are views of the stores (no copy; between
  two ranks a piece smaller than the peer's is copied into a padded buffer when its store ends
  before the agreed width);
* decoding takes each received buffer as its fixed part plus its payload: on CUDA the kernel
  reads the two apart, a raw buffer is two copies into the output; only the torch backend (CPU)
  joins them into one buffer first.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch
import torch.distributed as dist

from golden.codebook import Codebook
from golden.container import (
    DEFAULT_BLOCK,
    HEADER_BYTES,
    LAYOUT_RAW,
    LAYOUT_SPLIT,
    Header,
    raw_size,
    split_size,
)
from zipccl import codec, switch
from zipccl._comm import (
    CODEC_DTYPES,
    CollectiveMismatchError,
    DoneWork,
    Group,
    Streams,
    dtype_code,
    dtype_name,
    exchange,
    ordered,
    require_same,
    resolve,
    streams_for,
    to_i64,
)

ReduceOp = dist.ReduceOp
_OP_CODES = {"all_gather": 1, "all_to_all": 2, "reduce_scatter": 3, "all_reduce": 4,
             "broadcast": 5}
_MODE_CODES = {m: i for i, m in enumerate(switch.MODES)}
_LOCAL_OPS = {ReduceOp.SUM: 0, ReduceOp.AVG: 1, ReduceOp.PRODUCT: 2, ReduceOp.MIN: 3,
              ReduceOp.MAX: 4}
_BYTE_VIEW = {torch.float8_e4m3fn, torch.float8_e5m2}  # gloo cannot move fp8: send the bytes


# --------------------------------------------------------------------------- accounting


@dataclass
class WireStats:
    """Bytes this rank handed to the transport for other ranks inside zipccl (benchmarks)."""

    sent: int = 0
    strategy: str = ""  # the last top-level call's strategy

    def reset(self) -> None:
        self.sent, self.strategy = 0, ""


STATS = WireStats()


# --------------------------------------------------------------------------- agreement


@dataclass(frozen=True)
class _Agreed:
    """What every rank knows after the descriptor exchange."""

    g: Group
    strategy: str  # switch.NATIVE | A2A_REDUCE | COMPRESSED
    table: Codebook | None
    chunks: int


def _table_hash(table: Codebook | None) -> int:
    if table is not None and not isinstance(table, Codebook):
        raise TypeError(f"table must be a golden Codebook or None, got {type(table).__name__}")
    return table.hash64 if table is not None else 0


VERIFY_POLICIES = ("auto", "1", "0")


def verify_policy(verify: bool | None = None) -> str:
    """The verification policy of one call: ``verify`` if given, else ``ZIPCCL_VERIFY``.

    ``auto`` (default): exchange the descriptor for calls that take zipccl's own protocols
    (compressed, a2a_reduce) and hand native calls straight to torch; ``1``: every call (debug);
    ``0``: none.
    """
    if verify is not None:
        return "1" if verify else "0"
    value = os.environ.get("ZIPCCL_VERIFY", "auto").strip().lower() or "auto"
    if value not in VERIFY_POLICIES:
        raise ValueError(f"ZIPCCL_VERIFY must be one of {VERIFY_POLICIES}, got {value!r}")
    return value


def _direct(group: dist.ProcessGroup | None, t: torch.Tensor, name: str, nbytes: int | None,
            red_code: int, verify: bool | None) -> bool:
    """Whether this call goes straight to torch.distributed with the caller's own arguments.

    True when the local decision is native and the policy does not ask for verification
    (``ZIPCCL_MODE=never`` always bypasses zipccl). The decision depends only on values every rank
    shares in a correct program, so no rank can take the other branch.
    """
    env = _env()
    policy = verify_policy(verify) if verify is not None else (
        _RAW_POLICY.get(env[1]) or verify_policy())
    if policy == "1":  # first: the local decision may load the profile, itself a collective
        return switch.mode() == "never"  # that ranks in different modes would not match
    return _local_strategy(group, t, name, nbytes, red_code, env) == switch.NATIVE


_ENV_KEYS = ("ZIPCCL_MODE", "ZIPCCL_VERIFY", "ZIPCCL_CHUNK_BYTES", "ZIPCCL_NATIVE_REDUCE")
_ENV_DATA = getattr(os.environ, "_data", None) if os.name == "posix" else None
_RAW_ENV_KEYS = tuple(k.encode() for k in _ENV_KEYS)
_RAW_POLICY = {None: "auto", b"auto": "auto", b"1": "1", b"0": "0", "auto": "auto", "1": "1",
               "0": "0"}


def _env() -> tuple[object, ...]:
    """The raw values of zipccl's variables, for cache keys. On POSIX read from os.environ's own
    bytes dict: plain dict lookups, several times cheaper than os.environ.get on the hot path."""
    if _ENV_DATA is None:
        return tuple(map(os.environ.get, _ENV_KEYS))
    return tuple(map(_ENV_DATA.get, _RAW_ENV_KEYS))


def _local_strategy(group: dist.ProcessGroup | None, t: torch.Tensor, name: str,
                    nbytes: int | None, red_code: int, env: tuple[object, ...] | None = None
                    ) -> str:
    """:func:`_strategy` from this rank's own (op, dtype, size, reduce op), cached per group
    (switch.group_key: a re-created default group is a new key) and environment (``env``:
    :func:`_env`, read again when None).

    ``nbytes`` None: an all-to-all with explicit splits, whose sizes differ per rank; it is native
    only where the profile never compresses that op and dtype, else AGREE (needs the exchange).
    """
    env = env or _env()
    key = (switch.group_key(group), name, t.dtype, nbytes, red_code, env[0], env[2], env[3])
    found = switch.ROUTES.get(key)
    if found is None:
        g = resolve(group, t)
        found = (_strategy(g, name, t.dtype, nbytes, red_code) if nbytes is not None
                 else _uneven_strategy(g, name, t.dtype))
        if len(switch.ROUTES) >= 1 << 16:
            switch.ROUTES.clear()
        switch.ROUTES[key] = found
    return found


_AGREE = "agree"  # the strategy needs the sizes of every rank (uneven all-to-all)


def _uneven_strategy(g: Group, name: str, dtype: torch.dtype) -> str:
    """NATIVE where no size could make this op compressed, else AGREE."""
    mode = switch.mode()
    if dtype not in CODEC_DTYPES or mode == "never":
        return switch.NATIVE
    if mode == "auto" and not switch.can_compress(switch.profile_for(g), name, dtype, g.world):
        return switch.NATIVE
    return _AGREE


def _agree(g: Group, name: str, dtype: torch.dtype, nbytes: int, err: int,
           fields: Sequence[int], table: Codebook | None, exchange_desc: bool,
           red: ReduceOp | None = None) -> tuple[_Agreed, torch.Tensor | None]:
    """Exchange the descriptor (if asked), check it, pick the strategy from the agreed size."""
    mode = switch.mode()
    red_code = -1 if red is None else _red_code(red)
    head = [_OP_CODES[name], err, dtype_code(dtype), to_i64(_table_hash(table)),
            _MODE_CODES[mode], red_code, nbytes]
    desc = None
    if exchange_desc:  # every op's row has the same length, so even different ops cannot mismatch
        pad = [0] * (_extra_fields(g.world) - len(fields))
        desc = exchange(g, head + list(fields) + pad, name)
        require_same(desc, 2, "the dtype", name, dtype_name)
        require_same(desc, 3, "the table (hash; 0 = each rank's own theory table)", name,
                     lambda h: f"{h % (1 << 64):#018x}")
        require_same(desc, 4, "ZIPCCL_MODE", name, lambda m: switch.MODES[m])
        require_same(desc, 5, "the reduce op", name)
        nbytes = int(desc[:, 6].max())
    strategy, chunks = _plan(g, name, dtype, nbytes, red_code)
    STATS.strategy = strategy
    return _Agreed(g, strategy, table, chunks), (
        desc[:, len(head):] if desc is not None else None)


def _chunks(g: Group, nbytes: int) -> int:
    return max(1, -(-nbytes // switch.chunk_bytes(g.cuda)))


def _extra_fields(world: int) -> int:
    """Op-specific descriptor fields: all-to-all's two split vectors and row size at most."""
    return 2 * world + 1


def _red_code(op: object) -> int:
    """0..4 for the ops zipccl reduces locally, 99 for the rest (PREMUL_SUM, bitwise): native."""
    try:
        return _LOCAL_OPS.get(op, 99)  # type: ignore[call-overload]
    except TypeError:  # an unhashable custom ReduceOp
        return 99


def _strategy(g: Group, name: str, dtype: torch.dtype, nbytes: int, red_code: int) -> str:
    return _plan(g, name, dtype, nbytes, red_code)[0]


def _plan(g: Group, name: str, dtype: torch.dtype, nbytes: int, red_code: int
          ) -> tuple[str, int]:
    """Strategy and chunk count, the same on every rank: they depend only on agreed values and
    the agreed profile. Auto mode on CUDA takes the model's chunk count unless
    ``ZIPCCL_CHUNK_BYTES`` is set (switch.best_chunks)."""
    chunks = _chunks(g, nbytes)
    if dtype not in CODEC_DTYPES or nbytes == 0 or red_code == 99:
        return switch.NATIVE, chunks  # nothing to compress, or an op only the backend implements
    mode = switch.mode()
    if mode != "auto":
        return (switch.COMPRESSED if mode == "always" else switch.NATIVE), chunks
    native_ok = _native_reduce_ok(g, dtype) if name in ("reduce_scatter", "all_reduce") else None
    call = switch.Call(name, nbytes, dtype, g.world, chunks, native_ok)
    profile = switch.profile_for(g)
    if g.cuda and not switch.chunks_given():
        call = replace(call, chunks=switch.best_chunks(profile, call))
    return switch.choose(profile, call), call.chunks


def all_reduce_strategy(tensor: torch.Tensor, op: ReduceOp = ReduceOp.SUM,
                        group: dist.ProcessGroup | None = None) -> str:
    """What :func:`all_reduce` would do with this tensor (without verification): "native",
    "a2a_reduce" or "compressed". Hooks use it to hand native calls straight to torch."""
    nbytes = tensor.numel() * tensor.element_size()
    return _local_strategy(group, tensor, "all_reduce", nbytes, _red_code(op))


def _native_reduce_ok(g: Group, dtype: torch.dtype) -> bool:
    """Native reductions equal the fp32 rank-order one only for two ranks (ZIPCCL_NATIVE_REDUCE=1
    takes them for any world size), and gloo lacks fp8."""
    return (g.world == 2 or switch.native_reduce()) and not (dtype in _BYTE_VIEW and not g.cuda)


# --------------------------------------------------------------------------- helpers


def _flat(t: torch.Tensor) -> torch.Tensor:
    return t.view(-1)


def _wire(t: torch.Tensor) -> torch.Tensor:
    """The tensor as torch.distributed can move it on every backend (fp8 as bytes)."""
    return t.view(torch.uint8) if t.dtype in _BYTE_VIEW else t


def _pieces(numel: int, chunks: int) -> list[tuple[int, int]]:
    """``chunks`` near-equal (start, length) pieces of ``numel``; both ends compute the same."""
    bounds = [numel * k // chunks for k in range(chunks + 1)]
    return [(bounds[k], bounds[k + 1] - bounds[k]) for k in range(chunks)]


@dataclass
class _Packed:
    """One compressed piece in its store: fixed part (``fixed`` bytes) + payload (``nbytes`` in
    all). The store holds max_compressed_bytes, so any receiver-agreed width past the fixed part
    is a view of it (the padding past ``nbytes`` is never decoded)."""

    store: torch.Tensor
    fixed: int
    nbytes: int

    @property
    def head(self) -> torch.Tensor:
        return self.store[: self.fixed]

    @property
    def tail(self) -> torch.Tensor:
        return self.store[self.fixed : max(self.fixed, self.nbytes)]

    def padded_tail(self, width: int) -> torch.Tensor:
        return self.store[self.fixed : self.fixed + width]


def _store_bytes(dtype: torch.dtype, numel: int) -> int:
    return max(codec.fixed_part_bytes(dtype, numel), codec.max_compressed_bytes(dtype, numel))


def _buffers(sizes: Sequence[int], device: torch.device) -> list[torch.Tensor]:
    """Views of one uint8 allocation, one per size: a call's buffers in one go, not per chunk."""
    return _segments(torch.empty(sum(sizes), dtype=torch.uint8, device=device), sizes)


def _launch(x: torch.Tensor, table: Codebook, store: torch.Tensor) -> torch.Tensor:
    """Queue the encode of the contiguous ``x`` into ``store`` without a host sync; returns its
    payload size as a one-element int64 tensor on x's device (the CUDA kernel's own work entry;
    other backends compute it at once). 0 where the split layout cannot beat raw at all."""
    fmt = codec._fmt(x.dtype)
    if codec._fixed(fmt, x.numel(), DEFAULT_BLOCK) >= raw_size(fmt, x.numel()):
        return torch.zeros(1, dtype=torch.int64, device=x.device)
    backend = codec._backend(x.device, DEFAULT_BLOCK)
    if hasattr(backend, "launch_encode"):  # the kernels also write the split-layout header
        head = codec._header_template(LAYOUT_SPLIT, fmt, tuple(x.shape), DEFAULT_BLOCK, table)
        return backend.launch_encode(x, fmt, table, DEFAULT_BLOCK, store, head)
    size = backend.encode_into(x, fmt, table, DEFAULT_BLOCK, store)
    return torch.tensor([size], dtype=torch.int64, device=x.device)


def _seal(x: torch.Tensor, table: Codebook, store: torch.Tensor, payload: int) -> _Packed:
    """Finish a queued encode once its payload size is on the host: golden's header (codec's
    own writer), or the raw layout where split does not shrink -- codec.compress_into's bytes."""
    fmt, shape = codec._fmt(x.dtype), tuple(x.shape)
    fixed, cap = codec._fixed(fmt, x.numel(), DEFAULT_BLOCK), raw_size(fmt, x.numel())
    if fixed + payload >= cap:
        head = Header(LAYOUT_RAW, fmt, shape, DEFAULT_BLOCK, 0, None)
        store[HEADER_BYTES:cap].copy_(x.reshape(-1).view(torch.uint8))
        codec._write_header(store, head)
        return _Packed(store, fixed, cap)
    if not hasattr(codec._backend(x.device, DEFAULT_BLOCK), "launch_encode"):
        codec._write_header(store, Header(LAYOUT_SPLIT, fmt, shape, DEFAULT_BLOCK, payload, table))
    return _Packed(store, fixed, fixed + payload)


def _joined(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    """One send buffer of the pieces in order: the piece itself when it is the only non-empty one
    (every all-to-all of two ranks), else a concatenating copy."""
    live = [p for p in parts if p.numel()]
    return live[0] if len(live) == 1 else torch.cat(list(parts))


_TABLES: dict[int, Codebook] = {}


def _canonical(table: Codebook | None) -> Codebook | None:
    """One object per distinct table, so the codec's per-object device copy of it is reused."""
    if table is None:
        return None
    return _TABLES.setdefault(table.hash64, table)


def _own_table(a: _Agreed, source: torch.Tensor) -> Codebook | None:
    """The table for every chunk of this call: the agreed one, else this rank's theory table.

    Built once per call, not per chunk: the statistics pass and its host sync are the codec's
    largest fixed cost.
    """
    if a.table is not None or source.numel() == 0:
        return _canonical(a.table)
    return _canonical(codec.default_table(source))


def _headers(rows: np.ndarray) -> list[Header]:
    """The received buffers' headers, from host rows of HEADER_BYTES bytes each."""
    try:
        found = [Header.unpack(row.tobytes()) for row in rows.reshape(-1, HEADER_BYTES)]
    except ValueError as exc:
        raise ValueError(f"received a corrupt compressed header: {exc}") from None
    return [replace(h, table=_canonical(h.table)) for h in found]


def _total(h: Header) -> int:
    """A buffer's whole length, from its header."""
    if h.layout == LAYOUT_RAW:
        return raw_size(h.fmt, h.numel)
    return split_size(h.fmt, h.numel, h.block, h.payload_bytes)


class _Decoder:
    """Decodes the received buffers of one call, each given as its fixed part and its payload.

    Raw buffers are two copies straight into the output. Split ones: with the codec's CUDA
    kernels the payload is passed as a separate stream (no joining copy) and every decode is
    queued without a host sync: problems are OR-ed into one device flag that :meth:`check` reads
    once, after the whole call. Elsewhere the two pieces are joined into one buffer for
    ``codec.decompress``, which checks it as it goes. The headers were parsed and checked already
    (``_headers``), so nothing is parsed a second time.
    """

    def __init__(self, g: Group) -> None:
        self.flag = torch.zeros(1, dtype=torch.int32, device=g.device) if g.cuda else None
        self.used: object = None

    def __call__(self, fixed: torch.Tensor, payload: torch.Tensor, h: Header,
                 out: torch.Tensor) -> None:
        """Decode the buffer ``fixed`` + ``payload`` (either may run past its end) into the
        contiguous ``out``."""
        if h.fmt != codec._fmt(out.dtype) or h.numel != out.numel():
            raise ValueError(f"received a compressed buffer of {h.numel} {h.fmt.name} values "
                             f"where {out.numel()} {out.dtype} values were expected")
        nbytes = _total(h)
        head = min(nbytes, fixed.numel())
        fixed, payload = fixed[:head], payload[: nbytes - head]
        if h.layout == LAYOUT_RAW:
            data = out.view(-1).view(torch.uint8)
            data[: head - HEADER_BYTES].copy_(fixed[HEADER_BYTES:])
            data[head - HEADER_BYTES :].copy_(payload)
            return
        backend = codec._backend(fixed.device, h.block)
        if self.flag is None or not hasattr(backend, "launch_decode"):
            joined = torch.cat([fixed, payload])
            codec.decompress(codec.Compressed._of(joined, h), out=out)
            return
        backend.launch_decode(fixed, h.fmt, h.table, h.block, h.payload_bytes, out, self.flag,
                              payload=payload)
        self.used = backend

    def check(self) -> None:
        if self.used is not None:
            self.used.raise_on_flag(int(self.flag.item()))


AHEAD = 2  # chunks encoded and sent before the first one is received


def _read(streams: Streams, parts: Sequence[torch.Tensor]) -> np.ndarray:
    """The bytes of device tensors on the host in one copy: the pipeline's one sync per chunk.
    Runs on the decompress stream after the compress stream's queued work (the encodes)."""
    if not sum(t.numel() for t in parts):
        return np.empty(0, dtype=np.uint8)
    if streams.decompress is not None:
        streams.decompress.wait_stream(streams.compress)
    with streams.on(streams.decompress):
        flat = torch.cat([t.reshape(-1).view(torch.uint8) for t in parts])
        return flat.cpu().numpy()


def _sizes(raw: np.ndarray) -> list[int]:
    return np.frombuffer(raw.tobytes(), dtype="<i8").tolist()


@dataclass
class _Stages:
    """One protocol's steps for chunk k, which :func:`_pipeline` interleaves.

    encode(k): queue chunk k's encodes, return their payload sizes (device int64, maybe empty);
    send(k, sizes): seal chunk k with the sizes now on the host and issue its first phase;
    heads(state): the header bytes the first phase delivers (device uint8 tensors, maybe none),
    after waiting for it on the decompress stream; finish(state, header bytes): the rest.
    """

    encode: Callable[[int], torch.Tensor]
    send: Callable[[int, list[int]], object]
    heads: Callable[[object], list[torch.Tensor]]
    finish: Callable[[object, np.ndarray], None]


def _pipeline(chunks: int, streams: Streams, st: _Stages) -> None:
    """Chunk k+AHEAD is encoded while chunk k travels, and one copy to the host per chunk reads
    both chunk k's received headers and chunk k+AHEAD's payload sizes: one host sync per chunk
    (plus one for the first AHEAD chunks' sizes), and the wire always has a later chunk's first
    phase queued behind the one the host waits for."""
    first = [st.encode(k) for k in range(min(AHEAD, chunks))]
    sizes = _sizes(_read(streams, first))
    sent = []
    for k, queued in enumerate(first):
        sent.append(st.send(k, sizes[: queued.numel()]))
        sizes = sizes[queued.numel() :]
    for k in range(chunks):
        later = st.encode(k + AHEAD) if k + AHEAD < chunks else None
        heads = st.heads(sent[k])
        got = sum(h.numel() for h in heads)
        raw = _read(streams, heads if later is None else [*heads, later])
        st.finish(sent[k], raw[:got])
        if later is not None:
            sent.append(st.send(k + AHEAD, _sizes(raw[got:])))
        sent[k] = None


def _done(async_op: bool) -> DoneWork | None:
    """What a compressed call returns: torch's convention, a Work only when async_op."""
    return DoneWork() if async_op else None


def protocol_call(g: Group, op: str, x: torch.Tensor) -> Callable[[], None]:
    """A compressed ``op`` ("all_gather", "all_to_all" or "broadcast" from group rank 0) of the
    flat ``x`` through the protocol alone -- one chunk, each rank's theory table, no descriptor
    exchange: what the switch's profile measures its model against (switch._overhead)."""
    a, flat = _Agreed(g, switch.COMPRESSED, None, 1), _flat(x)
    if op == "all_gather":
        out = torch.empty(g.world * flat.numel(), dtype=x.dtype, device=x.device)
        return lambda: _gather_compressed(a, flat, out)
    if op == "all_to_all":
        out = torch.empty_like(flat)
        return lambda: _a2a_compressed(a, list(flat.view(g.world, -1)),
                                       list(out.view(g.world, -1)), flat)
    buf = flat.clone()
    src = dist.get_global_rank(g.pg, 0) if g.pg is not None else 0
    return lambda: _broadcast_compressed(a, buf, src, 0)


# --------------------------------------------------------------------------- all-gather


def all_gather_into_tensor(output_tensor: torch.Tensor, input_tensor: torch.Tensor,
                           group: dist.ProcessGroup | None = None, async_op: bool = False, *,
                           table: Codebook | None = None, verify: bool | None = None) -> object:
    """torch.distributed.all_gather_into_tensor, compressed where it pays."""
    nbytes = input_tensor.numel() * input_tensor.element_size()
    if _direct(group, input_tensor, "all_gather", nbytes, -1, verify):
        return dist.all_gather_into_tensor(_wire(output_tensor), _wire(input_tensor), group,
                                           async_op)
    g = resolve(group, input_tensor)
    err = _check_pair(g, input_tensor, output_tensor, output_tensor.numel(),
                      input_tensor.numel() * g.world)
    agreed, desc = _agree(g, "all_gather", input_tensor.dtype, nbytes, err,
                          [input_tensor.numel()], table, verify_policy(verify) != "0")
    if desc is not None:
        require_same(desc, 0, "the input numel", "all_gather")
    if agreed.strategy != switch.COMPRESSED:
        return dist.all_gather_into_tensor(_wire(output_tensor), _wire(input_tensor), group,
                                           async_op)
    _gather_compressed(agreed, _flat(input_tensor), _flat(output_tensor))
    return _done(async_op)


def _check_pair(g: Group, inp: torch.Tensor, out: torch.Tensor, out_numel: int,
                want: int) -> int:
    """The local error code for an (input, output) pair (0 when fine)."""
    if out_numel != want:
        return 1
    if inp.dtype != out.dtype:
        return 2
    if not (inp.is_contiguous() and out.is_contiguous()):
        return 4
    if any(t.device.type != g.device.type for t in (inp, out)):
        return 5
    return 0


def _gather_compressed(a: _Agreed, inp: torch.Tensor, out: torch.Tensor) -> None:
    g, n = a.g, inp.numel()
    rows = out.view(g.world, n)
    streams = streams_for(g)
    keep: list[object] = []  # every temporary lives until the caller's stream is re-joined
    table = _own_table(a, inp)
    unpack = _Decoder(g)
    pieces = _pieces(n, a.chunks)
    fixed = [codec.fixed_part_bytes(inp.dtype, m) for _, m in pieces]
    stores = _buffers([_store_bytes(inp.dtype, m) for _, m in pieces], g.device)
    received = _buffers([g.world * f for f in fixed], g.device)

    def encode(k: int) -> torch.Tensor:
        s, m = pieces[k]
        with streams.on(streams.compress):
            return _launch(inp[s : s + m], table, stores[k])

    def send(k: int, sizes: list[int]) -> object:
        s, m = pieces[k]
        with streams.on(streams.compress):
            p = _seal(inp[s : s + m], table, stores[k], sizes[0])
            work = dist.all_gather_into_tensor(received[k], p.head, group=g.pg, async_op=True)
        STATS.sent += p.fixed
        return k, p, work

    def heads(state: object) -> list[torch.Tensor]:
        k, p, work = state
        with streams.on(streams.decompress):
            work.wait()
        return [received[k].view(g.world, p.fixed)[:, :HEADER_BYTES]]

    def finish(state: object, raw: np.ndarray) -> None:
        k, p, _ = state
        s, m = pieces[k]
        found = _headers(raw)
        width = max(max(0, _total(h) - p.fixed) for h in found)
        payload = torch.empty(g.world * width, dtype=torch.uint8, device=g.device)
        keep.append(payload)
        done = _phase2(streams, lambda: dist.all_gather_into_tensor(
            payload, p.padded_tail(width), group=g.pg, async_op=True)) if width else None
        STATS.sent += width
        with streams.on(streams.decompress):
            if done is not None:
                done.wait()
            fixed_parts, tails = received[k].view(g.world, p.fixed), payload.view(g.world, width)
            for r in range(g.world):
                if r == g.rank:
                    rows[r, s : s + m].copy_(inp[s : s + m])
                else:
                    unpack(fixed_parts[r], tails[r], found[r], rows[r, s : s + m])

    with ordered(g, streams):
        _pipeline(a.chunks, streams, _Stages(encode, send, heads, finish))
    unpack.check()


def _phase2(streams: Streams, send: Callable[[], object]) -> object:
    """Issue a payload collective from the compress stream, not the decompress one: NCCL makes its
    stream wait for the issuing stream, and the decompress stream still holds the previous
    chunk's decodes, which the wire need not wait for (the compress stream's pending work, the
    next chunk's encode, precedes that chunk's fixed parts on the wire anyway). The caller waits
    for the returned work on the decompress stream."""
    with streams.on(streams.compress):
        return send()


def all_gather(tensor_list: list[torch.Tensor], tensor: torch.Tensor,
               group: dist.ProcessGroup | None = None, async_op: bool = False, *,
               table: Codebook | None = None, verify: bool | None = None) -> object:
    """torch.distributed.all_gather (equal shapes), through all_gather_into_tensor."""
    nbytes = tensor.numel() * tensor.element_size()
    if _direct(group, tensor, "all_gather", nbytes, -1, verify) or not all(
            t.shape == tensor.shape and t.dtype == tensor.dtype for t in tensor_list):
        return dist.all_gather([_wire(t) for t in tensor_list], _wire(tensor), group, async_op)
    flat = torch.empty(len(tensor_list) * tensor.numel(), dtype=tensor.dtype, device=tensor.device)
    all_gather_into_tensor(flat, tensor.contiguous(), group, table=table, verify=verify)
    for t, part in zip(tensor_list, flat.view(len(tensor_list), -1), strict=True):
        t.copy_(part.view(t.shape))
    return _done(async_op)


# --------------------------------------------------------------------------- all-to-all


def all_to_all_single(output: torch.Tensor, input: torch.Tensor,
                      output_split_sizes: list[int] | None = None,
                      input_split_sizes: list[int] | None = None,
                      group: dist.ProcessGroup | None = None, async_op: bool = False, *,
                      table: Codebook | None = None, verify: bool | None = None) -> object:
    """torch.distributed.all_to_all_single (uneven splits included), compressed where it pays.

    Even splits (both split arguments None or empty) follow the verification policy like every
    other op: torch then needs the same input size on every rank. With explicit splits the sizes
    differ per rank, so no rank can decide alone: the call goes straight to torch only where the
    profile never compresses this dtype (``switch.can_compress``) and ``ZIPCCL_VERIFY`` is not 1;
    otherwise it exchanges the descriptor -- which then also checks the splits -- whatever the
    policy, because every rank must use the same strategy and chunk count. So in auto mode every
    rank must pass its splits the same way (all None or all lists).
    """
    even = not output_split_sizes and not input_split_sizes
    nbytes = input.numel() * input.element_size() if even else None
    if _direct(group, input, "all_to_all", nbytes, -1, verify):
        return dist.all_to_all_single(_wire(output), _wire(input), output_split_sizes,
                                      input_split_sizes, group, async_op)
    g = resolve(group, input)
    ins, outs, err = _splits(g, input, output, input_split_sizes, output_split_sizes)
    agreed, desc = _agree(g, "all_to_all", input.dtype, input.numel() * input.element_size(),
                          err, [*ins, *outs, _inner(input)], table,
                          not even or verify_policy(verify) != "0")
    if desc is not None:
        _check_splits(desc, g.world)
    if agreed.strategy != switch.COMPRESSED:
        return dist.all_to_all_single(_wire(output), _wire(input), output_split_sizes,
                                      input_split_sizes, group, async_op)
    inner = _inner(input)
    send = _segments(_flat(input), [s * inner for s in ins])
    recv = _segments(_flat(output), [s * inner for s in outs])
    _a2a_compressed(agreed, send, recv, _flat(input))
    return _done(async_op)


def _inner(t: torch.Tensor) -> int:
    """Elements per row (split sizes count rows of dimension 0)."""
    return math.prod(t.shape[1:]) if t.dim() else 1


def _splits(g: Group, inp: torch.Tensor, out: torch.Tensor, ins: list[int] | None,
            outs: list[int] | None) -> tuple[list[int], list[int], int]:
    """Row splits (even when None) and the local error code."""
    def rows(t: torch.Tensor, given: list[int] | None) -> tuple[list[int], bool]:
        total = t.shape[0] if t.dim() else 1
        if given is None or len(given) == 0:
            return [total // g.world] * g.world, total % g.world == 0
        ok = len(given) == g.world and sum(given) == total and min(given) >= 0
        return (list(given) + [0] * g.world)[: g.world], ok

    (i_rows, i_ok), (o_rows, o_ok) = rows(inp, ins), rows(out, outs)
    err = _check_pair(g, inp, out, 0, 0)
    if not (i_ok and o_ok):
        err = 3
    elif err == 0 and inp.dim() and out.dim() and _inner(inp) != _inner(out):
        err = 1
    return i_rows, o_rows, err


def _check_splits(desc: torch.Tensor, world: int) -> None:
    """Rank i's input split j must equal rank j's output split i, and row sizes must match."""
    ins, outs = desc[:, :world], desc[:, world : 2 * world]
    require_same(desc, 2 * world, "the row size (numel of input[0])", "all_to_all")
    bad = [(i, j) for i in range(world) for j in range(world) if ins[i, j] != outs[j, i]]
    if bad:
        i, j = bad[0]
        raise CollectiveMismatchError(
            f"zipccl.all_to_all: rank {i} sends {int(ins[i, j])} rows to rank {j}, which expects "
            f"{int(outs[j, i])} ({len(bad)} mismatched pairs)"
        )


def _segments(flat: torch.Tensor, sizes: Sequence[int]) -> list[torch.Tensor]:
    out, at = [], 0
    for size in sizes:
        out.append(flat[at : at + size])
        at += size
    return out


def _a2a_compressed(a: _Agreed, send: list[torch.Tensor], recv: list[torch.Tensor],
                    source: torch.Tensor) -> None:
    """Two-phase compressed all-to-all of flat segments (views of ``source``): fixed parts, then
    payloads with the exact sizes read from the received headers; each phase one :func:`_swap`."""
    g, dtype = a.g, source.dtype
    streams = streams_for(g)
    keep: list[object] = []
    table = _own_table(a, source)
    unpack = _Decoder(g)
    sent_at = [_pieces(seg.numel(), a.chunks) for seg in send]  # [peer][chunk] = (start, numel)
    got_at = [_pieces(seg.numel(), a.chunks) for seg in recv]

    def per_peer(at: list[list[tuple[int, int]]], size: Callable[[torch.dtype, int], int],
                 k: int) -> list[int]:
        return [size(dtype, pieces[k][1]) if pieces[k][1] and r != g.rank else 0
                for r, pieces in enumerate(at)]

    out_sizes = [per_peer(got_at, codec.fixed_part_bytes, k) for k in range(a.chunks)]
    store_sizes = [per_peer(sent_at, _store_bytes, k) for k in range(a.chunks)]
    stores = _buffers([b for sizes in store_sizes for b in sizes], g.device)  # [k * W + peer]
    empty = source.new_empty(0, dtype=torch.uint8)

    def outgoing(k: int) -> list[tuple[int, torch.Tensor, torch.Tensor]]:
        """(peer, piece, store) of chunk k for every peer this rank sends data."""
        found = []
        for j, at in enumerate(sent_at):
            s, m = at[k]
            if store_sizes[k][j]:
                found.append((j, send[j][s : s + m], stores[k * g.world + j]))
        return found

    def encode(k: int) -> torch.Tensor:
        with streams.on(streams.compress):
            queued = [_launch(x, table, store) for _, x, store in outgoing(k)]
            return _joined(queued) if queued else empty.long()

    def start(k: int, sizes: list[int]) -> object:
        packs: list[_Packed | None] = [None] * g.world
        with streams.on(streams.compress):
            for (j, x, store), size in zip(outgoing(k), sizes, strict=True):
                packs[j] = _seal(x, table, store, size)
        heads = [p.head if p is not None else empty for p in packs]
        rooms = [p.store if p is not None else empty for p in packs]
        got, work = _swap(g, streams, heads, rooms, out_sizes[k], keep)
        return k, packs, got, work

    def heads(state: object) -> list[torch.Tensor]:
        k, _, got, work = state
        with streams.on(streams.decompress):
            work.wait()
        return [got[i][:HEADER_BYTES] for i, size in enumerate(out_sizes[k]) if size]

    def finish(state: object, raw: np.ndarray) -> None:
        k, packs, got, _ = state
        live = [i for i, size in enumerate(out_sizes[k]) if size]
        found = dict(zip(live, _headers(raw), strict=True))
        recv_tail = [max(0, _total(found[i]) - out_sizes[k][i]) if i in found else 0
                     for i in range(g.world)]
        tails = [p.tail if p is not None else empty for p in packs]
        rooms = [p.store[p.fixed :] if p is not None else empty for p in packs]
        payload, done = _swap(g, streams, tails, rooms, recv_tail, keep)
        with streams.on(streams.decompress):
            done.wait()
            for i, tail in enumerate(payload):
                s, m = got_at[i][k]
                if i == g.rank:
                    ss, mm = sent_at[i][k]
                    recv[i][s : s + m].copy_(send[i][ss : ss + mm])
                elif m:
                    unpack(got[i], tail, found[i], recv[i][s : s + m])

    with ordered(g, streams):
        _pipeline(a.chunks, streams, _Stages(encode, start, heads, finish))
    unpack.check()


def _swap(g: Group, streams: Streams, out: list[torch.Tensor], rooms: list[torch.Tensor],
          in_sizes: list[int], keep: list[object]) -> tuple[list[torch.Tensor], object]:
    """Send ``out[j]`` (uint8) to every rank j and receive ``in_sizes[i]`` bytes from every rank
    i, issued from the compress stream; returns the received pieces and the Work.

    Two ranks: one all-gather of the outgoing piece padded to the larger of the two pieces, whose
    sizes both ranks know (``rooms[j]``: a view from the piece's start over the room after it,
    so the padding is a view, not a copy, unless the piece is the smaller one and its store
    ends first). NCCL's all-gather outruns its all-to-all of the same bytes over sockets by
    ~1.4x (BENCHMARKS.md, run D); otherwise all_to_all_single. Called on the caller's stream,
    where receive buffers are allocated (see :func:`ordered`).
    """
    if g.world != 2:
        got = torch.empty(sum(in_sizes), dtype=torch.uint8, device=g.device)
        keep.append(got)
        with streams.on(streams.compress):
            work = dist.all_to_all_single(got, _joined(out), in_sizes, [t.numel() for t in out],
                                          group=g.pg, async_op=True)
        STATS.sent += sum(t.numel() for t in out)
        return _segments(got, in_sizes), work
    peer = 1 - g.rank
    width = max(out[peer].numel(), in_sizes[peer])
    sent = rooms[peer][:width] if rooms[peer].numel() >= width else torch.empty(
        width, dtype=torch.uint8, device=g.device)
    got = torch.empty(2 * width, dtype=torch.uint8, device=g.device)
    keep += [got, sent]
    with streams.on(streams.compress):
        if sent.data_ptr() != out[peer].data_ptr() and out[peer].numel():
            sent[: out[peer].numel()].copy_(out[peer])
        work = dist.all_gather_into_tensor(got, sent, group=g.pg, async_op=True)
    STATS.sent += width
    pieces = [got[:0], got[:0]]
    pieces[peer] = got[peer * width : peer * width + in_sizes[peer]]
    return pieces, work


# --------------------------------------------------------------------------- reductions


def reference_reduce(parts: Sequence[torch.Tensor], op: ReduceOp = ReduceOp.SUM) -> torch.Tensor:
    """The reduction every zipccl reduce op computes: fp32, rank order 0..W-1, rounded once."""
    if op not in _LOCAL_OPS:
        raise ValueError(f"zipccl reduces SUM, AVG, PRODUCT, MIN and MAX locally, not {op}")
    acc = parts[0].float().clone()
    for x in parts[1:]:
        x = x.float()
        if op in (ReduceOp.SUM, ReduceOp.AVG):
            acc += x
        elif op == ReduceOp.PRODUCT:
            acc *= x
        elif op == ReduceOp.MIN:
            torch.minimum(acc, x, out=acc)
        else:
            torch.maximum(acc, x, out=acc)
    if op == ReduceOp.AVG:
        acc /= len(parts)
    return acc.to(parts[0].dtype)


def reduce_scatter_tensor(output: torch.Tensor, input: torch.Tensor,
                          op: ReduceOp = ReduceOp.SUM, group: dist.ProcessGroup | None = None,
                          async_op: bool = False, *, table: Codebook | None = None,
                          verify: bool | None = None) -> object:
    """torch.distributed.reduce_scatter_tensor with the deterministic fp32 reduction (module
    docstring: auto with W > 2 is therefore not the backend's reduce-scatter)."""
    nbytes = input.numel() * input.element_size()
    if _direct(group, input, "reduce_scatter", nbytes, _red_code(op), verify):
        return dist.reduce_scatter_tensor(output, input, op, group, async_op)
    g = resolve(group, input)
    err = _check_pair(g, input, output, input.numel(), output.numel() * g.world)
    agreed, desc = _agree(g, "reduce_scatter", input.dtype, nbytes, err, [input.numel()], table,
                          verify_policy(verify) != "0", red=op)
    if desc is not None:
        require_same(desc, 0, "the input numel", "reduce_scatter")
    if agreed.strategy == switch.NATIVE:
        return dist.reduce_scatter_tensor(output, input, op, group, async_op)
    _reduce_scatter(agreed, _flat(input), _flat(output), op)
    return _done(async_op)


def _reduce_scatter(a: _Agreed, inp: torch.Tensor, out: torch.Tensor, op: ReduceOp) -> None:
    """All-to-all of the W row blocks (compressed or not), then the rank-order fp32 reduction."""
    g = a.g
    if a.strategy != switch.COMPRESSED:
        STATS.sent += inp.numel() * inp.element_size() * (g.world - 1) // g.world
    if a.strategy == switch.NATIVE:
        dist.reduce_scatter_tensor(out, inp, op, g.pg)
        return
    staging = torch.empty_like(inp).view(g.world, -1)
    if a.strategy == switch.COMPRESSED:
        _a2a_compressed(a, list(inp.view(g.world, -1)), list(staging), inp)
    else:
        dist.all_to_all_single(_wire(staging), _wire(inp), group=g.pg)
    out.copy_(reference_reduce(list(staging), op))


def all_reduce(tensor: torch.Tensor, op: ReduceOp = ReduceOp.SUM,
               group: dist.ProcessGroup | None = None, async_op: bool = False, *,
               table: Codebook | None = None, verify: bool | None = None) -> object:
    """torch.distributed.all_reduce as reduce-scatter + all-gather, each compressed where it pays.

    Every rank ends with the same bits: the rank-order fp32 reduction of its shard, all-gathered
    losslessly.
    """
    nbytes = tensor.numel() * tensor.element_size()
    if _direct(group, tensor, "all_reduce", nbytes, _red_code(op), verify):
        return dist.all_reduce(tensor, op, group, async_op)
    g = resolve(group, tensor)
    err = 4 if not tensor.is_contiguous() else 5 if tensor.device.type != g.device.type else 0
    agreed, desc = _agree(g, "all_reduce", tensor.dtype, nbytes, err, [tensor.numel()], table,
                          verify_policy(verify) != "0", red=op)
    if desc is not None:
        require_same(desc, 0, "the tensor numel", "all_reduce")
    if agreed.strategy == switch.NATIVE:
        return dist.all_reduce(tensor, op, group, async_op)
    _all_reduce(agreed, tensor, op)
    return _done(async_op)


def _all_reduce(a: _Agreed, tensor: torch.Tensor, op: ReduceOp) -> None:
    g, flat = a.g, _flat(tensor)
    shard = -(-flat.numel() // g.world)
    padded = flat if shard * g.world == flat.numel() else torch.zeros(
        shard * g.world, dtype=flat.dtype, device=flat.device)
    if padded is not flat:
        padded[: flat.numel()].copy_(flat)
    part = torch.empty(shard, dtype=flat.dtype, device=flat.device)
    ag_chunks = max(1, a.chunks // g.world)
    rs, ag = switch.A2A_REDUCE, switch.NATIVE
    if a.strategy == switch.COMPRESSED:  # each half compressed only where that half pays
        rs = _strategy(g, "reduce_scatter", flat.dtype, padded.numel() * flat.element_size(),
                       _LOCAL_OPS[op])
        ag = _strategy(g, "all_gather", flat.dtype, part.numel() * part.element_size(), -1)
    _reduce_scatter(_Agreed(g, rs, a.table, a.chunks), padded, part, op)
    if ag == switch.COMPRESSED:
        _gather_compressed(_Agreed(g, ag, a.table, ag_chunks), part, padded)
    else:
        dist.all_gather_into_tensor(_wire(padded), _wire(part), group=g.pg)
        STATS.sent += part.numel() * part.element_size()
    if padded is not flat:
        flat.copy_(padded[: flat.numel()])


# --------------------------------------------------------------------------- broadcast


def broadcast(tensor: torch.Tensor, src: int | None = None,
              group: dist.ProcessGroup | None = None, async_op: bool = False, *,
              table: Codebook | None = None, verify: bool | None = None) -> object:
    """torch.distributed.broadcast (``src`` a global rank), compressed where it pays."""
    src = 0 if src is None else src
    nbytes = tensor.numel() * tensor.element_size()
    if _direct(group, tensor, "broadcast", nbytes, -1, verify):
        return dist.broadcast(_wire(tensor), src, group, async_op)
    g = resolve(group, tensor)
    group_src = dist.get_group_rank(group, src) if group is not None else src
    err = 6 if not 0 <= group_src < g.world else _check_pair(g, tensor, tensor, 0, 0)
    agreed, desc = _agree(g, "broadcast", tensor.dtype, nbytes, err, [tensor.numel(), src],
                          table, verify_policy(verify) != "0")
    if desc is not None:
        require_same(desc, 1, "src", "broadcast")
        require_same(desc, 0, "the tensor numel", "broadcast")
    if agreed.strategy != switch.COMPRESSED:
        return dist.broadcast(_wire(tensor), src, group, async_op)
    _broadcast_compressed(agreed, _flat(tensor), src, group_src)
    return _done(async_op)


def _broadcast_compressed(a: _Agreed, flat: torch.Tensor, src: int, group_src: int) -> None:
    g = a.g
    streams = streams_for(g)
    keep: list[object] = []
    sender = g.rank == group_src
    table = _own_table(a, flat) if sender else None
    unpack = _Decoder(g)
    pieces = _pieces(flat.numel(), a.chunks)
    size_of = _store_bytes if sender else codec.fixed_part_bytes  # receivers: fixed parts
    buffers = _buffers([size_of(flat.dtype, m) for _, m in pieces], g.device)
    empty = torch.empty(0, dtype=torch.uint8, device=g.device)

    def encode(k: int) -> torch.Tensor:
        if not sender:
            return empty.long()
        s, m = pieces[k]
        with streams.on(streams.compress):
            return _launch(flat[s : s + m], table, buffers[k])

    def send(k: int, payload: list[int]) -> object:
        s, m = pieces[k]
        with streams.on(streams.compress):
            p = _seal(flat[s : s + m], table, buffers[k], payload[0]) if sender else None
            head = p.head if p is not None else buffers[k]
            work = dist.broadcast(head, src, group=g.pg, async_op=True)
        STATS.sent += head.numel() if sender else 0
        return s, m, p, head, work

    def heads(state: object) -> list[torch.Tensor]:
        *_, head, work = state
        with streams.on(streams.decompress):
            work.wait()
        return [] if sender else [head[:HEADER_BYTES]]

    def finish(state: object, raw: np.ndarray) -> None:
        s, m, p, head, _ = state
        found = None if sender else _headers(raw)[0]
        if sender:
            tail = p.tail
            STATS.sent += tail.numel()
        else:
            tail = torch.empty(max(0, _total(found) - head.numel()), dtype=torch.uint8,
                               device=g.device)
            keep.append(tail)
        done = _phase2(streams, lambda: dist.broadcast(tail, src, group=g.pg, async_op=True)
                       ) if tail.numel() else None
        with streams.on(streams.decompress):
            if done is not None:
                done.wait()
            if not sender:
                unpack(head, tail, found, flat[s : s + m])

    with ordered(g, streams):
        _pipeline(a.chunks, streams, _Stages(encode, send, heads, finish))
    unpack.check()


__all__ = [
    "CollectiveMismatchError",
    "all_gather",
    "all_gather_into_tensor",
    "all_reduce",
    "all_reduce_strategy",
    "all_to_all_single",
    "broadcast",
    "reduce_scatter_tensor",
    "reference_reduce",
]
