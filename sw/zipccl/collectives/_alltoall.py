"""all_to_all_single (even or uneven splits), compressed where it pays."""

from __future__ import annotations

import math
import numbers

import numpy as np
import torch
import torch.distributed as dist

from zipccl import switch
from zipccl._errors import CollectiveMismatchError
from zipccl.collectives import _agree, _exchange, _protocols, _slots, _transport
from zipccl.golden.codebook import Codebook


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
    profile never compresses this dtype (``switch.can_compress``) and the policy does not verify
    it (``ZIPCCL_VERIFY=0``; ``auto`` on NCCL); otherwise it exchanges the descriptor -- which
    then also checks the splits -- whatever the policy, because every rank must use the same
    strategy and chunk count. So in auto mode every rank must pass its splits the same way (all
    None or all lists).

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

    Settings: ``ZIPCCL_MODE``, ``ZIPCCL_VERIFY``, ``ZIPCCL_CHUNK_BYTES``, ``ZIPCCL_PLAN_CALLS``
    (module docstring: Settings).

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
            (``ZIPCCL_VERIFY=0``); None (default): ``ZIPCCL_VERIFY`` (``auto``: every call on
            gloo; on NCCL the calls that take zipccl's own protocols).

    Returns:
        A Work if ``async_op``, else None: torch's own where the call went to torch.distributed,
        else a completed :class:`~zipccl.collectives.DoneWork` (its result in place, queued on the
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
    if _agree.direct(group, input, "all_to_all", nbytes, -1, verify):
        return _torch_call(output, input, output_split_sizes, input_split_sizes, group, async_op)
    splits = _split_signature(output_split_sizes, input_split_sizes)
    stage = None if async_op or not even else _slots.as_wire(input)  # its down path: even only
    key, agreed = (
        _agree.repeated("all_to_all", group, verify, table, (input, output), *splits, stage=stage)
        if splits is not None
        else (None, None)
    )
    if agreed is None:  # the whole way: the splits, computed once, fix the descriptor and pieces
        g = _transport.resolve(group, input)
        ins, outs, err = _splits(g, input, output, input_split_sizes, output_split_sizes)
        inner = _inner(input)
        agreed = _agree.agree(
            g,
            "all_to_all",
            input.dtype,
            input.numel() * input.element_size(),
            err,
            [*ins, *outs, inner],
            table,
            not even or _agree.verify_policy(verify) != "0",
            sample=input,
            check=lambda fields: _check_splits(fields, g.world),
            sizes_differ=not even,
            payload=_agree.carried_payload(g, input),
            signature=key,
        )
        if agreed.strategy == switch.COMPRESSED:  # never a repeat's, nor carried
            send = _slots.segments(_slots.flat(input), [s * inner for s in ins])
            recv = _slots.segments(_slots.flat(output), [s * inner for s in outs])
            _agree.keep(agreed.measured(_protocols.a2a_compressed(agreed, send, recv)))
            return _transport.done(async_op)
    if agreed.carried is not None:
        c, rank = agreed.carried, agreed.g.rank
        _from_carried(c, rank, _slots.flat(output), input.dtype, _inner(input))
        return _transport.done(async_op)
    if agreed.down is not None:  # a native repeat, staged here: its copy down ran meanwhile
        wire_out = _slots.as_wire(output)
        _transport.all_to_all(agreed.g, wire_out, _slots.as_wire(input), down=agreed.down).wait()
        return _transport.done(async_op)
    return _torch_call(output, input, output_split_sizes, input_split_sizes, group, async_op)


def _torch_call(
    output: torch.Tensor,
    input: torch.Tensor,
    output_split_sizes: list[int] | None,
    input_split_sizes: list[int] | None,
    group: dist.ProcessGroup | None,
    async_op: bool,
) -> dist.Work | None:
    """The call as torch makes it (on the wire's view of the tensors)."""
    return dist.all_to_all_single(
        _slots.as_wire(output),
        _slots.as_wire(input),
        output_split_sizes,
        input_split_sizes,
        group,
        async_op,
    )


def _from_carried(
    c: _slots.Carried, rank: int, out: torch.Tensor, dtype: torch.dtype, inner: int
) -> None:
    """``rank``'s output from every rank's input as the descriptor exchange carried it: from
    rank s, the rows s sends to ``rank`` (its input splits are its descriptor's first fields);
    an even call's in one copy."""
    world, at = len(c.data), 0
    if (c.fields[:, :world] == c.fields[0, 0]).all():  # even: piece ``rank`` of every input
        nbytes = int(c.fields[0, 0]) * inner * dtype.itemsize
        c.stack_into(out, rank * nbytes, nbytes)
        return
    for s in range(world):
        sends = c.fields[s, :world].tolist()
        n = sends[rank] * inner
        out[at : at + n].copy_(c.piece(s, dtype, sum(sends[:rank]) * inner, n))
        at += n


def _split_signature(
    outs: list[int] | None, ins: list[int] | None
) -> tuple[tuple[int, ...], ...] | None:
    """The split sizes as a part of the call's signature (_agree.repeated): none for an even
    call; None (no repeat: the whole way, which names what is wrong) where a size is not a plain
    int -- a float, or a tensor whose value may change in place under the same identity."""
    if not outs and not ins:
        return ()
    sizes = (tuple(outs or ()), tuple(ins or ()))
    return sizes if all(type(n) is int for part in sizes for n in part) else None


def _inner(t: torch.Tensor) -> int:
    """Elements per row (split sizes count rows of dimension 0)."""
    return math.prod(t.shape[1:]) if t.dim() else 1


def _splits(
    g: _transport.Group,
    inp: torch.Tensor,
    out: torch.Tensor,
    ins: list[int] | None,
    outs: list[int] | None,
) -> tuple[list[int], list[int], int]:
    """Row splits (even when None) and the local error code."""

    def rows(t: torch.Tensor, given: list[int] | None) -> tuple[list[int], bool]:
        total = t.shape[0] if t.dim() else 1
        if given is None or len(given) == 0:
            return [total // g.world] * g.world, total % g.world == 0
        if not all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in given):
            return [0] * g.world, False  # e.g. float sizes: reported, so every rank raises
        ok = len(given) == g.world and sum(given) == total and min(given) >= 0
        return (list(given) + [0] * g.world)[: g.world], ok

    (i_rows, i_ok), (o_rows, o_ok) = rows(inp, ins), rows(out, outs)
    err = _agree.check_pair(g, inp, out, 0, 0)
    if not (i_ok and o_ok):
        err = 3
    elif err == 0 and inp.dim() and out.dim() and _inner(inp) != _inner(out):
        err = 1
    return i_rows, o_rows, err


def _check_splits(desc: np.ndarray, world: int) -> None:
    """Rank i's input split j must equal rank j's output split i, and row sizes must match."""
    ins, outs = desc[:, :world], desc[:, world : 2 * world]
    _exchange.require_same(desc, 2 * world, "the row size (numel of input[0])", "all_to_all")
    bad = [(i, j) for i in range(world) for j in range(world) if ins[i, j] != outs[j, i]]
    if bad:
        i, j = bad[0]
        raise CollectiveMismatchError(
            f"zipccl.all_to_all: rank {i} sends {int(ins[i, j])} rows to rank {j}, which expects "
            f"{int(outs[j, i])} ({len(bad)} mismatched pairs)"
        )
