"""What a call sends, agreed by every rank: the local decision (native fast path), the plan
cache and the descriptor exchange that fixes strategy and chunk count on every rank.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import cast

import numpy as np
import torch
import torch.distributed as dist

from zipccl import _groups, _plans, codec, settings, switch
from zipccl._errors import CollectiveMismatchError
from zipccl.collectives import _exchange, _profile, _slots, _transport
from zipccl.golden.codebook import Codebook
from zipccl.golden.container import HEADER_BYTES

ReduceOp = dist.ReduceOp


# an op argument: torch's stubs type ReduceOp.SUM & co. as ReduceOp.RedOpType, which its bindings
# take (converted) wherever they take a ReduceOp
ReduceOpArg = ReduceOp | ReduceOp.RedOpType


MODE_CODES = {m: i for i, m in enumerate(switch.MODES)}


LOCAL_OPS: dict[ReduceOpArg, int] = {
    ReduceOp.SUM: 0,
    ReduceOp.AVG: 1,
    ReduceOp.PRODUCT: 2,
    ReduceOp.MIN: 3,
    ReduceOp.MAX: 4,
}


def table_hash(table: Codebook | None) -> int:
    if table is not None and not isinstance(table, Codebook):
        raise TypeError(f"table must be a golden Codebook or None, got {type(table).__name__}")
    return table.hash64 if table is not None else 0


VERIFY_POLICIES = settings.VERIFY_POLICIES


def verify_policy(verify: bool | None = None) -> str:
    """The verification policy of one call: ``verify`` if given, else ``ZIPCCL_VERIFY``.

    ``auto`` (default): exchange the descriptor for every call on a host transport (gloo: a
    host round trip, no device sync) and, on NCCL, for calls that take zipccl's own protocols
    (compressed, a2a_reduce) -- native NCCL calls go straight to torch, since the exchange would
    make the host wait for the device; ``1``: every call (debug); ``0``: none.
    """
    if verify is not None:
        return "1" if verify else "0"
    return settings.value("ZIPCCL_VERIFY")


def direct(
    group: dist.ProcessGroup | None,
    t: torch.Tensor,
    name: str,
    nbytes: int | None,
    red_code: int,
    verify: bool | None,
) -> bool:
    """Whether this call goes straight to torch.distributed with the caller's own arguments.

    True under ``ZIPCCL_MODE=never`` (zipccl bypassed), for a group of the ``zipccl`` backend
    (which compresses inside), and where the local decision is native and the policy does not
    ask for verification (:func:`verify_policy`). The decision depends only on values every rank
    shares in a correct program -- the group's first call checks that they do (:func:`entered`);
    where they differ (a mismatched call), the ranks that verify meet in the descriptor
    exchange, so on a host transport ``auto`` verifies every call: a rank going native there
    while its peers compress would crash or corrupt gloo.
    """
    if entered(group):
        return True
    policy = verify_policy(verify)
    if policy == "1" or (policy == "auto" and not device_exchange(group, t)):
        # before the local decision: it may load the profile, a collective of its own that
        # mismatched calls would not match
        return switch.mode() == "never"
    return _local_strategy(group, t, name, nbytes, red_code) == switch.NATIVE


def device_exchange(group: dist.ProcessGroup | None, t: torch.Tensor) -> bool:
    """Whether this call's descriptor exchange would run on the device (NCCL): a host sync."""
    return t.is_cuda and "nccl" in str(dist.get_backend(group)).lower()


def entered(group: dist.ProcessGroup | None) -> bool:
    """Whether ``group`` belongs to the ``zipccl`` backend (whose own collectives call zipccl's
    on its inner groups); for any other group, its ranks' settings are agreed first (once per
    group: settings.ensure_agreed)."""
    pg = _groups.current(group)
    if isinstance(pg, _transport.Forwarding):
        return True
    settings.ensure_agreed(cast(dist.ProcessGroup, pg))  # the group itself, WORLD for None
    return False


def _local_strategy(
    group: dist.ProcessGroup | None,
    t: torch.Tensor,
    name: str,
    nbytes: int | None,
    red_code: int,
    env: tuple[object, ...] | None = None,
) -> str:
    """:func:`routed`'s strategy for this rank's own (op, dtype, size, reduce op)."""
    return routed(_transport.resolve(group, t), name, t.dtype, nbytes, red_code, env)[0]


def routed(
    g: _transport.Group,
    name: str,
    dtype: torch.dtype,
    nbytes: int | None,
    red_code: int,
    env: tuple[object, ...] | None = None,
) -> tuple[str, int]:
    """:func:`strategy_and_chunks`, cached per group (_groups.key: a re-created default
    group is a new key), where its tensors live and environment (``env``: :func:`settings.raw`,
    read again when None): training repeats its calls, and the cost model is pure Python.

    ``nbytes`` None: an all-to-all with explicit splits, whose sizes differ per rank; it is native
    only where the profile never compresses that op and dtype, else AGREE (needs the exchange).
    """
    env = env or settings.raw()
    where = g.device.type  # a gloo group's host and (staged) CUDA tensors differ
    key = (_groups.key(g.pg), where, name, dtype, nbytes, red_code, env[0], env[2], env[3])
    found = switch.ROUTES.get(key)
    if found is None:
        found = (
            strategy_and_chunks(g, name, dtype, nbytes, red_code)
            if nbytes is not None
            else (_uneven_strategy(g, name, dtype), 1)
        )
        if len(switch.ROUTES) >= 1 << 16:
            switch.ROUTES.clear()
        switch.ROUTES[key] = found
    return found


_AGREE = "agree"  # the strategy needs the sizes of every rank (uneven all-to-all)


def _uneven_strategy(g: _transport.Group, name: str, dtype: torch.dtype) -> str:
    """NATIVE where no size could make this op compressed, else AGREE."""
    mode = switch.mode()
    if dtype not in _exchange.CODEC_DTYPES or mode == "never":
        return switch.NATIVE
    if mode == "auto" and not switch.can_compress(_profile.profile_for(g), name, dtype, g.world):
        return switch.NATIVE
    return _AGREE


_FIELDS = _exchange.HEAD_WORDS  # where the op's own fields start


_TAG = _FIELDS - 1  # the descriptor's column of the plan tag (0: none), after the common head


def _tails(g: _transport.Group, rows: np.ndarray) -> np.ndarray:
    """Every rank's words after its fields: its sample summary, then a packed call's sizes."""
    return rows[:, _FIELDS + _extra_fields(g.world) :]


def _summaries(g: _transport.Group, rows: np.ndarray) -> np.ndarray:
    return _tails(g, rows)[:, : codec.SUMMARY_WORDS]


def agree(
    g: _transport.Group,
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
    sizes_differ: bool = False,
    payload: torch.Tensor | None = None,
    buffer: int = 0,
    pack: Callable[[_slots.Agreed], _slots.Packed | None] | None = None,
    signature: tuple[object, ...] | None = None,
) -> _slots.Agreed:
    """Exchange the descriptor (if asked, or if the call compresses: the exchange also carries
    every rank's sample summary of ``sample``, which the compressed protocols size their pieces
    by), check it (``check``: the op's own checks of every rank's ``fields``), pick the strategy
    from the agreed size.

    Without ``exchange_desc`` (an even call, whose size every rank shares in a correct program)
    the local plan tells whether the call compresses; with it, nothing collective may precede the
    exchange (loading the profile is one), so the local plan is made first only where it needs
    no collective -- else, and where the ranks' sizes differ (``sizes_differ``: an all-to-all
    with explicit splits), every call that could compress sends a summary.

    A key's later calls (zipccl._plans) send their plan's tag instead of a summary, in the same
    exchange: where every rank sent the same tag they take the plan -- no summary, table or
    strategy to compute -- else every rank sees the difference and they exchange afresh. On a
    host transport ``pack`` may encode a planned call's pieces before the exchange
    (:class:`_slots.Packed`): its row then carries the rank's summary and payload sizes, and
    the call runs on the plan with every rank's tables from now and exact piece sizes.

    ``buffer`` (an in-place op's tensor address; 0: none) is part of the plan's key: DDP
    all-reduces each gradient bucket in its own buffer, and buckets of one size hold gradients
    of different scales, whose tables would not fit one another. Ranks whose addresses differ
    still agree through the plans' tags.

    On a host transport the exchange also carries ``payload`` (the call's input bytes, where
    they fit the row's room; see :func:`carried_payload`): where every rank's fits and the call
    does not compress, the result's ``carried`` holds every rank's, and the op completes
    from it without a second round.

    ``signature`` (:func:`repeated`): where the call's strategy did not depend on the
    exchange (decided locally, uncompressed, every rank's row alike; or an uneven all-to-all
    native whatever its sizes), its agreement is kept for the signature's next calls.
    """
    mode = switch.mode()
    red_code = -1 if red is None else reduce_code(red)
    if not (table is None or isinstance(table, Codebook)):  # reported, not raised: peers wait
        err, table = err or _exchange.BAD_TABLE, None
    head = [
        _exchange.OP_CODES[name],
        err,
        _exchange.dtype_code(dtype),
        _exchange.to_i64(table_hash(table)),
        MODE_CODES[mode],
        -1 if red is None else reduce_op_number(red),
        nbytes,
    ]
    plan_first = not exchange_desc or not (sizes_differ or _needs_profile(g, dtype, mode))
    local = routed(g, name, dtype, nbytes, red_code) if plan_first else None
    ticket = None
    if local is None or local[0] == switch.COMPRESSED:  # only compressed calls keep plans
        ticket = _ticket(g, head, fields, exchange_desc, buffer)
        plan = _plans.find(ticket.group, ticket.key)
        if plan is not None:
            packed = pack(plan.agreed) if pack is not None and not g.nccl else None
            row = _row(g, head, plan.tag, fields)
            rows, _, _, _ = _exchanged(g, name, row, None, check, dtype.itemsize, None, packed)
            if (rows[:, _TAG] == plan.tag).all():
                _slots.STATS.strategy = plan.agreed.strategy
                agreed = replace(plan.agreed, ticket=replace(ticket, previous=plan))
                return agreed if packed is None else packed.agreed(agreed, _tails(g, rows))
            exchange_desc = True  # the ranks' plans differ: every rank exchanges afresh, below
    if local is None and sizes_differ and not _needs_profile(g, dtype, mode):
        may_compress = routed(g, name, dtype, None, red_code)[0] != switch.NATIVE  # any size
    elif local is None:  # no collective before the exchange (the profile is one): a guess
        may_compress = dtype in _exchange.CODEC_DTYPES and red_code != 99 and mode != "never"
    else:
        may_compress = local[0] == switch.COMPRESSED
    if not (exchange_desc or may_compress):
        assert local is not None  # planned: exchange_desc is False
        _slots.STATS.strategy = local[0]
        return _slots.Agreed(g, name, local[0], table, local[1])  # no exchange, nothing to keep
    summarized = sample if may_compress and not err else None
    row = _row(g, head, 0, fields)
    exchanged = (g, name, row, summarized, check, dtype.itemsize, payload)
    rows, count, data, alike = _planless(exchanged)
    agreed = nbytes if alike else int(rows[:, _exchange.NBYTES].max())
    if agreed != nbytes:  # the local plan was for another size
        nbytes, local = agreed, None
    strategy, chunks = local or routed(g, name, dtype, nbytes, red_code)
    if strategy == switch.COMPRESSED and nbytes <= SMALL_BYTES:  # rank order kept: W > 2 too
        rank_order = red_code >= 0 and not native_reduce_ok(g, dtype)
        strategy = switch.A2A_REDUCE if rank_order else switch.NATIVE
    _slots.STATS.strategy = strategy
    if strategy != switch.COMPRESSED:  # nothing to measure, so no plan to keep
        # the strategy did not depend on the exchange: decided locally for the size every rank
        # sent, or native whatever the sizes (an uneven call that no size could compress)
        settled = (local is not None and alike) or (sizes_differ and not may_compress)
        if signature is not None and settled and summarized is None:
            carries = payload is not None
            kept = Repeat(g, name, row, check, dtype.itemsize, carries, strategy, chunks)
            _remember(signature, kept)
        return _uncompressed(
            g, name, strategy, table, chunks, rows, data, nbytes if alike else None
        )
    sources = _slots.sources(dtype, _summaries(g, rows), table)
    ticket = replace(
        ticket or _ticket(g, head, fields, exchange_desc, buffer),
        digest=_plans.digest(count, rows.tobytes()),
    )
    return _slots.Agreed(g, name, strategy, table, chunks, sources, ticket=ticket)


@dataclass(frozen=True)
class Repeat:
    """The agreement of a call whose strategy did not depend on its exchange -- uncompressed
    (native or a2a_reduce), decided locally from values every rank shares, or native whatever
    the ranks' sizes (an uneven all-to-all: ``chunks`` then unused) -- kept for its
    signature's next calls (:func:`repeated`), which repeat it without building or routing
    it again. A repeat still exchanges its row with every rank (the agreement, and the input of
    a call small enough to ride in it); rows unlike its own go through the checks every call's
    go through, so a mismatch raises the same error on every rank."""

    g: _transport.Group
    name: str
    row: list[int]
    check: Callable[[np.ndarray], None] | None
    itemsize: int
    carries: bool  # the call's input rides in the exchange
    strategy: str
    chunks: int

    def stages(self) -> bool:
        """Whether this repeat stages its input itself (:class:`_transport.Prestaged`): native,
        on a staged group, too large to ride in the exchange."""
        return self.strategy == switch.NATIVE and self.g.staged and not self.carries

    def agree(self, t: torch.Tensor) -> _slots.Agreed:
        payload = t.view(-1).view(torch.uint8) if self.carries else None
        exchanged = (self.g, self.name, self.row, None, self.check, self.itemsize, payload)
        rows, _, data, alike = _planless(exchanged)
        _slots.STATS.strategy = self.strategy
        nbytes = self.row[_exchange.NBYTES] if alike else None  # every rank's, as this rank's
        return _uncompressed(
            self.g, self.name, self.strategy, None, self.chunks, rows, data, nbytes
        )


def _uncompressed(
    g: _transport.Group,
    name: str,
    strategy: str,
    table: Codebook | None,
    chunks: int,
    rows: np.ndarray,
    data: np.ndarray | None,
    alike_nbytes: int | None,
) -> _slots.Agreed:
    """An uncompressed call's agreement: every rank's input where it rode in the exchange."""
    carried = _carried(rows, data, alike_nbytes)
    return _slots.Agreed(g, name, strategy, table, chunks, carried=carried)


#  the kept agreements by signature (:func:`repeated`), bounded; decided under the profiles, so
#  a new profile drops them (switch.on_new_profile)
REPEATS: dict[tuple[object, ...], Repeat] = {}
switch.on_new_profile(REPEATS.clear)


def repeated(
    name: str,
    group: dist.ProcessGroup | None,
    verify: bool | None,
    table: Codebook | None,
    tensors: tuple[torch.Tensor, ...],
    *extra: object,
    stage: torch.Tensor | None = None,
    source: int | None = None,
) -> tuple[tuple[object, ...] | None, _slots.Agreed | None]:
    """A call's signature and, where an earlier call of it was kept (:class:`Repeat`), its
    agreement, whose exchange carries the first of ``tensors`` where the call carries its input.
    One call, so that an op cannot look up another key than the one it passes :func:`agree`.

    ``stage``: the op's input (the wire's view), where the op may run a native repeat on a staged
    group on host bytes itself (a call without ``async_op``): its copy down to pinned memory
    then starts before the exchange and overlaps its round; ``source`` (a broadcast's, a group
    rank): the only rank whose bytes travel, the others' get a host buffer only. The agreement's
    ``down`` holds it (:class:`_transport.Prestaged`).

    The signature is what the call's descriptor row and strategy depend on -- the op, the group,
    the tensors' dtypes, shapes, devices and layouts, ``extra`` (an op's own arguments: src, or
    the reduce op's number, which is all its row holds of it -- a PREMUL_SUM's factor is the
    backend's, whose call it is), the policy and the settings; None: a call not kept that way (a
    table given, whose hash the row carries). An agreement of None: the call takes the whole
    way, :func:`agree` given the signature."""
    if table is not None:
        return None, None
    key: list[object] = [
        name,
        _groups.key(group),
        verify,
        _transport.STAGE_HOST_TENSORS,
        settings.raw(),
    ]
    for t in tensors:
        key += (t.dtype, t.shape, t.device, t.is_contiguous())
    signature = (*key, *extra)
    try:
        kept = REPEATS.get(signature)
    except TypeError:  # an unhashable argument (src, verify): the whole way, which names it
        return signature, None
    if kept is None:
        return signature, None
    if stage is None or not kept.stages():
        return signature, kept.agree(tensors[0])
    down = _transport.Prestaged(stage, sends=source in (None, kept.g.rank))
    return signature, replace(kept.agree(tensors[0]), down=down)


def _remember(key: tuple[object, ...], kept: Repeat) -> None:
    if len(REPEATS) >= 1 << 12:
        REPEATS.clear()
    with contextlib.suppress(TypeError):  # unhashable: never a repeat
        REPEATS[key] = kept


def _ticket(
    g: _transport.Group, head: list[int], fields: Sequence[int], exchange_desc: bool, buffer: int
) -> _plans.Ticket:
    """A compressed call's key (zipccl._plans): its descriptor, device, policy, settings and
    buffer."""
    group = _groups.key(g.pg)
    key = (*head, *fields, g.device, exchange_desc, settings.raw(), buffer)
    return _plans.Ticket(group, key)


def _row(g: _transport.Group, head: list[int], tag: int, fields: Sequence[int]) -> list[int]:
    """A descriptor row: ``head``, the plan ``tag``, the op's ``fields``, zeros to the length
    every op's row has in this group (no op can mismatch another's)."""
    return [*head, tag, *fields, *[0] * (_extra_fields(g.world) - len(fields))]


def _planless(
    exchanged: tuple[
        _transport.Group,
        str,
        list[int],
        torch.Tensor | None,
        Callable[[np.ndarray], None] | None,
        int,
        torch.Tensor | None,
    ],
) -> tuple[np.ndarray, int, np.ndarray | None, bool]:
    """:func:`_exchanged` of a call sent without a plan's tag; where some ranks sent one (they
    repeat a plan the others lack), every rank exchanges afresh."""
    rows, count, data, alike = _exchanged(*exchanged)
    if not alike and rows[:, _TAG].any():
        rows, count, data, alike = _exchanged(*exchanged)
    return rows, count, data, alike


def _exchanged(
    g: _transport.Group,
    name: str,
    row: list[int],
    sample: torch.Tensor | None,
    check: Callable[[np.ndarray], None] | None,
    itemsize: int,
    payload: torch.Tensor | None,
    packed: _slots.Packed | None = None,
) -> tuple[np.ndarray, int, np.ndarray | None, bool]:
    """One descriptor exchange -- every rank's ``row`` (:func:`_row`) and sample summary
    (zeros without ``sample``; ``packed``: its summary and payload sizes), and on a host
    transport the room for ``payload`` -- and the checks of it that raise the same
    CollectiveMismatchError on every rank. Returns the rows, the exchange's number in its group
    (zipccl._plans.digest), on a host transport every rank's carried bytes, and whether every
    rank sent this rank's row."""
    count = _plans.exchanged(_groups.key(g.pg))
    carry = None if g.nccl else _exchange.Carry(payload)
    fill = packed.fill if packed is not None else _slots.summary_fill(sample)
    table, alike = _exchange.exchange(g, row, name, _exchange.TAIL_WORDS, fill, carry)
    width = len(row) + _exchange.TAIL_WORDS
    rows, data = table[:, :width], None if carry is None else table[:, width:].view(np.uint8)
    if not alike:  # else every check holds: it holds of this rank's own row (built from its call)
        if not (rows[:, 2:6] == rows[0, 2:6]).all():
            _name_the_difference(rows, name)
        if check is not None:
            check(rows[:, _FIELDS:])
        _check_sizes(rows, name, g.world, itemsize)
    return rows, count, data, alike


def _name_the_difference(rows: np.ndarray, name: str) -> None:
    """Raise the CollectiveMismatchError naming the first of the common columns (dtype, table,
    mode, reduce op) on which the ranks' rows differ."""
    _exchange.require_same(rows, 2, "the dtype", name, _exchange.dtype_name)
    _exchange.require_same(
        rows,
        3,
        "the table (hash; 0 = each rank's own theory table)",
        name,
        lambda h: f"{h % (1 << 64):#018x}",
    )
    _exchange.require_same(rows, 4, "ZIPCCL_MODE", name, lambda m: switch.MODES[m])
    _exchange.require_same(rows, 5, "the reduce op", name, _reduce_op_name)


def carried_payload(g: _transport.Group, t: torch.Tensor) -> torch.Tensor | None:
    """``t``'s bytes, to ride in the call's descriptor (:func:`agree`), where they may: a host
    transport, at most _exchange.inline_bytes, contiguous, a dtype the descriptor names (the
    exchange sends them where they fit its row's room: _exchange.room_bytes)."""
    if g.nccl or t.numel() * t.element_size() > _exchange.inline_bytes(g.world):
        return None
    if not t.is_contiguous() or t.dtype not in _exchange.DTYPE_CODES:
        return None
    return t.view(-1).view(torch.uint8)


def _carried(
    rows: np.ndarray, data: np.ndarray | None, nbytes: int | None
) -> _slots.Carried | None:
    """Every rank's input, where the exchange carried all of it: a named dtype, every rank's at
    most the row's room (``nbytes``: every rank's, where alike; ``data`` is as wide as the
    largest input any rank claimed, where the room holds it). A call that does not compress."""
    if data is None or rows[0, 2] == _exchange.UNNAMED_DTYPE:
        return None
    largest = int(rows[:, _exchange.NBYTES].max()) if nbytes is None else nbytes
    if largest > data.shape[1]:  # some rank's input did not fit the row's room
        return None
    return _slots.Carried(data, rows[:, _FIELDS:])


def _check_sizes(rows: np.ndarray, name: str, world: int, itemsize: int) -> None:
    """Every rank's byte count must be what its own fields say (an all-to-all: its input rows
    times the row size; otherwise the element count): the protocol sizes chunks and buffers by
    it, so a peer's wrong or corrupt claim is a CollectiveMismatchError on every rank before
    anything is allocated. Python integers: a huge claim cannot wrap around."""
    for rank, row in enumerate(rows.tolist()):
        fields = row[_FIELDS:]
        numel = sum(fields[:world]) * fields[2 * world] if name == "all_to_all" else fields[0]
        if numel < 0 or row[6] != numel * itemsize:
            raise CollectiveMismatchError(
                f"zipccl.{name}: rank {rank} reported {row[6]} bytes for {numel} values of "
                f"{itemsize} bytes"
            )


def keep(a: _slots.Agreed) -> None:
    """Keep ``a`` (with what the call measured) as its key's plan, once the call has completed
    its agreement on every rank; but where the call ran on a plan and a piece outgrew its room,
    the plan's tables no longer fit the data (gradients drift as training goes on): drop it, so
    that the key's next call agrees afresh, with tables from a fresh sample."""
    if a.ticket is None:
        return
    if a.ticket.previous is not None and any(h.overflowed for h in (a, *a.halves)):
        _plans.drop(a.ticket)
    else:
        _plans.keep(a.ticket, replace(a, ticket=None, packed=None, payloads=None))


def same_fields(name: str, *named: tuple[int, str]) -> Callable[[np.ndarray], None]:
    """A ``check`` for :func:`agree`: the op's fields at these columns agree across ranks."""

    columns = [column for column, _ in named]

    def check(fields: np.ndarray) -> None:
        if (fields[:, columns] == fields[0, columns]).all():
            return
        for column, what in named:
            _exchange.require_same(fields, column, what, name)

    return check


def _chunks(g: _transport.Group, nbytes: int) -> int:
    return max(1, -(-nbytes // switch.chunk_bytes(g.cuda)))


def _extra_fields(world: int) -> int:
    """Op-specific descriptor fields: all-to-all's two split vectors and row size at most."""
    return _exchange.descriptor_words(world) - _FIELDS


def _needs_profile(g: _transport.Group, dtype: torch.dtype, mode: str) -> bool:
    """Whether the local plan of a call could load the group's profile (a collective)."""
    loaded = switch.profile_key(g.pg, g.staged) in switch.PROFILES
    return mode == "auto" and dtype in _exchange.CODEC_DTYPES and not loaded


def reduce_op_number(op: object) -> int:
    """The descriptor's reduce op: torch's own number for it (ReduceOp.RedOpType; PREMUL_SUM and
    the bitwise ops too, so BAND against SUM is a mismatch), -2 for one torch does not number."""
    try:
        return int(getattr(op, "op", op))  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return -2


def _reduce_op_name(number: int) -> str:
    names = {v.value: k for k, v in ReduceOp.RedOpType.__members__.items()}
    return names.get(int(number), "none" if number == -1 else f"unnumbered ({number})")


def reduce_code(op: object) -> int:
    """0..4 for the ops zipccl reduces locally, 99 for the rest (PREMUL_SUM, bitwise): native."""
    try:
        return LOCAL_OPS.get(op, 99)  # type: ignore[call-overload]
    except TypeError:  # an unhashable custom ReduceOp
        return 99


def strategy_of(
    g: _transport.Group, name: str, dtype: torch.dtype, nbytes: int, red_code: int
) -> str:
    return strategy_and_chunks(g, name, dtype, nbytes, red_code)[0]


#  A tensor this small is never compressed, whatever the mode: a compressed piece's header alone
#  is as large. A call that would compress it still exchanges its descriptor (a mismatch still
#  raises on every rank), then moves it uncompressed.
SMALL_BYTES = HEADER_BYTES


def strategy_and_chunks(
    g: _transport.Group, name: str, dtype: torch.dtype, nbytes: int, red_code: int
) -> tuple[str, int]:
    """Strategy and chunk count, the same on every rank: they depend only on agreed values and
    the agreed profile. Auto mode on CUDA takes the model's chunk count (switch.best_chunks;
    on a host-staged group switch.host_chunks) unless ``ZIPCCL_CHUNK_BYTES`` is set; a
    host-staged group's all-reduce where the backend's reduction is exact goes by its size
    (switch.staged_all_reduce), and its broadcasts below switch.STAGED_BROADCAST_COMPRESS_FROM
    stay native."""
    chunks = _chunks(g, nbytes)
    if dtype not in _exchange.CODEC_DTYPES or red_code == 99:
        return switch.NATIVE, chunks  # nothing to compress, or an op only the backend implements
    if nbytes == 0:  # nothing to compress; but gloo cannot reduce fp8, not even an empty tensor
        gloo_fp8 = red_code >= 0 and dtype in _slots.BYTE_VIEW and not g.nccl
        return (switch.A2A_REDUCE if gloo_fp8 else switch.NATIVE), chunks
    mode = switch.mode()
    if mode != "auto":
        return (switch.COMPRESSED if mode == "always" else switch.NATIVE), chunks
    profile = _profile.profile_for(g)
    call = model_call(g, name, dtype, nbytes, profile)
    if g.cuda and g.staged and not switch.chunks_given():
        if name == "all_reduce" and call.native_ok:  # by its size, not the model
            strategy = switch.staged_all_reduce(nbytes)
            return strategy, (chunks if strategy == switch.NATIVE else switch.host_chunks(nbytes))
        if name == "broadcast" and nbytes < switch.STAGED_BROADCAST_COMPRESS_FROM:
            return switch.NATIVE, chunks
        # decided as the model sees it, run in the chunks gloo moves fastest
        return switch.choose(profile, call), switch.host_chunks(nbytes)
    return switch.choose(profile, call), call.chunks


def model_call(
    g: _transport.Group, name: str, dtype: torch.dtype, nbytes: int, profile: switch.Profile
) -> switch.Call:
    """The call as ``auto`` puts it to the cost model (:func:`strategy_and_chunks`): whether a
    reduction may go native, and on CUDA the model's own chunk count (switch.best_chunks)
    unless ``ZIPCCL_CHUNK_BYTES`` fixes it."""
    native_ok = native_reduce_ok(g, dtype) if name in ("reduce_scatter", "all_reduce") else None
    call = switch.Call(name, nbytes, dtype, g.world, _chunks(g, nbytes), native_ok)
    if g.cuda and not switch.chunks_given():
        call = replace(call, chunks=switch.best_chunks(profile, call))
    return call


def all_reduce_strategy(
    tensor: torch.Tensor, op: ReduceOpArg = ReduceOp.SUM, group: dist.ProcessGroup | None = None
) -> str:
    """What :func:`all_reduce` would do with this tensor (without verification).

    The switch's local decision from values every rank shares (op, dtype, size, world size,
    ``ZIPCCL_MODE``, ``ZIPCCL_CHUNK_BYTES``, ``ZIPCCL_NATIVE_REDUCE`` and the group's profile),
    cached per group and call shape. :func:`zipccl.ddp_hook` uses it to hand native buckets
    straight to torch. In ``auto`` mode the group's first decision measures (or loads) the
    switch's profile, a collective, so every rank must ask at the same point; a group's first
    zipccl call also agrees on the settings (one round trip).

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
    if entered(group):
        return switch.NATIVE
    nbytes = tensor.numel() * tensor.element_size()
    return _local_strategy(group, tensor, "all_reduce", nbytes, reduce_code(op))


def native_reduce_ok(g: _transport.Group, dtype: torch.dtype) -> bool:
    """Native reductions equal the fp32 rank-order one only for one or two ranks
    (ZIPCCL_NATIVE_REDUCE=1 takes them for any world size), and gloo lacks fp8."""
    return (g.world <= 2 or switch.native_reduce()) and not (
        dtype in _slots.BYTE_VIEW and not g.nccl
    )


def check_pair(
    g: _transport.Group, inp: torch.Tensor, out: torch.Tensor, out_numel: int, want: int
) -> int:
    """The local error code for an (input, output) pair (0 when fine)."""
    if out_numel != want:
        return 1
    if inp.dtype != out.dtype:
        return 2
    if not (inp.is_contiguous() and out.is_contiguous()):
        return 4
    if inp.device.type != g.device.type or out.device.type != g.device.type:
        return 5
    return 0
