"""broadcast, compressed where it pays."""

from __future__ import annotations

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

    Settings: ``ZIPCCL_MODE``, ``ZIPCCL_VERIFY``, ``ZIPCCL_CHUNK_BYTES``, ``ZIPCCL_PLAN_CALLS``
    (module docstring: Settings).

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
            (``ZIPCCL_VERIFY=0``); None (default): ``ZIPCCL_VERIFY`` (``auto``: every call on
            gloo; on NCCL the calls that take zipccl's own protocols).

    Returns:
        A Work if ``async_op``, else None: torch's own where the call went to torch.distributed,
        else a completed :class:`~zipccl.collectives.DoneWork` (its result in place, queued on the
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
    if _agree.direct(group, tensor, "broadcast", nbytes, -1, verify):
        return dist.broadcast(_slots.as_wire(tensor), src, group, async_op)
    group_src = _group_rank(group, src)
    stage = None if async_op else _slots.as_wire(tensor)
    key, agreed = _agree.repeated(
        "broadcast", group, verify, table, (tensor,), src, stage=stage, source=group_src
    )
    if agreed is None:
        g = _transport.resolve(group, tensor)
        err = 6 if not 0 <= group_src < g.world else _agree.check_pair(g, tensor, tensor, 0, 0)
        agreed = _agree.agree(
            g,
            "broadcast",
            tensor.dtype,
            nbytes,
            err,
            [tensor.numel(), src],
            table,
            _agree.verify_policy(verify) != "0",
            sample=tensor if g.rank == group_src else None,
            check=_agree.same_fields("broadcast", (1, "src"), (0, "the tensor numel")),
            payload=_agree.carried_payload(g, tensor) if g.rank == group_src else None,
            signature=key,
        )
    if agreed.carried is not None:
        if agreed.g.rank != group_src:
            agreed.carried.copy_into(tensor, group_src, nbytes)
        return _transport.done(async_op)
    if agreed.down is not None:  # a native repeat, staged here: its copy down ran meanwhile
        _transport.broadcast(agreed.g, _slots.as_wire(tensor), group_src, agreed.down).wait()
        return _transport.done(async_op)
    if agreed.strategy != switch.COMPRESSED:
        return dist.broadcast(_slots.as_wire(tensor), src, group, async_op)
    _agree.keep(
        agreed.measured(_protocols.broadcast_compressed(agreed, _slots.flat(tensor), group_src))
    )
    return _transport.done(async_op)


def _group_rank(group: dist.ProcessGroup | None, src: int) -> int:
    """``src``'s rank in ``group``; -1 where it is not one of its ranks (reported in the
    descriptor, so that every rank raises, not only this one before the exchange)."""
    if group is None:
        return src
    try:
        return dist.get_group_rank(group, src)
    except (ValueError, RuntimeError):
        return -1
