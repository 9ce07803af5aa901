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
* ``1``: verify every call (debug mode); ``0``: only where the exchange happens anyway (below;
  the DDP hook, whose buckets DDP already keeps identical). ``ZIPCCL_MODE=never`` bypasses
  zipccl altogether, verification included.
* a compressed call exchanges the descriptor whatever the policy: the exchange also carries
  every rank's sample summary, which the protocols need (below), or on a planned call the
  plan's tag (Plans, below). all_to_all_single with explicit
  splits exchanges it whenever the profile could compress it: per-rank sizes differ, and the
  ranks must agree on the strategy and chunk count (see its docstring).

Protocols. A rank's piece travels as golden/container.py's split layout -- a fixed part
(header, raw planes, prefix planes, block offsets) whose size follows from dtype and numel, then
the payload stream, whose length only the encoder learns -- in a *slot* whose width every rank
computes before any data moves: the descriptor exchange carries each rank's
``codec.sample_summary`` (the deterministic sample's statistics and symbol histogram), from
which every rank builds every rank's theory table and predicts its payload; the slot holds the
fixed part and room for that payload times MARGIN (plus SLACK and a byte per block), rounded up
to SLOT_ALIGN. A piece whose slot would not be smaller than its raw values travels raw. So each
chunk moves in *one* collective, with no host sync before it:

* all-gather: one all-gather of every rank's slot, all as wide as the widest;
* broadcast: one broadcast of the source's slot;
* all-to-all (uneven splits): one all-to-all of every (src, dst) slot, whose widths both ends
  compute from the agreed splits and the sender's summary. Between two ranks it is an
  all-gather of the outgoing slot padded to the wider of the two (:func:`_swap`): NCCL's
  all-gather outruns its all-to-all over sockets;
* reduce-scatter: all-to-all of the W row blocks (native, or the compressed protocol above), then
  a local reduction in fp32 in rank order 0..W-1, rounded once -- deterministic and equal to
  :func:`reference_reduce` (two-part sums: one add, the same bits). With W = 2 NCCL's native
  reduce-scatter gives the same bits (one correctly rounded operation), so the switch may take
  it; with W > 2 it does not, so auto mode there is *not* the backend's reduce-scatter (and
  pays the verification of its own protocol). ``ZIPCCL_NATIVE_REDUCE=1`` lets auto take the
  backend's reduce-scatter / all-reduce for any W where the cost model prefers it, trading
  rank-order determinism for speed;
* all-reduce: reduce-scatter + all-gather on a flat copy padded to a multiple of W (on a first
  call the all-gather half exchanges its shards' summaries first).

A received slot is decoded as it lands: the CUDA kernel reads the payload size from the slot's
own header and skips a payload that outgrew its room (other backends read the header on the
host). After the last chunk, one device-to-host copy reads the decoders' error flag and every
slot's header (received ones, and on the sending side its own): a header that is not the agreed
piece's is a corrupt buffer (ValueError); a payload that outgrew its room -- data whose sample
misled the prediction -- is resent raw in one more collective, which every rank involved knows
to expect from the headers it has seen. The pieces' bytes equal ``codec.compress_into``'s for
the same table.

Plans (zipccl._plans): in the steady state no summary, table or prediction before the wire. A
call's *key* is its descriptor on this rank (op, dtype, sizes and splits, table hash, mode,
reduce op), its device, whether it verifies and the raw ``ZIPCCL_*`` settings -- the arguments'
fingerprint, not the tensors' identity (equal-sized DDP buckets share one). A key's first call
runs as above; once its agreement has passed on every rank, each rank keeps the outcome as an
immutable plan: strategy, chunks, every rank's table, and every split piece's payload size from
the headers of the final read (an all-gather's and a broadcast's ranks read every header; both
ends of an all-to-all piece read its header), so both ends of every piece hold the same number
without another collective. The key's later calls

* exchange the same descriptor row in the same all-gather, with the plan's tag where the
  summary goes: no sample summary is taken, no table built, no strategy or chunk count decided;
* encode with the plan's tables (each rank its first call's theory table), which the receivers
  hold before the data arrives, so the CUDA decoder still decodes every piece as it lands (a
  table per call from each rank's own data would need a summary and a table build before the
  wire, and a host read of every received header before its decode);
* size every piece by what the key's previous call measured of it, times MEASURED_MARGIN plus
  SLACK (raw where it went raw); a payload that outgrew that room goes through the raw resend
  above -- the dynamic phase after the main collective -- and sizes the next call;
* an all-reduce's all-gather half skips its summary exchange.

Why an exchange stays before the wire: a rank whose call differs from its peers' would otherwise
issue a different first collective (another size or kind: gloo aborts, NCCL hangs or corrupts), and
no rank can learn a peer's call without a collective of a shape fixed in advance. The descriptor
row is that collective: one length for every op, with or without a plan, so a rank repeating a plan
and one on a first call issue the same all-gather. The tag hashes the exchange that made the plan
(its rows and its number in the group) and the calls the plan served, so equal tags on every rank
mean one plan in one state. The descriptor checks raise CollectiveMismatchError on every rank where
the calls differ, planned or not; where they pass but the tags differ (a rank lost its plans) every
rank exchanges once more, with summaries, and they agree on a new plan. So a planned call keeps one
small all-gather and its host sync before the wire and drops the work around it.
``ZIPCCL_PLAN_CALLS`` (default 64; agreed like the other settings): the calls a plan serves before
its key is agreed afresh, with tables fitted to a fresh sample; 0 turns plans off.

``ZIPCCL_CHECKSUM=1`` (agreed like the other settings): every compressed piece carries the values
checksum of ``codec.compress(..., checksum=True)``, summed by the encoder and checked by the
receiver's decoder (a mismatch raises ValueError on the receiving rank and PeerError on the
others); pieces sent raw travel unchecked, as native ones do.

Large messages go in chunks, pipelined over three CUDA streams: compress, NCCL's own,
decompress; every chunk is queued at once. In ``auto`` mode on CUDA the switch's cost model
picks the chunk count (``switch.best_chunks``: every chunk pays its collective's latency, so
slow-latency links get few); ``ZIPCCL_CHUNK_BYTES`` fixes the chunk size instead (default 32 MiB
on CUDA, the ``always`` mode's). Host syncs of one compressed call: the exchange's, the final
read's and the agreement's (below), whatever the chunk count (plus, for an all-reduce, its
all-gather half's three, or on a planned call its two).

Failures raise on every rank before the call returns, within the time its collectives take --
no rank is left waiting for the group's timeout:

* bad arguments, or a sample summary that raises, are reported in the descriptor exchange:
  CollectiveMismatchError on every rank for arguments; the summary's exception on its rank and
  a :class:`PeerError` on the others;
* after the exchange every collective of the call and its size follow from agreed values, so a
  rank whose own step fails -- encode, decode, the checks of the headers and decoder flag it
  reads -- keeps the exception and still issues each of the call's collectives (sending what
  its buffers hold: its peers may fail decoding that too). The call then ends with the ranks'
  agreement (:class:`zipccl._comm.Outcome`): one all-gather of every rank's report -- whether
  it failed, where (preparing what it sends, or on what it received), "Type: message", and
  whether it has overflowed pieces, which tells every rank of an all-to-all that the raw resend
  follows. The rank that failed raises its own exception (ValueError for a corrupt piece), with
  the report as a note; every other rank a PeerError naming it and what it reported. A failure
  preparing what a rank sends is the cause, before its peers' failures on what they received.
  Every rank issued the same collectives, so the group carries the next call.
* cost: one all-gather of W x 18 int64 per compressed protocol call, after its last data
  collective, and on CUDA one more host sync after the final read (which must come first: the
  headers are checked on the host). Native calls and a2a_reduce have none: between their
  exchange and their one collective no local step can fail but an allocation.
* not covered: an allocation failing on one rank (it cannot take part in collectives whose
  buffers it lacks), the transport's own failures and timeouts (torch.distributed's errors), and
  the plain copies after the agreement (the raw resend, the local reduction).

The CUDA path runs the same code (streams aside), the agreement through the exchange's pinned
buffers; the tests run it on gloo (tests/test_collectives_failures.py).
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import cast

import numpy as np
import torch
import torch.distributed as dist

from zipccl import _comm, _plans, codec, settings, switch
from zipccl._codecs import QueuedCodec
from zipccl._comm import (
    CODEC_DTYPES,
    SENDING,
    CollectiveMismatchError,
    DoneWork,
    Group,
    Outcome,
    PeerError,
    Streams,
    dtype_code,
    dtype_name,
    exchange,
    ordered,
    per_thread,
    require_same,
    resolve,
    streams_for,
    to_i64,
)
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
)
from zipccl.golden.formats import FloatFormat

ReduceOp = dist.ReduceOp
# an op argument: torch's stubs type ReduceOp.SUM & co. as ReduceOp.RedOpType, which its bindings
# take (converted) wherever they take a ReduceOp
ReduceOpArg = ReduceOp | ReduceOp.RedOpType
_OP_CODES = {"all_gather": 1, "all_to_all": 2, "reduce_scatter": 3, "all_reduce": 4, "broadcast": 5}
_MODE_CODES = {m: i for i, m in enumerate(switch.MODES)}
_LOCAL_OPS: dict[ReduceOpArg, int] = {
    ReduceOp.SUM: 0,
    ReduceOp.AVG: 1,
    ReduceOp.PRODUCT: 2,
    ReduceOp.MIN: 3,
    ReduceOp.MAX: 4,
}
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
    """What every rank knows after the descriptor exchange, or on a key's later calls from the
    plan its previous call left (zipccl._plans)."""

    g: Group
    name: str  # the op the caller called, for error messages
    strategy: str  # switch.NATIVE | A2A_REDUCE | COMPRESSED
    table: Codebook | None
    chunks: int
    sources: tuple[_Source, ...] = ()  # every rank's (table, predicted payload): compressed only
    #  payload bytes of each split piece (by _Unpack's keys) in the key's previous call; None:
    #  the pieces are sized by the sources' prediction (a first call)
    sizes: Mapping[object, int] | None = None
    halves: tuple[_Agreed, ...] = ()  # a compressed all-reduce's reduce-scatter and all-gather
    ticket: _plans.Ticket | None = None  # where a compressed call keeps what it measured

    def seg(self, key: object, dtype: torch.dtype, numel: int, rank: int) -> _Seg:
        """How the piece ``key`` of ``numel`` values from group rank ``rank`` travels: with room
        for its payload as the key's previous call measured it (raw where that one went raw),
        else as ``rank``'s sample predicts it. Both ends compute the same: they read the same
        header, or the same summary."""
        if self.sizes is None:
            return _seg(dtype, numel, _predicted_room(dtype, numel, self.sources[rank]))
        size = self.sizes.get(key)
        return _seg(
            dtype, numel, None if size is None else math.ceil(size * MEASURED_MARGIN) + SLACK
        )


def _table_hash(table: Codebook | None) -> int:
    if table is not None and not isinstance(table, Codebook):
        raise TypeError(f"table must be a golden Codebook or None, got {type(table).__name__}")
    return table.hash64 if table is not None else 0


VERIFY_POLICIES = settings.VERIFY_POLICIES


def verify_policy(verify: bool | None = None) -> str:
    """The verification policy of one call: ``verify`` if given, else ``ZIPCCL_VERIFY``.

    ``auto`` (default): exchange the descriptor for calls that take zipccl's own protocols
    (compressed, a2a_reduce) and hand native calls straight to torch; ``1``: every call (debug);
    ``0``: none.
    """
    if verify is not None:
        return "1" if verify else "0"
    return settings.value("ZIPCCL_VERIFY")


def _direct(
    group: dist.ProcessGroup | None,
    t: torch.Tensor,
    name: str,
    nbytes: int | None,
    red_code: int,
    verify: bool | None,
) -> bool:
    """Whether this call goes straight to torch.distributed with the caller's own arguments.

    True when the local decision is native and the policy does not ask for verification
    (``ZIPCCL_MODE=never`` always bypasses zipccl), and for a group of the ``zipccl`` backend,
    which compresses inside. The decision depends only on values every rank shares in a correct
    program -- the group's first call checks that they do (:func:`_entered`) -- so no rank can
    take the other branch.
    """
    if _entered(group):
        return True
    env = settings.raw()
    policy = verify_policy(verify)
    if policy == "1":  # first: the local decision may load the profile, itself a collective
        return switch.mode() == "never"  # that ranks in different modes would not match
    return _local_strategy(group, t, name, nbytes, red_code, env) == switch.NATIVE


def _entered(group: dist.ProcessGroup | None) -> bool:
    """Whether ``group`` belongs to the ``zipccl`` backend (whose own collectives call zipccl's
    on its inner groups); for any other group, its ranks' settings are agreed first (once per
    group: settings.ensure_agreed)."""
    key = switch.group_key(group)
    if isinstance(key, _comm.Forwarding):
        return True
    settings.ensure_agreed(cast(dist.ProcessGroup, key))  # the group itself, WORLD for None
    return False


def _local_strategy(
    group: dist.ProcessGroup | None,
    t: torch.Tensor,
    name: str,
    nbytes: int | None,
    red_code: int,
    env: tuple[object, ...] | None = None,
) -> str:
    """:func:`_strategy` from this rank's own (op, dtype, size, reduce op), cached per group
    (switch.group_key: a re-created default group is a new key) and environment (``env``:
    :func:`settings.raw`, read again when None).

    ``nbytes`` None: an all-to-all with explicit splits, whose sizes differ per rank; it is native
    only where the profile never compresses that op and dtype, else AGREE (needs the exchange).
    """
    env = env or settings.raw()
    key = (switch.group_key(group), name, t.dtype, nbytes, red_code, env[0], env[2], env[3])
    found = switch.ROUTES.get(key)
    if found is None:
        g = resolve(group, t)
        found = (
            _strategy(g, name, t.dtype, nbytes, red_code)
            if nbytes is not None
            else _uneven_strategy(g, name, t.dtype)
        )
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


_TAG = 7  # the descriptor's column of the plan tag (0: none), after the common head
_FIELDS = _TAG + 1  # where the op's own fields start


def _agree(
    g: Group,
    name: str,
    dtype: torch.dtype,
    nbytes: int,
    err: int,
    fields: Sequence[int],
    table: Codebook | None,
    exchange_desc: bool,
    red: ReduceOpArg | None = None,
    sample: torch.Tensor | None = None,
    check: Callable[[np.ndarray], None] | None = None,
) -> _Agreed:
    """Exchange the descriptor (if asked, or if the call compresses: the exchange also carries
    every rank's sample summary of ``sample``, which the compressed protocols size their pieces
    by), check it (``check``: the op's own checks of every rank's ``fields``), pick the strategy
    from the agreed size.

    Without ``exchange_desc`` (an even call, whose size every rank shares in a correct program)
    the local plan tells whether the call compresses; with it, nothing collective may precede the
    exchange (loading the profile is one), so every call that could compress sends a summary.

    A key's later calls (zipccl._plans) send their plan's tag instead of a summary, in the same
    exchange: where every rank sent the same tag they take the plan -- no summary, table or
    strategy to compute -- else every rank sees the difference and they exchange afresh.
    """
    mode = switch.mode()
    red_code = -1 if red is None else _red_code(red)
    head = [
        _OP_CODES[name],
        err,
        dtype_code(dtype),
        to_i64(_table_hash(table)),
        _MODE_CODES[mode],
        red_code,
        nbytes,
    ]
    group = switch.group_key(g.pg)
    ticket = _plans.Ticket(group, (*head, *fields, g.device, exchange_desc, settings.raw()))
    plan = _plans.find(group, ticket.key)
    if plan is not None:
        rows, _ = _exchanged(g, name, head, plan.tag, fields, None, check)
        if (rows[:, _TAG] == plan.tag).all():
            STATS.strategy = plan.agreed.strategy
            return _settled(replace(plan.agreed, ticket=replace(ticket, previous=plan)))
        exchange_desc = True  # the ranks' plans differ: every rank exchanges afresh, below
    local = None if exchange_desc else _plan(g, name, dtype, nbytes, red_code)
    if local is None:  # no collective before the exchange (the profile is one): a guess
        may_compress = dtype in CODEC_DTYPES and red_code != 99 and mode != "never"
    else:
        may_compress = local[0] == switch.COMPRESSED
    if not (exchange_desc or may_compress):
        assert local is not None  # planned: exchange_desc is False
        STATS.strategy = local[0]
        return _Agreed(g, name, local[0], table, local[1])  # no exchange, nothing to keep
    summarized = sample if may_compress and not err else None
    rows, count = _exchanged(g, name, head, 0, fields, summarized, check)
    if rows[:, _TAG].any():  # some ranks repeat a plan the others lack: all exchange afresh
        rows, count = _exchanged(g, name, head, 0, fields, summarized, check)
    agreed = int(rows[:, 6].max())
    if agreed != nbytes:  # the local plan was for another size
        nbytes, local = agreed, None
    strategy, chunks = local or _plan(g, name, dtype, nbytes, red_code)
    STATS.strategy = strategy
    sources: tuple[_Source, ...] = ()
    if strategy == switch.COMPRESSED:
        sources = _sources(dtype, rows[:, _FIELDS + _extra_fields(g.world) :], table)
    digest = _plans.digest(count, rows.tobytes())
    return _settled(
        _Agreed(g, name, strategy, table, chunks, sources, ticket=replace(ticket, digest=digest))
    )


def _exchanged(
    g: Group,
    name: str,
    head: list[int],
    tag: int,
    fields: Sequence[int],
    sample: torch.Tensor | None,
    check: Callable[[np.ndarray], None] | None,
) -> tuple[np.ndarray, int]:
    """One descriptor exchange -- every rank's row of ``head``, plan ``tag``, ``fields`` and
    sample summary (zeros without ``sample``) -- and the checks of it that raise the same
    CollectiveMismatchError on every rank. Returns the rows and the exchange's number in its
    group (zipccl._plans.digest). Every op's row has the same length: no op can mismatch."""
    pad = [0] * (_extra_fields(g.world) - len(fields))
    row = [*head, tag, *fields, *pad]
    count = _plans.exchanged(switch.group_key(g.pg))
    rows = exchange(g, row, name, codec.SUMMARY_WORDS, _summary(sample))
    require_same(rows, 2, "the dtype", name, dtype_name)
    require_same(
        rows,
        3,
        "the table (hash; 0 = each rank's own theory table)",
        name,
        lambda h: f"{h % (1 << 64):#018x}",
    )
    require_same(rows, 4, "ZIPCCL_MODE", name, lambda m: switch.MODES[m])
    require_same(rows, 5, "the reduce op", name)
    if check is not None:
        check(rows[:, _FIELDS:])
    return rows, count


def _settled(a: _Agreed) -> _Agreed:
    """``a`` as the call runs it: a call with nothing to measure keeps its plan at once."""
    if a.strategy != switch.COMPRESSED:
        _keep(a)
        return replace(a, ticket=None)
    return a


def _keep(a: _Agreed) -> None:
    """Keep ``a`` (with what the call measured) as its key's plan, once the call has completed
    its agreement on every rank."""
    if a.ticket is not None:
        _plans.keep(a.ticket, replace(a, ticket=None))


def _same_fields(name: str, *named: tuple[int, str]) -> Callable[[np.ndarray], None]:
    """A ``check`` for :func:`_agree`: the op's fields at these columns agree across ranks."""

    def check(fields: np.ndarray) -> None:
        for column, what in named:
            require_same(fields, column, what, name)

    return check


def _summary(sample: torch.Tensor | None) -> Callable[[torch.Tensor], object]:
    """What writes a descriptor row's tail: codec.sample_summary of ``sample``, zeros where None
    (a broadcast's receivers, calls that cannot compress)."""
    if sample is None:
        return torch.Tensor.zero_
    return lambda out: codec.sample_summary(sample, out)


def _shared_sources(
    g: Group, name: str, dtype: torch.dtype, sample: torch.Tensor | None, table: Codebook | None
) -> tuple[_Source, ...]:
    """Only the summaries, exchanged: all-reduce's second compressed half, whose shards exist
    only after the first, and the switch's profile of the protocols."""
    rows = exchange(g, [_OP_CODES[name], 0], name, codec.SUMMARY_WORDS, _summary(sample))
    return _sources(dtype, rows[:, 2:], table)


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


def _plan(g: Group, name: str, dtype: torch.dtype, nbytes: int, red_code: int) -> tuple[str, int]:
    """Strategy and chunk count, the same on every rank: they depend only on agreed values and
    the agreed profile. Auto mode on CUDA takes the model's chunk count unless
    ``ZIPCCL_CHUNK_BYTES`` is set (switch.best_chunks)."""
    chunks = _chunks(g, nbytes)
    if dtype not in CODEC_DTYPES or red_code == 99:
        return switch.NATIVE, chunks  # nothing to compress, or an op only the backend implements
    if nbytes == 0:  # nothing to compress; but gloo cannot reduce fp8, not even an empty tensor
        gloo_fp8 = red_code >= 0 and dtype in _BYTE_VIEW and not g.cuda
        return (switch.A2A_REDUCE if gloo_fp8 else switch.NATIVE), chunks
    mode = switch.mode()
    if mode != "auto":
        return (switch.COMPRESSED if mode == "always" else switch.NATIVE), chunks
    native_ok = _native_reduce_ok(g, dtype) if name in ("reduce_scatter", "all_reduce") else None
    call = switch.Call(name, nbytes, dtype, g.world, chunks, native_ok)
    profile = switch.profile_for(g)
    if g.cuda and not switch.chunks_given():
        call = replace(call, chunks=switch.best_chunks(profile, call))
    return switch.choose(profile, call), call.chunks


def all_reduce_strategy(
    tensor: torch.Tensor, op: ReduceOpArg = ReduceOp.SUM, group: dist.ProcessGroup | None = None
) -> str:
    """What :func:`all_reduce` would do with this tensor (without verification).

    The switch's local decision from values every rank shares (op, dtype, size, world size,
    ``ZIPCCL_MODE``, ``ZIPCCL_CHUNK_BYTES``, ``ZIPCCL_NATIVE_REDUCE`` and the group's profile),
    cached per group and call shape. :func:`zipccl.ddp_hook` uses it to hand native buckets
    straight to torch. In ``auto`` mode the group's first decision measures (or loads) the
    switch's profile, a collective, so every rank must ask at the same point; a group's first
    zipccl call also agrees on the settings (a store round trip).

    Args:
        tensor (Tensor): the tensor that would be all-reduced.
        op (ReduceOp, optional): the reduce op; default SUM.
        group (ProcessGroup, optional): the group; None (default): the default group.

    Returns:
        str: ``"native"`` (torch's all-reduce; always for a ``zipccl``-backend group),
        ``"a2a_reduce"`` (an uncompressed all-to-all and zipccl's local reduction) or
        ``"compressed"``.

    Raises:
        CollectiveMismatchError: on a group's first call, ranks whose ``ZIPCCL_*`` settings
            differ.
        ValueError: a malformed ``ZIPCCL_*`` value.

    Example::

        >>> # on every rank, after dist.init_process_group("nccl")
        >>> t = torch.randn(1 << 24, dtype=torch.bfloat16, device="cuda")
        >>> zipccl.all_reduce_strategy(t) in ("native", "a2a_reduce", "compressed")
        True
    """
    if _entered(group):
        return switch.NATIVE
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


def _buffers(sizes: Sequence[int], device: torch.device) -> list[torch.Tensor]:
    """Views of one uint8 allocation, one per size: a call's buffers in one go, not per chunk."""
    return _segments(torch.empty(sum(sizes), dtype=torch.uint8, device=device), sizes)


_TABLES: dict[Codebook, Codebook] = {}


def _canonical(table: Codebook) -> Codebook:
    """One object per distinct table, so the codec's per-object device copy of it is reused."""
    if len(_TABLES) >= 1 << 12:  # theory tables are few, but a caller's own need not be
        _TABLES.clear()
    return _TABLES.setdefault(table, table)


# --------------------------------------------------------------------------- the wire

SLOT_ALIGN = 256  # every piece's size on the wire: NCCL moves odd sizes far slower (run D)
MARGIN = {False: 1.25, True: 1.05}  # payload room / predicted payload: exponent formats, FP8
MEASURED_MARGIN = 1.05  # payload room / the payload the key's previous call measured
SLACK = 256  # bytes of payload room on top of the margin


@dataclass(frozen=True)
class _Source:
    """One rank's data as every rank knows it after the exchange: the table it encodes with and
    the payload bits per value that its sample spends under that table."""

    table: Codebook
    bits: float


def _sources(
    dtype: torch.dtype, summaries: np.ndarray, table: Codebook | None
) -> tuple[_Source, ...]:
    """Every rank's :class:`_Source` from the exchanged sample summaries (codec.sample_summary):
    the agreed ``table``, else each rank's theory table -- built alike on every rank."""
    found = []
    for rank, row in enumerate(summaries):
        _check_summary(rank, row)
        book = _canonical(table if table is not None else codec.summary_table(dtype, row))
        found.append(_Source(book, codec.payload_bits(book, row)))
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


@dataclass(frozen=True)
class _Seg:
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


def _seg(dtype: torch.dtype, numel: int, room: int | None) -> _Seg:
    """The split layout with ``room`` bytes for the payload, unless that is no smaller than the
    raw values or ``room`` is None. A collective that moves equal sizes widens every piece to
    the widest one's width (:func:`_widened`)."""
    if numel == 0:
        return _Seg(0, 0, 0)
    fmt = codec._fmt(dtype)
    raw = _aligned(numel * fmt.bits // 8)
    if room is None:
        return _Seg(numel, 0, raw)
    fixed = codec._fixed(fmt, numel, DEFAULT_BLOCK)
    split = _aligned(fixed + room)
    return _Seg(numel, 0, raw) if split >= raw else _Seg(numel, fixed, split)


def _predicted_room(dtype: torch.dtype, numel: int, src: _Source) -> int:
    """Payload room for ``numel`` values as ``src``'s sample predicts them: times MARGIN, plus a
    byte per block and SLACK."""
    fmt = codec._fmt(dtype)
    return (
        math.ceil(src.bits * numel / 8 * MARGIN[fmt.byte_coded])
        + SLACK
        + -(-numel // DEFAULT_BLOCK)
    )


def _widened(segs: list[_Seg]) -> list[_Seg]:
    """The pieces as wide as the widest: the extra bytes are payload room (or unread padding)."""
    width = max(seg.width for seg in segs)
    return [replace(seg, width=width) for seg in segs]


def _pack(x: torch.Tensor, seg: _Seg, table: Codebook, store: torch.Tensor) -> None:
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


def _payload_size(head: bytes) -> int:
    return int.from_bytes(head[PAYLOAD_BYTES_AT : PAYLOAD_BYTES_AT + 8], "little")


class _Unpack:
    """Decodes one call's received pieces as they land, without a host sync, and then
    (:meth:`settle`) reads, in one copy, what only the headers and the decoders can tell.

    A split piece's payload size is in its header, which the host has not seen when the decode
    is queued: the CUDA kernel reads it there and skips a piece whose payload overflowed its room
    (other backends read the header on the host first). ``note`` registers a header to read
    without decoding (a sender's own pieces): where a payload overflowed, the protocol resends
    the piece raw, and both ends must know.
    """

    def __init__(self, g: Group, dtype: torch.dtype) -> None:
        self.fmt = codec._fmt(dtype)
        self.checksum: bool = settings.value("ZIPCCL_CHECKSUM")  # the pieces carry one
        self.flag = _flag(g.device) if g.cuda else None  # zeroed by the call's first decode
        self.used: QueuedCodec | None = None  # the backend whose decodes set the flag
        self.heads: dict[object, tuple[torch.Tensor, _Seg, Codebook]] = {}
        self.sizes: dict[object, int] = {}  # after settle: every noted piece's payload bytes

    def note(self, key: object, got: torch.Tensor, seg: _Seg, table: Codebook) -> None:
        if not seg.raw and seg.numel:
            self.heads[key] = (got[:HEADER_BYTES], seg, table)

    def __call__(
        self, key: object, got: torch.Tensor, seg: _Seg, table: Codebook, out: torch.Tensor
    ) -> None:
        """Decode the piece ``got`` (at least ``seg.width`` bytes, as received) into the
        contiguous ``out``."""
        if seg.raw:
            _flat(out).view(torch.uint8).copy_(got[: out.numel() * out.element_size()])
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
        size = _payload_size(head)
        if size <= seg.room:  # else resent raw after settle
            backend.decode_into(got[: seg.fixed + size], self.fmt, table, DEFAULT_BLOCK, size, out)
            if self.checksum:
                codec._check_values(out, _stored_checksum(head))

    def settle(self, streams: Streams) -> set[object]:
        """After every decode: one copy of the flag and the noted headers to the host; raise
        ValueError on a corrupt piece; return the keys of the pieces whose payload overflowed
        (and keep every noted piece's payload size in :attr:`sizes`: the next call of the same
        key sizes its pieces by them)."""
        keys = list(self.heads)
        parts = [self.heads[k][0] for k in keys]
        if self.used is not None:
            assert self.flag is not None  # a backend used the flag
            parts.append(self.flag.view(torch.uint8))
        raw = _read(streams, parts)
        if self.used is not None:
            self.used.raise_on_flag(int(raw[-4:].view(np.int32)[0]) & ~self.used.ROOM_ERROR)
        over = set()
        for i, key in enumerate(keys):
            _, seg, table = self.heads[key]
            head = raw[i * HEADER_BYTES : (i + 1) * HEADER_BYTES].tobytes()
            checked = _checked(head, self.fmt, seg.numel, table, self.checksum)
            self.sizes[key] = _payload_size(checked)
            if self.sizes[key] > seg.room:
                over.add(key)
        return over


def _flag(device: torch.device) -> torch.Tensor:
    """The decoders' int32 error flag on ``device``, one per thread: a call reads it back (and so
    waits for it) before it returns, and the next call's first decode zeroes it."""
    return per_thread(("flag", device), lambda: torch.zeros(1, dtype=torch.int32, device=device))


def _stored_checksum(head: bytes) -> int:
    return int.from_bytes(head[CHECKSUM_AT : CHECKSUM_AT + 8], "little")


def _checked(
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


def _read(streams: Streams, parts: Sequence[torch.Tensor]) -> np.ndarray:
    """The bytes of device tensors on the host in one copy: a call's one sync between its exchange
    and its agreement. Runs on the decompress stream after the compress stream's queued work."""
    if not parts:
        return np.empty(0, dtype=np.uint8)
    if streams.decompress is not None:
        assert streams.compress is not None  # streams_for makes both or neither
        streams.decompress.wait_stream(streams.compress)
    with streams.on(streams.decompress):
        return torch.cat([t.reshape(-1).view(torch.uint8) for t in parts]).cpu().numpy()


def _settle(outcome: Outcome, unpack: _Unpack, streams: Streams) -> tuple[set[object], bool]:
    """A protocol's end, after its last data collective: :meth:`_Unpack.settle`'s one host read
    and checks, then the ranks' agreement on the call's outcome, which raises on every rank if
    any rank failed. Returns the keys of this rank's overflowed pieces and whether any rank has
    some (an all-to-all's resend involves every rank)."""
    over: set[object] = set()
    with outcome.local():
        over = unpack.settle(streams)
    return over, outcome.agree(bool(over))


def _global(g: Group, rank: int) -> int:
    return dist.get_global_rank(g.pg, rank) if g.pg is not None else rank


def _done(async_op: bool) -> DoneWork | None:
    """What a compressed call returns: torch's convention, a Work only when async_op."""
    return DoneWork() if async_op else None


def protocol_call(g: Group, op: str, x: torch.Tensor) -> Callable[[], object]:
    """A compressed ``op`` ("all_gather", "all_to_all" or "broadcast" from group rank 0) of the
    flat ``x`` through the protocol alone -- the summary exchange, one chunk, each rank's theory
    table, no descriptor checks: what the switch's profile measures its model against
    (switch._overhead)."""
    flat = _flat(x)

    def agreed(sample: torch.Tensor | None) -> _Agreed:
        sources = _shared_sources(g, op, x.dtype, sample, None)
        return _Agreed(g, op, switch.COMPRESSED, None, 1, sources)

    if op == "all_gather":
        out = torch.empty(g.world * flat.numel(), dtype=x.dtype, device=x.device)
        return lambda: _gather_compressed(agreed(flat), flat, out)
    if op == "all_to_all":
        out = torch.empty_like(flat)
        return lambda: _a2a_compressed(
            agreed(flat), list(flat.view(g.world, -1)), list(out.view(g.world, -1))
        )
    buf = flat.clone()
    return lambda: _broadcast_compressed(agreed(buf if g.rank == 0 else None), buf, 0)


# --------------------------------------------------------------------------- all-gather


def all_gather_into_tensor(
    output_tensor: torch.Tensor,
    input_tensor: torch.Tensor,
    group: dist.ProcessGroup | None = None,
    async_op: bool = False,
    *,
    table: Codebook | None = None,
    verify: bool | None = None,
) -> dist.Work | None:
    """torch.distributed.all_gather_into_tensor, compressed where it pays.

    ``output_tensor`` receives every rank's ``input_tensor`` end to end in group rank order,
    bit-identical to torch's result. A compressed call encodes this rank's input once (its
    default table, or ``table``) into a slot as wide as the widest rank's, all-gathers the
    slots in one collective per chunk and decodes each rank's piece as it lands; a piece whose
    payload outgrew its slot is resent raw after one host read at the end of the call.

    Only ``bfloat16``, ``float16``, ``float32``, ``float8_e4m3fn`` and ``float8_e5m2`` tensors are
    ever compressed; other dtypes take torch's path (FP8 travels as bytes there, so gloo moves it
    too). A call the switch keeps native and that is not verified goes straight to torch.distributed
    with the caller's tensors and returns torch's own Work; a verified or compressed call first
    exchanges a small descriptor (one all-gather and a host sync), and a compressed one encodes the
    pieces with the codec (golden/container.py's bytes), moves them in one collective per chunk and
    decodes them as they land (module docstring: Protocols). A call repeating an earlier one (same
    op, group, dtype, sizes, table and settings) reuses that call's tables and strategy: a *plan*
    (module docstring: Plans).

    Settings (read at every call; a group's ranks agree on them before its first zipccl call, else
    CollectiveMismatchError): ``ZIPCCL_MODE`` (``auto``, default: compress where the switch's cost
    model, measured once per group and cached, predicts a gain; ``always``; ``never``: plain
    torch.distributed, no verification), ``ZIPCCL_VERIFY`` (unless ``verify`` is given),
    ``ZIPCCL_CHUNK_BYTES`` (per-rank bytes per pipeline chunk; default: the model's chunk count in
    ``auto`` on CUDA, else 32 MiB on CUDA and one chunk on CPU), ``ZIPCCL_PLAN_CALLS`` (calls one
    plan serves, default 64; 0: no plans); the codec's ``ZIPCCL_BACKEND`` and ``ZIPCCL_FAST`` choose
    its kernels (same bytes, so not agreed).

    Args:
        output_tensor (Tensor): ``world_size * input_tensor.numel()`` values of the input's
            dtype (any shape), contiguous.
        input_tensor (Tensor): this rank's values, the same numel on every rank, contiguous;
            on CUDA for NCCL, on CPU for gloo.
        group (ProcessGroup, optional): the group; None (default): the default group. A group
            of the ``zipccl`` backend hands the call to torch.distributed, whose backend then
            runs zipccl's protocol on its inner group (never compressed twice).
        async_op (bool, optional): return a Work instead of None.
        table (Codebook, optional): the table every rank codes its pieces with; every rank must
            pass the same one (its hash is checked). None (default): each rank's default table
            (:func:`zipccl.default_table` of its sample), which every rank builds from the
            exchanged sample summaries. Ignored where the call goes straight to torch.
        verify (bool, optional): True: exchange the descriptor for every call, native ones too
            (``ZIPCCL_VERIFY=1``); False: only where the protocol exchanges it anyway
            (``ZIPCCL_VERIFY=0``); None (default): ``ZIPCCL_VERIFY`` (``auto``: calls that take
            zipccl's own protocols).

    Returns:
        A Work if ``async_op``, else None: torch's own where the call went to torch.distributed,
        else a completed :class:`~zipccl._comm.DoneWork` (the result is in place, queued on the
        caller's stream; its ``wait()`` and CUDA-aware future order the waiting stream after
        it).

    Raises:
        CollectiveMismatchError: (a ValueError; on every rank) on a verified or compressed call
            whose ranks' arguments do not fit together (dtype, input size, table, ZIPCCL_MODE) or
            where one rank's are wrong (the output's size, input and output dtypes that differ,
            non-contiguous tensors, tensors on the wrong device for the backend); on a group's first
            call, ranks whose ``ZIPCCL_*`` settings differ.
        PeerError: (a RuntimeError) another rank failed inside the same compressed call; that
            rank raises its own exception (ValueError for a corrupt piece it received).
        TypeError: ``table`` is neither a Codebook nor None (where zipccl's path is taken).
        ValueError: a malformed ``ZIPCCL_*`` value. A call handed straight to torch raises
            torch's own errors instead.

    Example::

        >>> # on every rank, after dist.init_process_group("nccl")
        >>> rank, world = dist.get_rank(), dist.get_world_size()
        >>> shard = torch.randn(1 << 20, dtype=torch.bfloat16, device="cuda")
        >>> full = torch.empty(world * shard.numel(), dtype=shard.dtype, device="cuda")
        >>> zipccl.all_gather_into_tensor(full, shard)
        >>> torch.equal(full.view(world, -1)[rank], shard)
        True
    """
    nbytes = input_tensor.numel() * input_tensor.element_size()
    if _direct(group, input_tensor, "all_gather", nbytes, -1, verify):
        return dist.all_gather_into_tensor(
            _wire(output_tensor), _wire(input_tensor), group, async_op
        )
    g = resolve(group, input_tensor)
    err = _check_pair(
        g, input_tensor, output_tensor, output_tensor.numel(), input_tensor.numel() * g.world
    )
    agreed = _agree(
        g,
        "all_gather",
        input_tensor.dtype,
        nbytes,
        err,
        [input_tensor.numel()],
        table,
        verify_policy(verify) != "0",
        sample=input_tensor,
        check=_same_fields("all_gather", (0, "the input numel")),
    )
    if agreed.strategy != switch.COMPRESSED:
        return dist.all_gather_into_tensor(
            _wire(output_tensor), _wire(input_tensor), group, async_op
        )
    sizes = _gather_compressed(agreed, _flat(input_tensor), _flat(output_tensor))
    _keep(replace(agreed, sizes=sizes))
    return _done(async_op)


def _check_pair(g: Group, inp: torch.Tensor, out: torch.Tensor, out_numel: int, want: int) -> int:
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


def _gather_compressed(a: _Agreed, inp: torch.Tensor, out: torch.Tensor) -> dict[object, int]:
    """One all-gather per chunk of every rank's piece in its agreed width (the largest rank's),
    decoded as it lands; after the last, one host read finds overflowed payloads, whose pieces
    their ranks then broadcast raw. Returns every split piece's payload size (every rank reads
    every header)."""
    g, n, dtype = a.g, inp.numel(), inp.dtype
    rows = out.view(g.world, n)
    streams = streams_for(g)
    unpack = _Unpack(g, dtype)
    pieces = _pieces(n, a.chunks)
    segs = [
        _widened([a.seg((k, r), dtype, m, r) for r in range(g.world)])
        for k, (_, m) in enumerate(pieces)
    ]
    widths = [row[0].width for row in segs]
    stores = _buffers(widths, g.device)
    received = _buffers([g.world * w for w in widths], g.device)
    outcome = Outcome(g, a.name)
    with ordered(g, streams):
        copied = False  # the rank's own row: copied once the first chunk is on the wire
        for k, (s, m) in enumerate(pieces):
            if not m:
                continue
            with streams.on(streams.compress):
                with outcome.local(SENDING):
                    _pack(inp[s : s + m], segs[k][g.rank], a.sources[g.rank].table, stores[k])
                work = dist.all_gather_into_tensor(
                    received[k], stores[k], group=g.pg, async_op=True
                )
            STATS.sent += widths[k]
            with streams.on(streams.decompress):
                if not copied:
                    _copy_behind(streams, rows[g.rank], inp)
                    copied = True
                work.wait()
                got = received[k].view(g.world, widths[k])
                with outcome.local():
                    for r, (seg, src) in enumerate(zip(segs[k], a.sources, strict=True)):
                        if r == g.rank:  # every rank notes every header: same overflows
                            unpack.note((k, r), got[r], seg, src.table)
                        else:
                            unpack((k, r), got[r], seg, src.table, rows[r, s : s + m])
        over, _ = _settle(outcome, unpack, streams)
        for r in range(g.world):
            ks = [k for k in range(a.chunks) if (k, r) in over]
            if ks:
                _resend(
                    g, streams, r, [(rows[r], *pieces[k]) for k in ks], inp if r == g.rank else None
                )
    return unpack.sizes


def _copy_behind(streams: Streams, dst: torch.Tensor, src: torch.Tensor) -> None:
    """``dst.copy_(src)`` on the decompress stream once the compress stream's queued encodes are
    done: beside an encode, a copy this size takes its memory bandwidth and holds back the wire;
    beside the collective it costs nothing."""
    if streams.decompress is not None:
        assert streams.compress is not None  # streams_for makes both or neither
        streams.decompress.wait_stream(streams.compress)
    dst.copy_(src)


def _resend(
    g: Group,
    streams: Streams,
    src: int,
    parts: list[tuple[torch.Tensor, int, int]],
    own: torch.Tensor | None,
) -> None:
    """Group rank ``src`` broadcasts its (row, start, length) pieces raw, from ``own`` (on
    ``src``) into the rows (elsewhere): the pieces whose payload overflowed their room."""
    with streams.on(streams.decompress):
        if own is not None:
            buf = torch.cat([own[s : s + m] for _, s, m in parts])
        else:
            buf = torch.empty(sum(m for *_, m in parts), dtype=parts[0][0].dtype, device=g.device)
        dist.broadcast(_wire(buf), _global(g, src), group=g.pg)
        STATS.sent += buf.numel() * buf.element_size() if own is not None else 0
        if own is None:
            for (row, s, m), piece in zip(parts, buf.split([m for *_, m in parts]), strict=True):
                row[s : s + m].copy_(piece)


def all_gather(
    tensor_list: list[torch.Tensor],
    tensor: torch.Tensor,
    group: dist.ProcessGroup | None = None,
    async_op: bool = False,
    *,
    table: Codebook | None = None,
    verify: bool | None = None,
) -> dist.Work | None:
    """torch.distributed.all_gather (equal shapes), through :func:`all_gather_into_tensor`.

    ``tensor_list[r]`` receives rank r's ``tensor``. Where every entry of ``tensor_list`` has
    ``tensor``'s shape and dtype, the call gathers into one flat buffer with
    :func:`all_gather_into_tensor` (``table`` and ``verify`` passed on; compressed where it
    pays) and copies the pieces out; otherwise, or where the switch keeps it native and it is
    not verified, it is torch.distributed.all_gather as is.

    Only ``bfloat16``, ``float16``, ``float32``, ``float8_e4m3fn`` and ``float8_e5m2`` tensors are
    ever compressed; other dtypes take torch's path (FP8 travels as bytes there, so gloo moves it
    too). A call the switch keeps native and that is not verified goes straight to torch.distributed
    with the caller's tensors and returns torch's own Work; a verified or compressed call first
    exchanges a small descriptor (one all-gather and a host sync), and a compressed one encodes the
    pieces with the codec (golden/container.py's bytes), moves them in one collective per chunk and
    decodes them as they land (module docstring: Protocols). A call repeating an earlier one (same
    op, group, dtype, sizes, table and settings) reuses that call's tables and strategy: a *plan*
    (module docstring: Plans).

    Settings (read at every call; a group's ranks agree on them before its first zipccl call, else
    CollectiveMismatchError): ``ZIPCCL_MODE`` (``auto``, default: compress where the switch's cost
    model, measured once per group and cached, predicts a gain; ``always``; ``never``: plain
    torch.distributed, no verification), ``ZIPCCL_VERIFY`` (unless ``verify`` is given),
    ``ZIPCCL_CHUNK_BYTES`` (per-rank bytes per pipeline chunk; default: the model's chunk count in
    ``auto`` on CUDA, else 32 MiB on CUDA and one chunk on CPU), ``ZIPCCL_PLAN_CALLS`` (calls one
    plan serves, default 64; 0: no plans); the codec's ``ZIPCCL_BACKEND`` and ``ZIPCCL_FAST`` choose
    its kernels (same bytes, so not agreed).

    Args:
        tensor_list (list of Tensor): ``world_size`` tensors, overwritten.
        tensor (Tensor): this rank's tensor (any strides); on CUDA for NCCL, on CPU for gloo.
        group (ProcessGroup, optional): the group; None (default): the default group. A group
            of the ``zipccl`` backend hands the call to torch.distributed, whose backend then
            runs zipccl's protocol on its inner group (never compressed twice).
        async_op (bool, optional): return a Work instead of None.
        table (Codebook, optional): the table every rank codes its pieces with; every rank must
            pass the same one (its hash is checked). None (default): each rank's default table
            (:func:`zipccl.default_table` of its sample), which every rank builds from the
            exchanged sample summaries. Ignored where the call goes straight to torch.
        verify (bool, optional): True: exchange the descriptor for every call, native ones too
            (``ZIPCCL_VERIFY=1``); False: only where the protocol exchanges it anyway
            (``ZIPCCL_VERIFY=0``); None (default): ``ZIPCCL_VERIFY`` (``auto``: calls that take
            zipccl's own protocols).

    Returns:
        A Work if ``async_op``, else None: torch's own where the call went to
        torch.distributed.all_gather, else a completed :class:`~zipccl._comm.DoneWork` (the result
        is in place, queued on the caller's stream; its ``wait()`` and CUDA-aware future order the
        waiting stream after it).

    Raises:
        CollectiveMismatchError: (a ValueError; on every rank) on a verified or compressed call
            whose ranks' arguments do not fit together (dtype, size, table, ZIPCCL_MODE) or where
            one rank's tensor is on the wrong device for the backend; on a group's first call,
            ranks whose ``ZIPCCL_*`` settings differ.
        PeerError: (a RuntimeError) another rank failed inside the same compressed call; that
            rank raises its own exception (ValueError for a corrupt piece it received).
        TypeError: ``table`` is neither a Codebook nor None (where zipccl's path is taken).
        ValueError: a malformed ``ZIPCCL_*`` value. A call handed straight to torch raises
            torch's own errors instead.

    Example::

        >>> # on every rank, after dist.init_process_group("nccl")
        >>> t = torch.randn(4096, 1024, dtype=torch.bfloat16, device="cuda")
        >>> gathered = [torch.empty_like(t) for _ in range(dist.get_world_size())]
        >>> zipccl.all_gather(gathered, t)
        >>> torch.equal(gathered[dist.get_rank()], t)
        True
    """
    nbytes = tensor.numel() * tensor.element_size()
    if _direct(group, tensor, "all_gather", nbytes, -1, verify) or not all(
        t.shape == tensor.shape and t.dtype == tensor.dtype for t in tensor_list
    ):
        return dist.all_gather([_wire(t) for t in tensor_list], _wire(tensor), group, async_op)
    flat = torch.empty(len(tensor_list) * tensor.numel(), dtype=tensor.dtype, device=tensor.device)
    all_gather_into_tensor(flat, tensor.contiguous(), group, table=table, verify=verify)
    for t, part in zip(tensor_list, flat.view(len(tensor_list), -1), strict=True):
        t.copy_(part.view(t.shape))
    return _done(async_op)


# --------------------------------------------------------------------------- all-to-all


def all_to_all_single(
    output: torch.Tensor,
    input: torch.Tensor,
    output_split_sizes: list[int] | None = None,
    input_split_sizes: list[int] | None = None,
    group: dist.ProcessGroup | None = None,
    async_op: bool = False,
    *,
    table: Codebook | None = None,
    verify: bool | None = None,
) -> dist.Work | None:
    """torch.distributed.all_to_all_single (uneven splits included), compressed where it pays.

    Even splits (both split arguments None or empty) follow the verification policy like every
    other op: torch then needs the same input size on every rank. With explicit splits the sizes
    differ per rank, so no rank can decide alone: the call goes straight to torch only where the
    profile never compresses this dtype (``switch.can_compress``) and ``ZIPCCL_VERIFY`` is not 1;
    otherwise it exchanges the descriptor -- which then also checks the splits -- whatever the
    policy, because every rank must use the same strategy and chunk count. So in auto mode every
    rank must pass its splits the same way (all None or all lists).

    Rank i's rows ``input_split_sizes[j]`` (dimension 0) go to rank j, which receives them at
    ``output_split_sizes[i]``; bit-identical to torch's result. A compressed call moves every
    (src, dst) piece in a slot both ends size from the agreed splits and the sender's sample
    summary, in one all-to-all per chunk (between two ranks an all-gather, faster on NCCL over
    sockets); a piece whose payload outgrew its slot is resent raw in one more all-to-all.

    Only ``bfloat16``, ``float16``, ``float32``, ``float8_e4m3fn`` and ``float8_e5m2`` tensors are
    ever compressed; other dtypes take torch's path (FP8 travels as bytes there, so gloo moves it
    too). A call the switch keeps native and that is not verified goes straight to torch.distributed
    with the caller's tensors and returns torch's own Work; a verified or compressed call first
    exchanges a small descriptor (one all-gather and a host sync), and a compressed one encodes the
    pieces with the codec (golden/container.py's bytes), moves them in one collective per chunk and
    decodes them as they land (module docstring: Protocols). A call repeating an earlier one (same
    op, group, dtype, sizes, table and settings) reuses that call's tables and strategy: a *plan*
    (module docstring: Plans).

    Settings (read at every call; a group's ranks agree on them before its first zipccl call, else
    CollectiveMismatchError): ``ZIPCCL_MODE`` (``auto``, default: compress where the switch's cost
    model, measured once per group and cached, predicts a gain; ``always``; ``never``: plain
    torch.distributed, no verification), ``ZIPCCL_VERIFY`` (unless ``verify`` is given),
    ``ZIPCCL_CHUNK_BYTES`` (per-rank bytes per pipeline chunk; default: the model's chunk count in
    ``auto`` on CUDA, else 32 MiB on CUDA and one chunk on CPU), ``ZIPCCL_PLAN_CALLS`` (calls one
    plan serves, default 64; 0: no plans); the codec's ``ZIPCCL_BACKEND`` and ``ZIPCCL_FAST`` choose
    its kernels (same bytes, so not agreed).

    Args:
        output (Tensor): receives the pieces, contiguous, with ``input``'s dtype and row size.
        input (Tensor): the rows to send, contiguous; on CUDA for NCCL, on CPU for gloo.
        output_split_sizes (list of int, optional): rows received from each rank; None or
            empty: ``output.shape[0] // world_size`` each.
        input_split_sizes (list of int, optional): rows sent to each rank; None or empty:
            ``input.shape[0] // world_size`` each.
        group (ProcessGroup, optional): the group; None (default): the default group. A group
            of the ``zipccl`` backend hands the call to torch.distributed, whose backend then
            runs zipccl's protocol on its inner group (never compressed twice).
        async_op (bool, optional): return a Work instead of None.
        table (Codebook, optional): the table every rank codes its pieces with; every rank must
            pass the same one (its hash is checked). None (default): each rank's default table
            (:func:`zipccl.default_table` of its sample), which every rank builds from the
            exchanged sample summaries. Ignored where the call goes straight to torch.
        verify (bool, optional): True: exchange the descriptor for every call, native ones too
            (``ZIPCCL_VERIFY=1``); False: only where the protocol exchanges it anyway
            (``ZIPCCL_VERIFY=0``); None (default): ``ZIPCCL_VERIFY`` (``auto``: calls that take
            zipccl's own protocols).

    Returns:
        A Work if ``async_op``, else None: torch's own where the call went to torch.distributed,
        else a completed :class:`~zipccl._comm.DoneWork` (the result is in place, queued on the
        caller's stream; its ``wait()`` and CUDA-aware future order the waiting stream after
        it).

    Raises:
        CollectiveMismatchError: (a ValueError; on every rank) on a verified or compressed call
            whose ranks' arguments do not fit together (dtype, row size, rank i's input split j not
            rank j's output split i, table, ZIPCCL_MODE) or where one rank's are wrong (splits that
            do not add up to the first dimension, differing dtypes, non-contiguous tensors, tensors
            on the wrong device for the backend); on a group's first call, ranks whose ``ZIPCCL_*``
            settings differ.
        PeerError: (a RuntimeError) another rank failed inside the same compressed call; that
            rank raises its own exception (ValueError for a corrupt piece it received).
        TypeError: ``table`` is neither a Codebook nor None (where zipccl's path is taken).
        ValueError: a malformed ``ZIPCCL_*`` value. A call handed straight to torch raises
            torch's own errors instead.

    Example::

        >>> # on every rank, after dist.init_process_group("nccl"): an even all-to-all
        >>> world = dist.get_world_size()
        >>> tokens = torch.randn(world * 512, 4096, dtype=torch.bfloat16, device="cuda")
        >>> routed = torch.empty_like(tokens)
        >>> zipccl.all_to_all_single(routed, tokens)
        >>> # uneven (MoE dispatch): send[j] rows to rank j, as the router decided
        >>> send = torch.full((world,), 512, dtype=torch.int64, device="cuda")
        >>> recv = torch.empty_like(send)
        >>> dist.all_to_all_single(recv, send)  # every rank learns what it receives
        >>> routed = torch.empty(int(recv.sum()), 4096, dtype=tokens.dtype, device="cuda")
        >>> zipccl.all_to_all_single(routed, tokens, recv.tolist(), send.tolist())
    """
    even = not output_split_sizes and not input_split_sizes
    nbytes = input.numel() * input.element_size() if even else None
    if _direct(group, input, "all_to_all", nbytes, -1, verify):
        return dist.all_to_all_single(
            _wire(output), _wire(input), output_split_sizes, input_split_sizes, group, async_op
        )
    g = resolve(group, input)
    ins, outs, err = _splits(g, input, output, input_split_sizes, output_split_sizes)
    agreed = _agree(
        g,
        "all_to_all",
        input.dtype,
        input.numel() * input.element_size(),
        err,
        [*ins, *outs, _inner(input)],
        table,
        not even or verify_policy(verify) != "0",
        sample=input,
        check=lambda fields: _check_splits(fields, g.world),
    )
    if agreed.strategy != switch.COMPRESSED:
        return dist.all_to_all_single(
            _wire(output), _wire(input), output_split_sizes, input_split_sizes, group, async_op
        )
    inner = _inner(input)
    send = _segments(_flat(input), [s * inner for s in ins])
    recv = _segments(_flat(output), [s * inner for s in outs])
    _keep(replace(agreed, sizes=_a2a_compressed(agreed, send, recv)))
    return _done(async_op)


def _inner(t: torch.Tensor) -> int:
    """Elements per row (split sizes count rows of dimension 0)."""
    return math.prod(t.shape[1:]) if t.dim() else 1


def _splits(
    g: Group, inp: torch.Tensor, out: torch.Tensor, ins: list[int] | None, outs: list[int] | None
) -> tuple[list[int], list[int], int]:
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


def _check_splits(desc: np.ndarray, world: int) -> None:
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


def _a2a_compressed(
    a: _Agreed, send: list[torch.Tensor], recv: list[torch.Tensor]
) -> dict[object, int]:
    """Compressed all-to-all of flat segments: per chunk, one :func:`_swap` of every (src, dst)
    piece in the width both ends compute from the agreed splits and the sender's summary (or
    what the key's previous call measured of that piece: both ends read its header), decoded as
    it lands; after the last chunk, one host read finds overflowed payloads, whose pieces one
    all-to-all then moves raw. Returns the payload sizes of the split pieces this rank sent and
    received."""
    g, dtype = a.g, send[0].dtype
    streams = streams_for(g)
    unpack = _Unpack(g, dtype)
    me, peers = a.sources[g.rank], range(g.world)
    sent_at = [_pieces(seg.numel(), a.chunks) for seg in send]  # [peer][chunk] = (start, numel)
    got_at = [_pieces(seg.numel(), a.chunks) for seg in recv]
    outs, ins = [], []  # [chunk][peer]: the pieces this rank sends and receives
    for k in range(a.chunks):
        out = [
            a.seg(("out", k, j), dtype, sent_at[j][k][1] if j != g.rank else 0, g.rank)
            for j in peers
        ]
        into = [a.seg(("in", k, i), dtype, got_at[i][k][1] if i != g.rank else 0, i) for i in peers]
        if g.world == 2:  # one all-gather: both pieces as wide as the wider (_swap)
            peer = 1 - g.rank
            out[peer], into[peer] = _widened([out[peer], into[peer]])
        outs.append(out)
        ins.append(into)
    stores = _buffers([sum(s.width for s in out) for out in outs], g.device)
    keep = []  # receive buffers live until the caller's stream is re-joined (see ordered)
    outcome = Outcome(g, a.name)
    with ordered(g, streams):
        for k in range(a.chunks):
            mine = _segments(stores[k], [s.width for s in outs[k]])
            with streams.on(streams.compress), outcome.local(SENDING):
                for j in peers:
                    s, m = sent_at[j][k]
                    if m and j != g.rank:
                        _pack(send[j][s : s + m], outs[k][j], me.table, mine[j])
                        unpack.note(("out", k, j), mine[j], outs[k][j], me.table)
            got, work = _swap(g, streams, stores[k], mine, [s.width for s in ins[k]])
            keep.append(got)
            with streams.on(streams.decompress):
                if k == 0:  # the rank's piece to itself, once the first chunk is on the wire
                    _copy_behind(streams, recv[g.rank], send[g.rank])
                if work is not None:
                    work.wait()
                with outcome.local():
                    for i in peers:
                        s, m = got_at[i][k]
                        if m and i != g.rank:
                            unpack(
                                ("in", k, i),
                                got[i],
                                ins[k][i],
                                a.sources[i].table,
                                recv[i][s : s + m],
                            )
        over, anywhere = _settle(outcome, unpack, streams)
        if anywhere:  # an all-to-all: every rank takes part, with or without pieces of its own
            _resend_pairs(g, streams, over, send, sent_at, recv, got_at)
    return unpack.sizes


def _resend_pairs(
    g: Group,
    streams: Streams,
    over: set[object],
    send: list[torch.Tensor],
    sent_at: list[list[tuple[int, int]]],
    recv: list[torch.Tensor],
    got_at: list[list[tuple[int, int]]],
) -> None:
    """One all-to-all of the raw pieces whose payload overflowed: this rank knows its own
    (its headers) and its peers' (the received headers), and so do they."""
    ks = range(len(sent_at[0]))
    outgoing = [[sent_at[j][k] for k in ks if ("out", k, j) in over] for j in range(g.world)]
    incoming = [[got_at[i][k] for k in ks if ("in", k, i) in over] for i in range(g.world)]
    parts = [send[j][s : s + m] for j, at in enumerate(outgoing) for s, m in at]
    with streams.on(streams.decompress):
        buf = torch.cat(parts) if parts else send[0].new_empty(0)
        got = torch.empty(
            sum(m for at in incoming for _, m in at), dtype=buf.dtype, device=buf.device
        )
        dist.all_to_all_single(
            _wire(got),
            _wire(buf),
            [sum(m for _, m in at) for at in incoming],
            [sum(m for _, m in at) for at in outgoing],
            group=g.pg,
        )
        STATS.sent += buf.numel() * buf.element_size()
        pieces = got.split([m for at in incoming for _, m in at])
        targets = [recv[i][s : s + m] for i, at in enumerate(incoming) for s, m in at]
        for target, piece in zip(targets, pieces, strict=True):
            target.copy_(piece)


def _swap(
    g: Group, streams: Streams, whole: torch.Tensor, out: list[torch.Tensor], in_sizes: list[int]
) -> tuple[list[torch.Tensor], dist.Work | None]:
    """Send ``out[j]`` (views of the one buffer ``whole``, in rank order) to every rank j and
    receive ``in_sizes[i]`` bytes from every rank i, issued from the compress stream; returns
    the received pieces and the Work (None where two ranks have nothing to swap).

    Two ranks: one all-gather of the outgoing piece, which the caller made as wide as the
    incoming one. NCCL's all-gather outruns its all-to-all of the same bytes over sockets by
    ~1.4x (BENCHMARKS.md, run D); otherwise all_to_all_single. Called on the caller's stream,
    where receive buffers are allocated (see :func:`ordered`).
    """
    if g.world == 2 and not whole.numel():  # nothing either way: both ranks skip
        return [whole, whole], None
    got = torch.empty(
        sum(in_sizes) if g.world != 2 else 2 * whole.numel(), dtype=torch.uint8, device=g.device
    )
    with streams.on(streams.compress):
        if g.world != 2:
            work = dist.all_to_all_single(
                got, whole, in_sizes, [t.numel() for t in out], group=g.pg, async_op=True
            )
        else:
            work = dist.all_gather_into_tensor(got, whole, group=g.pg, async_op=True)
    STATS.sent += whole.numel()
    if g.world != 2:
        return _segments(got, in_sizes), work
    peer = 1 - g.rank
    pieces = [got[:0], got[:0]]
    pieces[peer] = got[peer * whole.numel() : (peer + 1) * whole.numel()]
    return pieces, work


# --------------------------------------------------------------------------- reductions


def reference_reduce(parts: Sequence[torch.Tensor], op: ReduceOpArg = ReduceOp.SUM) -> torch.Tensor:
    """The reduction every zipccl reduce op computes: fp32, rank order 0..W-1, rounded once.

    ``parts[0]`` op ``parts[1]`` op ... in float32, then one rounding to ``parts[0]``'s dtype
    (AVG: the float32 sum divided by ``len(parts)`` before it). :func:`reduce_scatter_tensor`
    and :func:`all_reduce` give exactly these bits whatever their strategy, except where
    ``ZIPCCL_NATIVE_REDUCE=1`` lets them take the backend's own reduction. Local: no group.

    Args:
        parts (sequence of Tensor): one tensor per rank, in rank order, of one shape and dtype.
        op (ReduceOp, optional): ``SUM`` (default), ``AVG``, ``PRODUCT``, ``MIN`` or ``MAX``.

    Returns:
        Tensor: a new tensor of ``parts[0]``'s shape and dtype.

    Raises:
        ValueError: any other ``op``.

    Example::

        >>> a = torch.tensor([1.0, 256.0], dtype=torch.bfloat16)
        >>> zipccl.reference_reduce([a, a, a], dist.ReduceOp.AVG)
        tensor([  1., 256.], dtype=torch.bfloat16)
    """
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


def reduce_scatter_tensor(
    output: torch.Tensor,
    input: torch.Tensor,
    op: ReduceOpArg = ReduceOp.SUM,
    group: dist.ProcessGroup | None = None,
    async_op: bool = False,
    *,
    table: Codebook | None = None,
    verify: bool | None = None,
) -> dist.Work | None:
    """torch.distributed.reduce_scatter_tensor with the deterministic fp32 reduction.

    Rank r's ``output`` becomes the reduction over every rank of block r of ``input`` (input
    holds world_size blocks of ``output.numel()`` values). zipccl moves the W blocks by an
    all-to-all (compressed where it pays, or not: ``a2a_reduce``) and reduces locally, as
    :func:`reference_reduce` does: float32, rank order 0..W-1, rounded once -- the same bits on
    every run. With two ranks the backend's own reduce-scatter gives those bits too, so the
    switch may take it; with more, ``auto`` takes it only under ``ZIPCCL_NATIVE_REDUCE=1``
    (and ``ZIPCCL_MODE=never`` always does). Ops other than SUM, AVG, PRODUCT, MIN and MAX
    (PREMUL_SUM, bitwise) go to torch.

    Only ``bfloat16``, ``float16``, ``float32``, ``float8_e4m3fn`` and ``float8_e5m2`` tensors are
    ever compressed; other dtypes take torch's path. gloo cannot reduce FP8, so there ``auto`` and
    ``always`` reduce it in zipccl. A call the switch keeps native and that is not verified goes
    straight to torch.distributed with the caller's tensors and returns torch's own Work; a verified
    or compressed call first exchanges a small descriptor (one all-gather and a host sync), and a
    compressed one encodes the pieces with the codec (golden/container.py's bytes), moves them in
    one collective per chunk and decodes them as they land (module docstring: Protocols). A call
    repeating an earlier one (same op, group, dtype, sizes, table and settings) reuses that call's
    tables and strategy: a *plan* (module docstring: Plans).

    Settings (read at every call; a group's ranks agree on them before its first zipccl call, else
    CollectiveMismatchError): ``ZIPCCL_MODE`` (``auto``, default: compress where the switch's cost
    model, measured once per group and cached, predicts a gain; ``always``; ``never``: plain
    torch.distributed, no verification), ``ZIPCCL_VERIFY`` (unless ``verify`` is given),
    ``ZIPCCL_CHUNK_BYTES`` (per-rank bytes per pipeline chunk; default: the model's chunk count in
    ``auto`` on CUDA, else 32 MiB on CUDA and one chunk on CPU), ``ZIPCCL_PLAN_CALLS`` (calls one
    plan serves, default 64; 0: no plans), ``ZIPCCL_NATIVE_REDUCE=1`` (let ``auto`` take the
    backend's own reduction for any world size, giving up rank-order determinism when it does); the
    codec's ``ZIPCCL_BACKEND`` and ``ZIPCCL_FAST`` choose its kernels (same bytes, so not agreed).

    Args:
        output (Tensor): this rank's reduced block, ``input.numel() // world_size`` values of
            ``input``'s dtype, contiguous.
        input (Tensor): ``world_size * output.numel()`` values, contiguous; on CUDA for NCCL,
            on CPU for gloo.
        op (ReduceOp, optional): ``SUM`` (default), ``AVG``, ``PRODUCT``, ``MIN``, ``MAX``; any
            other goes to torch.
        group (ProcessGroup, optional): the group; None (default): the default group. A group
            of the ``zipccl`` backend hands the call to torch.distributed, whose backend then
            runs zipccl's protocol on its inner group (never compressed twice).
        async_op (bool, optional): return a Work instead of None.
        table (Codebook, optional): the table every rank codes its pieces with; every rank must
            pass the same one (its hash is checked). None (default): each rank's default table
            (:func:`zipccl.default_table` of its sample), which every rank builds from the
            exchanged sample summaries. Ignored where the call goes straight to torch.
        verify (bool, optional): True: exchange the descriptor for every call, native ones too
            (``ZIPCCL_VERIFY=1``); False: only where the protocol exchanges it anyway
            (``ZIPCCL_VERIFY=0``); None (default): ``ZIPCCL_VERIFY`` (``auto``: calls that take
            zipccl's own protocols).

    Returns:
        A Work if ``async_op``, else None: torch's own where the call went to torch.distributed,
        else a completed :class:`~zipccl._comm.DoneWork` (the result is in place, queued on the
        caller's stream; its ``wait()`` and CUDA-aware future order the waiting stream after
        it).

    Raises:
        CollectiveMismatchError: (a ValueError; on every rank) on a verified or compressed call
            whose ranks' arguments do not fit together (dtype, input size, table, reduce op,
            ZIPCCL_MODE) or where one rank's are wrong (the output's size, input and output dtypes
            that differ, non-contiguous tensors, tensors on the wrong device for the backend); on a
            group's first call, ranks whose ``ZIPCCL_*`` settings differ.
        PeerError: (a RuntimeError) another rank failed inside the same compressed call; that
            rank raises its own exception (ValueError for a corrupt piece it received).
        TypeError: ``table`` is neither a Codebook nor None (where zipccl's path is taken).
        ValueError: a malformed ``ZIPCCL_*`` value. A call handed straight to torch raises
            torch's own errors instead.

    Example::

        >>> # on every rank, after dist.init_process_group("nccl")
        >>> world = dist.get_world_size()
        >>> grads = torch.randn(world * (1 << 20), dtype=torch.bfloat16, device="cuda")
        >>> shard = torch.empty(1 << 20, dtype=torch.bfloat16, device="cuda")
        >>> zipccl.reduce_scatter_tensor(shard, grads, op=dist.ReduceOp.AVG)
    """
    nbytes = input.numel() * input.element_size()
    if _direct(group, input, "reduce_scatter", nbytes, _red_code(op), verify):
        return dist.reduce_scatter_tensor(output, input, op, group, async_op)
    g = resolve(group, input)
    err = _check_pair(g, input, output, input.numel(), output.numel() * g.world)
    agreed = _agree(
        g,
        "reduce_scatter",
        input.dtype,
        nbytes,
        err,
        [input.numel()],
        table,
        verify_policy(verify) != "0",
        red=op,
        sample=input,
        check=_same_fields("reduce_scatter", (0, "the input numel")),
    )
    if agreed.strategy == switch.NATIVE:
        return dist.reduce_scatter_tensor(output, input, op, group, async_op)
    _keep(_reduce_scatter(agreed, _flat(input), _flat(output), op))
    return _done(async_op)


def _reduce_scatter(a: _Agreed, inp: torch.Tensor, out: torch.Tensor, op: ReduceOpArg) -> _Agreed:
    """All-to-all of the W row blocks (compressed or not), then the rank-order fp32 reduction.
    Returns ``a`` with what a compressed all-to-all measured."""
    g = a.g
    if a.strategy != switch.COMPRESSED:
        STATS.sent += inp.numel() * inp.element_size() * (g.world - 1) // g.world
    if a.strategy == switch.NATIVE:
        dist.reduce_scatter_tensor(out, inp, op, g.pg)
        return a
    staging = torch.empty_like(inp).view(g.world, -1)
    if a.strategy == switch.COMPRESSED:
        a = replace(a, sizes=_a2a_compressed(a, list(inp.view(g.world, -1)), list(staging)))
    else:
        dist.all_to_all_single(_wire(staging), _wire(inp), group=g.pg)
    _reduce_into(out, list(staging), op)
    return a


_ONE_ADD = (torch.bfloat16, torch.float16, torch.float32)


def _reduce_into(out: torch.Tensor, parts: list[torch.Tensor], op: ReduceOpArg) -> None:
    """:func:`reference_reduce` into ``out``; the sum of two parts as one add, which computes
    in fp32 and rounds once -- the same bits in one pass instead of five."""
    if op == ReduceOp.SUM and len(parts) == 2 and out.dtype in _ONE_ADD:
        torch.add(parts[0], parts[1], out=out)
    else:
        out.copy_(reference_reduce(parts, op))


def all_reduce(
    tensor: torch.Tensor,
    op: ReduceOpArg = ReduceOp.SUM,
    group: dist.ProcessGroup | None = None,
    async_op: bool = False,
    *,
    table: Codebook | None = None,
    verify: bool | None = None,
) -> dist.Work | None:
    """torch.distributed.all_reduce as reduce-scatter + all-gather, each compressed where it pays.

    In place: every rank's ``tensor`` becomes the reduction over all ranks, the same bits on
    every rank -- :func:`reference_reduce` of the ranks' tensors (float32, rank order, rounded
    once), reduced shard by shard and all-gathered losslessly. The flat tensor (padded with
    zeros to a multiple of the world size where needed) is reduce-scattered
    (:func:`reduce_scatter_tensor`'s strategies) and then all-gathered
    (:func:`all_gather_into_tensor`'s), each half compressed only where it pays. With two ranks
    the backend's own all-reduce gives the same bits, so the switch may take it; with more,
    ``auto`` takes it only under ``ZIPCCL_NATIVE_REDUCE=1`` (and ``ZIPCCL_MODE=never`` always
    does). Ops other than SUM, AVG, PRODUCT, MIN and MAX (PREMUL_SUM, bitwise) go to torch.

    Only ``bfloat16``, ``float16``, ``float32``, ``float8_e4m3fn`` and ``float8_e5m2`` tensors are
    ever compressed; other dtypes take torch's path. gloo cannot reduce FP8, so there ``auto`` and
    ``always`` reduce it in zipccl. A call the switch keeps native and that is not verified goes
    straight to torch.distributed with the caller's tensors and returns torch's own Work; a verified
    or compressed call first exchanges a small descriptor (one all-gather and a host sync), and a
    compressed one encodes the pieces with the codec (golden/container.py's bytes), moves them in
    one collective per chunk and decodes them as they land (module docstring: Protocols). A call
    repeating an earlier one (same op, group, dtype, sizes, table and settings) reuses that call's
    tables and strategy: a *plan* (module docstring: Plans).

    Settings (read at every call; a group's ranks agree on them before its first zipccl call, else
    CollectiveMismatchError): ``ZIPCCL_MODE`` (``auto``, default: compress where the switch's cost
    model, measured once per group and cached, predicts a gain; ``always``; ``never``: plain
    torch.distributed, no verification), ``ZIPCCL_VERIFY`` (unless ``verify`` is given),
    ``ZIPCCL_CHUNK_BYTES`` (per-rank bytes per pipeline chunk; default: the model's chunk count in
    ``auto`` on CUDA, else 32 MiB on CUDA and one chunk on CPU), ``ZIPCCL_PLAN_CALLS`` (calls one
    plan serves, default 64; 0: no plans), ``ZIPCCL_NATIVE_REDUCE=1`` (let ``auto`` take the
    backend's own reduction for any world size, giving up rank-order determinism when it does); the
    codec's ``ZIPCCL_BACKEND`` and ``ZIPCCL_FAST`` choose its kernels (same bytes, so not agreed).

    Args:
        tensor (Tensor): reduced in place; contiguous, on CUDA for NCCL, on CPU for gloo.
        op (ReduceOp, optional): ``SUM`` (default), ``AVG``, ``PRODUCT``, ``MIN``, ``MAX``; any
            other goes to torch.
        group (ProcessGroup, optional): the group; None (default): the default group. A group
            of the ``zipccl`` backend hands the call to torch.distributed, whose backend then
            runs zipccl's protocol on its inner group (never compressed twice).
        async_op (bool, optional): return a Work instead of None.
        table (Codebook, optional): the table every rank codes its pieces with; every rank must
            pass the same one (its hash is checked). None (default): each rank's default table
            (:func:`zipccl.default_table` of its sample), which every rank builds from the
            exchanged sample summaries. Ignored where the call goes straight to torch.
        verify (bool, optional): True: exchange the descriptor for every call, native ones too
            (``ZIPCCL_VERIFY=1``); False: only where the protocol exchanges it anyway
            (``ZIPCCL_VERIFY=0``); None (default): ``ZIPCCL_VERIFY`` (``auto``: calls that take
            zipccl's own protocols).

    Returns:
        A Work if ``async_op``, else None: torch's own where the call went to torch.distributed,
        else a completed :class:`~zipccl._comm.DoneWork` (the result is in place, queued on the
        caller's stream; its ``wait()`` and CUDA-aware future order the waiting stream after
        it).

    Raises:
        CollectiveMismatchError: (a ValueError; on every rank) on a verified or compressed call
            whose ranks' arguments do not fit together (dtype, numel, table, reduce op, ZIPCCL_MODE)
            or where one rank's are wrong (a non-contiguous tensor, a tensor on the wrong device for
            the backend); on a group's first call, ranks whose ``ZIPCCL_*`` settings differ.
        PeerError: (a RuntimeError) another rank failed inside the same compressed call; that
            rank raises its own exception (ValueError for a corrupt piece it received).
        TypeError: ``table`` is neither a Codebook nor None (where zipccl's path is taken).
        ValueError: a malformed ``ZIPCCL_*`` value. A call handed straight to torch raises
            torch's own errors instead.

    Example::

        >>> # on every rank, after dist.init_process_group("nccl")
        >>> t = torch.randn(1 << 24, dtype=torch.bfloat16, device="cuda")
        >>> zipccl.all_reduce(t, op=dist.ReduceOp.AVG)  # t: the mean, alike on every rank
        >>> work = zipccl.all_reduce(t, async_op=True)
        >>> work.wait()
        True
    """
    nbytes = tensor.numel() * tensor.element_size()
    if _direct(group, tensor, "all_reduce", nbytes, _red_code(op), verify):
        return dist.all_reduce(tensor, op, group, async_op)
    g = resolve(group, tensor)
    err = 4 if not tensor.is_contiguous() else 5 if tensor.device.type != g.device.type else 0
    agreed = _agree(
        g,
        "all_reduce",
        tensor.dtype,
        nbytes,
        err,
        [tensor.numel()],
        table,
        verify_policy(verify) != "0",
        red=op,
        sample=tensor,
        check=_same_fields("all_reduce", (0, "the tensor numel")),
    )
    if agreed.strategy == switch.NATIVE:
        return dist.all_reduce(tensor, op, group, async_op)
    _all_reduce(agreed, tensor, op)
    return _done(async_op)


def _all_reduce(a: _Agreed, tensor: torch.Tensor, op: ReduceOpArg) -> None:
    g, flat = a.g, _flat(tensor)
    shard = -(-flat.numel() // g.world)
    padded = (
        flat
        if shard * g.world == flat.numel()
        else torch.zeros(shard * g.world, dtype=flat.dtype, device=flat.device)
    )
    if padded is not flat:
        padded[: flat.numel()].copy_(flat)
    part = torch.empty(shard, dtype=flat.dtype, device=flat.device)
    rs, ag = a.halves or _halves(a, flat.dtype, padded.numel(), op)
    rs = _reduce_scatter(rs, padded, part, op)
    ag = _gather_half(ag, part, padded)
    if padded is not flat:
        flat.copy_(padded[: flat.numel()])
    _keep(replace(a, halves=(rs, ag)))


def _halves(a: _Agreed, dtype: torch.dtype, numel: int, op: ReduceOpArg) -> tuple[_Agreed, _Agreed]:
    """An all-reduce's reduce-scatter of its ``numel`` padded values and all-gather of the
    shards, a compressed one's each compressed only where that half pays; the all-gather's
    sources come once the shards exist (:func:`_gather_half`)."""
    g, nbytes = a.g, numel * dtype.itemsize
    rs, ag = switch.A2A_REDUCE, switch.NATIVE
    if a.strategy == switch.COMPRESSED:
        rs = _strategy(g, "reduce_scatter", dtype, nbytes, _LOCAL_OPS[op])
        ag = _strategy(g, "all_gather", dtype, nbytes // g.world, -1)
    return (
        replace(a, strategy=rs, ticket=None),
        replace(a, strategy=ag, chunks=max(1, a.chunks // g.world), sources=(), ticket=None),
    )


def _gather_half(a: _Agreed, part: torch.Tensor, out: torch.Tensor) -> _Agreed:
    """An all-reduce's all-gather of the reduced shards; returns ``a`` with the sources and
    sizes a compressed one used (a first call exchanges the shards' summaries for them)."""
    if a.strategy != switch.COMPRESSED:
        dist.all_gather_into_tensor(_wire(out), _wire(part), group=a.g.pg)
        STATS.sent += part.numel() * part.element_size()
        return a
    if not a.sources:
        a = replace(a, sources=_shared_sources(a.g, "all_reduce", part.dtype, part, a.table))
    return replace(a, sizes=_gather_compressed(a, part, out))


# --------------------------------------------------------------------------- broadcast


def broadcast(
    tensor: torch.Tensor,
    src: int | None = None,
    group: dist.ProcessGroup | None = None,
    async_op: bool = False,
    *,
    table: Codebook | None = None,
    verify: bool | None = None,
) -> dist.Work | None:
    """torch.distributed.broadcast (``src`` a global rank), compressed where it pays.

    Every rank's ``tensor`` becomes the source's, bit for bit. A compressed call encodes only on
    the source (with the source's default table, or ``table``) and broadcasts one slot per
    chunk, which every other rank decodes as it lands.

    Only ``bfloat16``, ``float16``, ``float32``, ``float8_e4m3fn`` and ``float8_e5m2`` tensors are
    ever compressed; other dtypes take torch's path (FP8 travels as bytes there, so gloo moves it
    too). A call the switch keeps native and that is not verified goes straight to torch.distributed
    with the caller's tensors and returns torch's own Work; a verified or compressed call first
    exchanges a small descriptor (one all-gather and a host sync), and a compressed one encodes the
    pieces with the codec (golden/container.py's bytes), moves them in one collective per chunk and
    decodes them as they land (module docstring: Protocols). A call repeating an earlier one (same
    op, group, dtype, sizes, table and settings) reuses that call's tables and strategy: a *plan*
    (module docstring: Plans).

    Settings (read at every call; a group's ranks agree on them before its first zipccl call, else
    CollectiveMismatchError): ``ZIPCCL_MODE`` (``auto``, default: compress where the switch's cost
    model, measured once per group and cached, predicts a gain; ``always``; ``never``: plain
    torch.distributed, no verification), ``ZIPCCL_VERIFY`` (unless ``verify`` is given),
    ``ZIPCCL_CHUNK_BYTES`` (per-rank bytes per pipeline chunk; default: the model's chunk count in
    ``auto`` on CUDA, else 32 MiB on CUDA and one chunk on CPU), ``ZIPCCL_PLAN_CALLS`` (calls one
    plan serves, default 64; 0: no plans); the codec's ``ZIPCCL_BACKEND`` and ``ZIPCCL_FAST`` choose
    its kernels (same bytes, so not agreed).

    Args:
        tensor (Tensor): the data on ``src``, overwritten elsewhere; the same numel and dtype on
            every rank, contiguous, on CUDA for NCCL, on CPU for gloo.
        src (int, optional): the source's global rank; None (default): 0.
        group (ProcessGroup, optional): the group; None (default): the default group. A group
            of the ``zipccl`` backend hands the call to torch.distributed, whose backend then
            runs zipccl's protocol on its inner group (never compressed twice).
        async_op (bool, optional): return a Work instead of None.
        table (Codebook, optional): the table every rank codes its pieces with; every rank must
            pass the same one (its hash is checked). None (default): each rank's default table
            (:func:`zipccl.default_table` of its sample), which every rank builds from the
            exchanged sample summaries. Ignored where the call goes straight to torch.
        verify (bool, optional): True: exchange the descriptor for every call, native ones too
            (``ZIPCCL_VERIFY=1``); False: only where the protocol exchanges it anyway
            (``ZIPCCL_VERIFY=0``); None (default): ``ZIPCCL_VERIFY`` (``auto``: calls that take
            zipccl's own protocols).

    Returns:
        A Work if ``async_op``, else None: torch's own where the call went to torch.distributed,
        else a completed :class:`~zipccl._comm.DoneWork` (the result is in place, queued on the
        caller's stream; its ``wait()`` and CUDA-aware future order the waiting stream after
        it).

    Raises:
        CollectiveMismatchError: (a ValueError; on every rank) on a verified or compressed call
            whose ranks' arguments do not fit together (dtype, numel, ``src``, table, ZIPCCL_MODE)
            or where one rank's are wrong (``src`` not a rank of the group, a non-contiguous tensor,
            a tensor on the wrong device for the backend); on a group's first call, ranks whose
            ``ZIPCCL_*`` settings differ.
        PeerError: (a RuntimeError) another rank failed inside the same compressed call; that
            rank raises its own exception (ValueError for a corrupt piece it received).
        TypeError: ``table`` is neither a Codebook nor None (where zipccl's path is taken).
        ValueError: a malformed ``ZIPCCL_*`` value. A call handed straight to torch raises
            torch's own errors instead.

    Example::

        >>> # on every rank, after dist.init_process_group("nccl")
        >>> w = torch.empty(1 << 22, dtype=torch.bfloat16, device="cuda")
        >>> if dist.get_rank() == 0:
        ...     _ = w.normal_()
        >>> zipccl.broadcast(w, src=0)  # w: rank 0's values on every rank
    """
    src = 0 if src is None else src
    nbytes = tensor.numel() * tensor.element_size()
    if _direct(group, tensor, "broadcast", nbytes, -1, verify):
        return dist.broadcast(_wire(tensor), src, group, async_op)
    g = resolve(group, tensor)
    group_src = dist.get_group_rank(group, src) if group is not None else src
    err = 6 if not 0 <= group_src < g.world else _check_pair(g, tensor, tensor, 0, 0)
    agreed = _agree(
        g,
        "broadcast",
        tensor.dtype,
        nbytes,
        err,
        [tensor.numel(), src],
        table,
        verify_policy(verify) != "0",
        sample=tensor if g.rank == group_src else None,
        check=_same_fields("broadcast", (1, "src"), (0, "the tensor numel")),
    )
    if agreed.strategy != switch.COMPRESSED:
        return dist.broadcast(_wire(tensor), src, group, async_op)
    _keep(replace(agreed, sizes=_broadcast_compressed(agreed, _flat(tensor), group_src)))
    return _done(async_op)


def _broadcast_compressed(a: _Agreed, flat: torch.Tensor, group_src: int) -> dict[object, int]:
    """One broadcast per chunk of the source's piece in the width every rank computes from its
    summary (or the key's previous call), decoded as it lands; after the last, one host read
    finds overflowed payloads, whose pieces the source then broadcasts raw. Returns the split
    pieces' payload sizes."""
    g = a.g
    streams = streams_for(g)
    sender, source = g.rank == group_src, a.sources[group_src]
    unpack = _Unpack(g, flat.dtype)
    pieces = _pieces(flat.numel(), a.chunks)
    segs = [a.seg(k, flat.dtype, m, group_src) for k, (_, m) in enumerate(pieces)]
    buffers = _buffers([seg.width for seg in segs], g.device)
    outcome = Outcome(g, a.name)
    with ordered(g, streams):
        for k, (s, m) in enumerate(pieces):
            if not m:
                continue
            with streams.on(streams.compress):
                if sender:
                    with outcome.local(SENDING):
                        _pack(flat[s : s + m], segs[k], source.table, buffers[k])
                work = dist.broadcast(buffers[k], _global(g, group_src), group=g.pg, async_op=True)
            STATS.sent += segs[k].width if sender else 0
            with streams.on(streams.decompress):
                work.wait()
                if sender:
                    unpack.note(k, buffers[k], segs[k], source.table)
                else:
                    with outcome.local():
                        unpack(k, buffers[k], segs[k], source.table, flat[s : s + m])
        over, _ = _settle(outcome, unpack, streams)
        if over:
            _resend(
                g,
                streams,
                group_src,
                [(flat, *pieces[k]) for k in sorted(cast("set[int]", over))],  # keys: k
                flat if sender else None,
            )
    return unpack.sizes


__all__ = [
    "CollectiveMismatchError",
    "PeerError",
    "all_gather",
    "all_gather_into_tensor",
    "all_reduce",
    "all_reduce_strategy",
    "all_to_all_single",
    "broadcast",
    "reduce_scatter_tensor",
    "reference_reduce",
]
