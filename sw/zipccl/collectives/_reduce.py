"""reduce_scatter_tensor and all_reduce: rank-order fp32 reductions after a native or compressed
all-to-all (the backend's own reduction where the switch may take it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import torch
import torch.distributed as dist

from zipccl import switch
from zipccl.collectives import (
    _agree,
    _protocols,
    _slots,
    _transport,
)
from zipccl.golden.codebook import Codebook


def reference_reduce(
    parts: Sequence[torch.Tensor], op: _agree.ReduceOpArg = _agree.ReduceOp.SUM
) -> torch.Tensor:
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
    if op not in _agree.LOCAL_OPS:
        raise ValueError(f"zipccl reduces SUM, AVG, PRODUCT, MIN and MAX locally, not {op}")
    acc = parts[0].float().clone()
    for x in parts[1:]:
        x = x.float()
        if op in (_agree.ReduceOp.SUM, _agree.ReduceOp.AVG):
            acc += x
        elif op == _agree.ReduceOp.PRODUCT:
            acc *= x
        elif op == _agree.ReduceOp.MIN:
            torch.minimum(acc, x, out=acc)
        else:
            torch.maximum(acc, x, out=acc)
    if op == _agree.ReduceOp.AVG:
        acc /= len(parts)
    return acc.to(parts[0].dtype)


def reduce_scatter_tensor(
    output: torch.Tensor,
    input: torch.Tensor,
    op: _agree.ReduceOpArg = _agree.ReduceOp.SUM,
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

    Settings: ``ZIPCCL_MODE``, ``ZIPCCL_VERIFY``, ``ZIPCCL_CHUNK_BYTES``, ``ZIPCCL_PLAN_CALLS``,
    ``ZIPCCL_NATIVE_REDUCE`` (module docstring: Settings).

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
            (``ZIPCCL_VERIFY=0``); None (default): ``ZIPCCL_VERIFY`` (``auto``: every call on
            gloo; on NCCL the calls that take zipccl's own protocols).

    Returns:
        A Work if ``async_op``, else None: torch's own where the call went to torch.distributed,
        else a completed :class:`~zipccl.collectives.DoneWork` (its result in place, queued on the
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
    if _agree.direct(group, input, "reduce_scatter", nbytes, _agree.reduce_code(op), verify):
        return _transport.native_reduce_scatter(output, input, op, group, async_op)
    key, agreed = _agree.repeated(
        "reduce_scatter", group, verify, table, (input, output), _agree.reduce_op_number(op)
    )
    if agreed is None:
        g = _transport.resolve(group, input)
        err = _agree.check_pair(g, input, output, input.numel(), output.numel() * g.world)
        agreed = _agree.agree(
            g,
            "reduce_scatter",
            input.dtype,
            nbytes,
            err,
            [input.numel()],
            table,
            _agree.verify_policy(verify) != "0",
            red=op,
            sample=input,
            check=_agree.same_fields("reduce_scatter", (0, "the input numel")),
            payload=_agree.carried_payload(g, input),
            signature=key,
        )
    start = agreed.g.rank * output.numel()
    if _reduced_from_carried(agreed, _slots.flat(output), start, op):
        return _transport.done(async_op)
    if agreed.strategy == switch.NATIVE:
        return _transport.native_reduce_scatter(output, input, op, group, async_op)
    _agree.keep(_reduce_scatter(agreed, _slots.flat(input), _slots.flat(output), op))
    return _transport.done(async_op)


def _reduce_scatter(
    a: _slots.Agreed, inp: torch.Tensor, out: torch.Tensor, op: _agree.ReduceOpArg
) -> _slots.Agreed:
    """All-to-all of the W row blocks (compressed or not), then the rank-order fp32 reduction.
    Returns ``a`` with what a compressed all-to-all measured."""
    g = a.g
    if a.strategy != switch.COMPRESSED:
        _slots.STATS.sent += inp.numel() * inp.element_size() * (g.world - 1) // g.world
    if a.strategy == switch.NATIVE:
        _transport.native_reduce_scatter(out, inp, op, g.pg)
        return a
    staging = torch.empty_like(inp).view(g.world, -1)
    if a.strategy == switch.COMPRESSED:
        a = a.measured(_protocols.a2a_compressed(a, list(inp.view(g.world, -1)), list(staging)))
    else:
        _transport.all_to_all(g, _slots.as_wire(staging), _slots.as_wire(inp)).wait()
    _reduce_into(out, list(staging), op)
    return a


_ONE_ADD = (torch.bfloat16, torch.float16, torch.float32)


def _reduced_from_carried(
    a: _slots.Agreed, out: torch.Tensor, start: int, op: _agree.ReduceOpArg
) -> bool:
    """Reduce values ``start ..`` of every rank's input, as the call's descriptor exchange
    carried them, into ``out`` -- as the a2a_reduce strategy does, or for a native call as the
    backend would where every order gives its bits (:func:`_like_backend`) -- and say whether
    it could (else the call's own round follows)."""
    if a.carried is None or a.strategy == switch.COMPRESSED:
        return False
    parts = a.carried.pieces(out.dtype, start, out.numel())
    here = out if out.device.type == "cpu" else torch.empty_like(out, device="cpu")  # staged
    if a.strategy == switch.A2A_REDUCE:
        _reduce_into(here, parts, op)
    elif not _like_backend(here, parts, _agree.reduce_code(op)):
        return False
    if here is not out:
        out.copy_(here)
    return True


_Binary = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


_ANY_ORDER: dict[int, _Binary] = {0: torch.add, 2: torch.mul}  # SUM, PRODUCT (reduce_code)


_INTEGERS_ANY_ORDER: dict[int, _Binary] = {**_ANY_ORDER, 3: torch.minimum, 4: torch.maximum}


def _like_backend(out: torch.Tensor, parts: list[torch.Tensor], code: int) -> bool:
    """The backend's own reduction of ``parts`` into ``out`` where every order of it gives the
    same bits: integers (exact, wrapping) under SUM, PRODUCT, MIN and MAX; floating point under
    SUM or PRODUCT of at most two ranks (one rounded operation, commutative). False elsewhere
    (AVG, float MIN and MAX, whose NaN handling depends on the operands' order, and more ranks)."""
    dtype = out.dtype
    integral = not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool)
    fn = (_INTEGERS_ANY_ORDER if integral else _ANY_ORDER).get(code)
    if fn is None or not (integral or len(parts) <= 2):
        return False
    acc = parts[0]
    for part in parts[1:]:
        acc = fn(acc, part)
    out.copy_(acc)
    return True


def _reduce_into(out: torch.Tensor, parts: list[torch.Tensor], op: _agree.ReduceOpArg) -> None:
    """:func:`reference_reduce` into ``out``; the sum of two parts as one add, which computes
    in fp32 and rounds once -- the same bits in one pass instead of five."""
    if op == _agree.ReduceOp.SUM and len(parts) == 2 and out.dtype in _ONE_ADD:
        torch.add(parts[0], parts[1], out=out)
    else:
        out.copy_(reference_reduce(parts, op))


def all_reduce(
    tensor: torch.Tensor,
    op: _agree.ReduceOpArg = _agree.ReduceOp.SUM,
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

    Settings: ``ZIPCCL_MODE``, ``ZIPCCL_VERIFY``, ``ZIPCCL_CHUNK_BYTES``, ``ZIPCCL_PLAN_CALLS``,
    ``ZIPCCL_NATIVE_REDUCE`` (module docstring: Settings).

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
            (``ZIPCCL_VERIFY=0``); None (default): ``ZIPCCL_VERIFY`` (``auto``: every call on
            gloo; on NCCL the calls that take zipccl's own protocols).

    Returns:
        A Work if ``async_op``, else None: torch's own where the call went to torch.distributed,
        else a completed :class:`~zipccl.collectives.DoneWork` (its result in place, queued on the
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
    if _agree.direct(group, tensor, "all_reduce", nbytes, _agree.reduce_code(op), verify):
        return dist.all_reduce(tensor, op, group, async_op)
    key, agreed = _agree.repeated(
        "all_reduce",
        group,
        verify,
        table,
        (tensor,),
        _agree.reduce_op_number(op),
        stage=None if async_op else tensor,
    )
    if agreed is None:
        g = _transport.resolve(group, tensor)
        err = 4 if not tensor.is_contiguous() else 5 if tensor.device.type != g.device.type else 0
        agreed = _agree.agree(
            g,
            "all_reduce",
            tensor.dtype,
            nbytes,
            err,
            [tensor.numel()],
            table,
            _agree.verify_policy(verify) != "0",
            red=op,
            sample=tensor,
            check=_agree.same_fields("all_reduce", (0, "the tensor numel")),
            payload=_agree.carried_payload(g, tensor),
            buffer=tensor.data_ptr(),
            pack=_packs(g, tensor),
            signature=key,
        )
    if _reduced_from_carried(agreed, _slots.flat(tensor), 0, op):
        return _transport.done(async_op)
    if agreed.down is not None:  # a native repeat, staged here: its copy down ran meanwhile
        _transport.all_reduce(agreed.g, tensor, op, agreed.down).wait()
        return _transport.done(async_op)
    if agreed.strategy == switch.NATIVE:
        return dist.all_reduce(tensor, op, group, async_op)
    _all_reduce(agreed, tensor, op)
    return _transport.done(async_op)


def _packs(
    g: _transport.Group, tensor: torch.Tensor
) -> Callable[[_slots.Agreed], _slots.Packed | None] | None:
    """A planned all-reduce's ``pack`` where it is one all-gather of the whole tensor."""
    gather = _protocols.packs_gather(_slots.flat(tensor))
    return lambda a: gather(a) if switch.all_reduce_gathers(a.strategy, g.world) else None


def _all_reduce(a: _slots.Agreed, tensor: torch.Tensor, op: _agree.ReduceOpArg) -> None:
    g, flat = a.g, _slots.flat(tensor)
    if switch.all_reduce_gathers(a.strategy, g.world):
        _agree.keep(_reduce_gathered(a, flat, op))
        return
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
    _agree.keep(replace(a, halves=(rs, ag)))


def _reduce_gathered(a: _slots.Agreed, flat: torch.Tensor, op: _agree.ReduceOpArg) -> _slots.Agreed:
    """Two ranks' compressed all-reduce: one compressed all-gather of the whole tensor, then the
    rank-order reduction on both. The wire carries what reduce-scatter + all-gather would (each
    rank sends its compressed tensor once), in one protocol round and one closing agreement
    instead of two of each. Returns ``a`` with what the all-gather measured."""
    rows = torch.empty(2 * flat.numel(), dtype=flat.dtype, device=flat.device)
    a = a.measured(_protocols.gather_compressed(a, flat, rows))
    _reduce_into(flat, list(rows.view(2, -1)), op)
    return a


def _halves(
    a: _slots.Agreed, dtype: torch.dtype, numel: int, op: _agree.ReduceOpArg
) -> tuple[_slots.Agreed, _slots.Agreed]:
    """An all-reduce's reduce-scatter of its ``numel`` padded values and all-gather of the
    shards, a compressed one's each compressed only where that half pays; the all-gather's
    sources come once the shards exist (:func:`_gather_half`)."""
    g, nbytes = a.g, numel * dtype.itemsize
    rs, ag = switch.A2A_REDUCE, switch.NATIVE
    if a.strategy == switch.COMPRESSED:
        rs = _agree.strategy_of(g, "reduce_scatter", dtype, nbytes, _agree.LOCAL_OPS[op])
        ag = _agree.strategy_of(g, "all_gather", dtype, nbytes // g.world, -1)
    return (
        replace(a, strategy=rs, ticket=None),
        replace(a, strategy=ag, chunks=max(1, a.chunks // g.world), sources=(), ticket=None),
    )


def _gather_half(a: _slots.Agreed, part: torch.Tensor, out: torch.Tensor) -> _slots.Agreed:
    """An all-reduce's all-gather of the reduced shards; returns ``a`` with the sources and
    sizes a compressed one used (a first call exchanges the shards' summaries for them)."""
    if a.strategy != switch.COMPRESSED:
        _transport.all_gather(a.g, _slots.as_wire(out), _slots.as_wire(part)).wait()
        _slots.STATS.sent += part.numel() * part.element_size()
        return a
    if not a.sources:
        a = replace(a, sources=_slots.shared_sources(a.g, "all_reduce", part.dtype, part, a.table))
    return a.measured(_protocols.gather_compressed(a, part, out))
