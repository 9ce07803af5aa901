"""all_gather_into_tensor and all_gather, compressed where it pays."""

from __future__ import annotations

import torch
import torch.distributed as dist

from zipccl import switch
from zipccl.collectives import _agree, _exchange, _protocols, _slots, _transport
from zipccl.golden.codebook import Codebook


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

    Settings: ``ZIPCCL_MODE``, ``ZIPCCL_VERIFY``, ``ZIPCCL_CHUNK_BYTES``, ``ZIPCCL_PLAN_CALLS``
    (module docstring: Settings).

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
            (``ZIPCCL_VERIFY=0``); None (default): ``ZIPCCL_VERIFY`` (``auto``: every call on
            gloo; on NCCL the calls that take zipccl's own protocols).

    Returns:
        A Work if ``async_op``, else None: torch's own where the call went to torch.distributed,
        else a completed :class:`~zipccl.collectives.DoneWork` (its result in place, queued on the
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
    if _agree.direct(group, input_tensor, "all_gather", nbytes, -1, verify):
        return _transport.native_all_gather(
            _slots.as_wire(output_tensor), _slots.as_wire(input_tensor), group, async_op
        )
    key, agreed = _agree.repeated("all_gather", group, verify, table, (input_tensor, output_tensor))
    agreed = agreed or _agreed(output_tensor, input_tensor, group, table, verify, signature=key)
    if agreed.carried is not None:
        nbytes = input_tensor.numel() * input_tensor.element_size()
        agreed.carried.stack_into(output_tensor, 0, nbytes)
        return _transport.done(async_op)
    if agreed.strategy != switch.COMPRESSED:
        return _transport.native_all_gather(
            _slots.as_wire(output_tensor), _slots.as_wire(input_tensor), group, async_op
        )
    _gather(agreed, input_tensor, output_tensor)
    return _transport.done(async_op)


def _agreed(
    output: torch.Tensor,
    input: torch.Tensor,
    group: dist.ProcessGroup | None,
    table: Codebook | None,
    verify: bool | None,
    err: int = 0,
    signature: tuple[object, ...] | None = None,
) -> _slots.Agreed:
    """The agreed all-gather of ``input`` into ``output``; ``err``: a local error the caller
    found (reported in the descriptor, so that every rank raises); ``signature``: the call's
    (_agree.repeated)."""
    g = _transport.resolve(group, input)
    err = err or _agree.check_pair(g, input, output, output.numel(), input.numel() * g.world)
    return _agree.agree(
        g,
        "all_gather",
        input.dtype,
        input.numel() * input.element_size(),
        err,
        [input.numel()],
        table,
        _agree.verify_policy(verify) != "0",
        sample=input,
        check=_agree.same_fields("all_gather", (0, "the input numel")),
        payload=_agree.carried_payload(g, input),
        pack=_protocols.packs_gather(_slots.flat(input)) if input.is_contiguous() else None,
        signature=signature,
    )


def _gather(agreed: _slots.Agreed, input: torch.Tensor, output: torch.Tensor) -> None:
    _agree.keep(
        agreed.measured(
            _protocols.gather_compressed(agreed, _slots.flat(input), _slots.flat(output))
        )
    )


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
    pays) and copies the pieces out; where the switch keeps it native and it is not verified, it
    is torch.distributed.all_gather as is, and so is an uneven list on NCCL (which gathers
    those); on gloo an entry of another shape or dtype is a CollectiveMismatchError on every
    rank.

    Only ``bfloat16``, ``float16``, ``float32``, ``float8_e4m3fn`` and ``float8_e5m2`` tensors are
    ever compressed; other dtypes take torch's path (FP8 travels as bytes there, so gloo moves it
    too). A call the switch keeps native and that is not verified goes straight to torch.distributed
    with the caller's tensors and returns torch's own Work; a verified or compressed call first
    exchanges a small descriptor (one all-gather and a host sync), and a compressed one encodes the
    pieces with the codec (golden/container.py's bytes), moves them in one collective per chunk and
    decodes them as they land (module docstring: Protocols). A call repeating an earlier one (same
    op, group, dtype, sizes, table and settings) reuses that call's tables and strategy: a *plan*
    (module docstring: Plans).

    Settings: ``ZIPCCL_MODE``, ``ZIPCCL_VERIFY``, ``ZIPCCL_CHUNK_BYTES``, ``ZIPCCL_PLAN_CALLS``
    (module docstring: Settings).

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
            (``ZIPCCL_VERIFY=0``); None (default): ``ZIPCCL_VERIFY`` (``auto``: every call on
            gloo; on NCCL the calls that take zipccl's own protocols).

    Returns:
        A Work if ``async_op``, else None: torch's own where the call went to
        torch.distributed.all_gather, else a completed :class:`~zipccl.collectives.DoneWork` (the
        result in place, queued on the caller's stream; its ``wait()`` and CUDA-aware future order
        the waiting stream after it).

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
    alike = all(t.shape == tensor.shape and t.dtype == tensor.dtype for t in tensor_list)
    uneven = not alike and _agree.device_exchange(group, tensor)  # NCCL gathers uneven lists
    if uneven or _agree.direct(group, tensor, "all_gather", nbytes, -1, verify):
        return dist.all_gather(
            [_slots.as_wire(t) for t in tensor_list], _slots.as_wire(tensor), group, async_op
        )
    flat = torch.empty(len(tensor_list) * tensor.numel(), dtype=tensor.dtype, device=tensor.device)
    x = tensor.contiguous()
    agreed = _agreed(flat, x, group, table, verify, 0 if alike else _exchange.UNLIKE_LIST)
    if agreed.carried is not None:
        for r, t in enumerate(tensor_list):
            t.copy_(agreed.carried.piece(r, x.dtype, 0, x.numel()).view(t.shape))
        return _transport.done(async_op)
    if agreed.strategy != switch.COMPRESSED:
        return dist.all_gather(
            [_slots.as_wire(t) for t in tensor_list], _slots.as_wire(tensor), group, async_op
        )
    _gather(agreed, x, flat)
    for t, part in zip(tensor_list, flat.view(len(tensor_list), -1), strict=True):
        t.copy_(part.view(t.shape))
    return _transport.done(async_op)
