"""The compressed protocols: all-gather, all-to-all and broadcast of slots, in chunks whose
encode, transfer and decode overlap, each ending with the ranks' agreement on the outcome and a
raw resend of any piece whose payload outgrew its room.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import torch
import torch.distributed as dist

from zipccl import switch
from zipccl.collectives import _exchange, _slots, _transport


def settle(
    outcome: _exchange.Outcome, unpack: _slots.Unpack, streams: _transport.Streams
) -> tuple[set[object], bool]:
    """A protocol's end, after its last data collective: :meth:`Unpack.settle`'s one host read
    and checks, then the ranks' agreement on the call's outcome, which raises on every rank if
    any rank failed. Returns the keys of this rank's overflowed pieces and whether any rank has
    some (an all-to-all's resend involves every rank)."""
    over: set[object] = set()
    with outcome.local():
        over = unpack.settle(streams)
    return over, outcome.agree(bool(over))


def protocol_call(g: _transport.Group, op: str, x: torch.Tensor) -> Callable[[], object]:
    """A compressed ``op`` ("all_gather", "all_to_all" or "broadcast" from group rank 0) of the
    flat ``x`` through the protocol alone -- the summary exchange, one chunk, each rank's theory
    table, no descriptor checks: what the switch's profile measures its model against
    (_profile.overhead)."""
    flat = _slots.flat(x)

    def agreed(sample: torch.Tensor | None) -> _slots.Agreed:
        sources = _slots.shared_sources(g, op, x.dtype, sample, None)
        return _slots.Agreed(g, op, switch.COMPRESSED, None, 1, sources)

    if op == "all_gather":
        out = torch.empty(g.world * flat.numel(), dtype=x.dtype, device=x.device)
        return lambda: gather_compressed(agreed(flat), flat, out)
    if op == "all_to_all":
        out = torch.empty_like(flat)
        return lambda: a2a_compressed(
            agreed(flat), list(flat.view(g.world, -1)), list(out.view(g.world, -1))
        )
    buf = flat.clone()
    return lambda: broadcast_compressed(agreed(buf if g.rank == 0 else None), buf, 0)


def gather_compressed(a: _slots.Agreed, inp: torch.Tensor, out: torch.Tensor) -> dict[object, int]:
    """One all-gather per chunk of every rank's piece in its agreed width (the largest rank's),
    decoded as it lands; after the last, one host read finds overflowed payloads, whose pieces
    their ranks then broadcast raw. Returns every split piece's payload size (every rank reads
    every header)."""
    g, n, dtype = a.g, inp.numel(), inp.dtype
    rows = out.view(g.world, n)
    streams = _transport.streams_for(g)
    unpack = _slots.Unpack(g, dtype)
    pieces = _slots.pieces(n, a.chunks)
    segs = [
        _slots.widened([a.seg((k, r), dtype, m, r) for r in range(g.world)])
        for k, (_, m) in enumerate(pieces)
    ]
    widths = [row[0].width for row in segs]
    stores = _slots.buffers(widths, g.device)
    received = _slots.buffers([g.world * w for w in widths], g.device)
    outcome = _exchange.Outcome(g, a.name)
    with _transport.ordered(g, streams):
        copied = False  # the rank's own row: copied once the first chunk is on the wire
        for k, (s, m) in enumerate(pieces):
            if not m:
                continue
            with streams.on(streams.compress):
                with outcome.local(_exchange.SENDING):
                    _slots.pack(inp[s : s + m], segs[k][g.rank], a.sources[g.rank].table, stores[k])
                work = dist.all_gather_into_tensor(
                    received[k], stores[k], group=g.pg, async_op=True
                )
            _slots.STATS.sent += widths[k]
            with streams.on(streams.decompress):
                if not copied:
                    copy_behind(streams, rows[g.rank], inp)
                    copied = True
                work.wait()
                got = received[k].view(g.world, widths[k])
                with outcome.local():
                    for r, (seg, src) in enumerate(zip(segs[k], a.sources, strict=True)):
                        if r == g.rank:  # every rank notes every header: same overflows
                            unpack.note((k, r), got[r], seg, src.table)
                        else:
                            unpack((k, r), got[r], seg, src.table, rows[r, s : s + m])
        over, _ = settle(outcome, unpack, streams)
        for r in range(g.world):
            ks = [k for k in range(a.chunks) if (k, r) in over]
            if ks:
                resend(
                    g, streams, r, [(rows[r], *pieces[k]) for k in ks], inp if r == g.rank else None
                )
    return unpack.sizes


def copy_behind(streams: _transport.Streams, dst: torch.Tensor, src: torch.Tensor) -> None:
    """``dst.copy_(src)`` on the decompress stream once the compress stream's queued encodes are
    done: beside an encode, a copy this size takes its memory bandwidth and holds back the wire;
    beside the collective it costs nothing."""
    if streams.decompress is not None:
        assert streams.compress is not None  # streams_for makes both or neither
        streams.decompress.wait_stream(streams.compress)
    dst.copy_(src)


def resend(
    g: _transport.Group,
    streams: _transport.Streams,
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
        dist.broadcast(_slots.as_wire(buf), _transport.global_rank(g, src), group=g.pg)
        _slots.STATS.sent += buf.numel() * buf.element_size() if own is not None else 0
        if own is None:
            for (row, s, m), piece in zip(parts, buf.split([m for *_, m in parts]), strict=True):
                row[s : s + m].copy_(piece)


def broadcast_compressed(a: _slots.Agreed, flat: torch.Tensor, group_src: int) -> dict[object, int]:
    """One broadcast per chunk of the source's piece in the width every rank computes from its
    summary (or the key's previous call), decoded as it lands; after the last, one host read
    finds overflowed payloads, whose pieces the source then broadcasts raw. Returns the split
    pieces' payload sizes."""
    g = a.g
    streams = _transport.streams_for(g)
    sender, source = g.rank == group_src, a.sources[group_src]
    unpack = _slots.Unpack(g, flat.dtype)
    pieces = _slots.pieces(flat.numel(), a.chunks)
    segs = [a.seg(k, flat.dtype, m, group_src) for k, (_, m) in enumerate(pieces)]
    buffers = _slots.buffers([seg.width for seg in segs], g.device)
    outcome = _exchange.Outcome(g, a.name)
    with _transport.ordered(g, streams):
        for k, (s, m) in enumerate(pieces):
            if not m:
                continue
            with streams.on(streams.compress):
                if sender:
                    with outcome.local(_exchange.SENDING):
                        _slots.pack(flat[s : s + m], segs[k], source.table, buffers[k])
                work = dist.broadcast(
                    buffers[k], _transport.global_rank(g, group_src), group=g.pg, async_op=True
                )
            _slots.STATS.sent += segs[k].width if sender else 0
            with streams.on(streams.decompress):
                work.wait()
                if sender:
                    unpack.note(k, buffers[k], segs[k], source.table)
                else:
                    with outcome.local():
                        unpack(k, buffers[k], segs[k], source.table, flat[s : s + m])
        over, _ = settle(outcome, unpack, streams)
        if over:
            resend(
                g,
                streams,
                group_src,
                [(flat, *pieces[k]) for k in sorted(cast("set[int]", over))],  # keys: k
                flat if sender else None,
            )
    return unpack.sizes


def a2a_compressed(
    a: _slots.Agreed, send: list[torch.Tensor], recv: list[torch.Tensor]
) -> dict[object, int]:
    """Compressed all-to-all of flat segments: per chunk, one :func:`swap` of every (src, dst)
    piece in the width both ends compute from the agreed splits and the sender's summary (or
    what the key's previous call measured of that piece: both ends read its header), decoded as
    it lands; after the last chunk, one host read finds overflowed payloads, whose pieces one
    all-to-all then moves raw. Returns the payload sizes of the split pieces this rank sent and
    received."""
    g, dtype = a.g, send[0].dtype
    streams = _transport.streams_for(g)
    unpack = _slots.Unpack(g, dtype)
    me, peers = a.sources[g.rank], range(g.world)
    sent_at = [
        _slots.pieces(seg.numel(), a.chunks) for seg in send
    ]  # [peer][chunk] = (start, numel)
    got_at = [_slots.pieces(seg.numel(), a.chunks) for seg in recv]
    outs, ins = [], []  # [chunk][peer]: the pieces this rank sends and receives
    for k in range(a.chunks):
        out = [
            a.seg(("out", k, j), dtype, sent_at[j][k][1] if j != g.rank else 0, g.rank)
            for j in peers
        ]
        into = [a.seg(("in", k, i), dtype, got_at[i][k][1] if i != g.rank else 0, i) for i in peers]
        if g.world == 2:  # one all-gather: both pieces as wide as the wider (swap)
            peer = 1 - g.rank
            out[peer], into[peer] = _slots.widened([out[peer], into[peer]])
        outs.append(out)
        ins.append(into)
    stores = _slots.buffers([sum(s.width for s in out) for out in outs], g.device)
    keep = []  # receive buffers live until the caller's stream is re-joined (see ordered)
    outcome = _exchange.Outcome(g, a.name)
    with _transport.ordered(g, streams):
        for k in range(a.chunks):
            mine = _slots.segments(stores[k], [s.width for s in outs[k]])
            with streams.on(streams.compress), outcome.local(_exchange.SENDING):
                for j in peers:
                    s, m = sent_at[j][k]
                    if m and j != g.rank:
                        _slots.pack(send[j][s : s + m], outs[k][j], me.table, mine[j])
                        unpack.note(("out", k, j), mine[j], outs[k][j], me.table)
            got, work = swap(g, streams, stores[k], mine, [s.width for s in ins[k]])
            keep.append(got)
            with streams.on(streams.decompress):
                if k == 0:  # the rank's piece to itself, once the first chunk is on the wire
                    copy_behind(streams, recv[g.rank], send[g.rank])
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
        over, anywhere = settle(outcome, unpack, streams)
        if anywhere:  # an all-to-all: every rank takes part, with or without pieces of its own
            resend_pairs(g, streams, over, send, sent_at, recv, got_at)
    return unpack.sizes


def resend_pairs(
    g: _transport.Group,
    streams: _transport.Streams,
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
            _slots.as_wire(got),
            _slots.as_wire(buf),
            [sum(m for _, m in at) for at in incoming],
            [sum(m for _, m in at) for at in outgoing],
            group=g.pg,
        )
        _slots.STATS.sent += buf.numel() * buf.element_size()
        pieces = got.split([m for at in incoming for _, m in at])
        targets = [recv[i][s : s + m] for i, at in enumerate(incoming) for s, m in at]
        for target, piece in zip(targets, pieces, strict=True):
            target.copy_(piece)


def swap(
    g: _transport.Group,
    streams: _transport.Streams,
    whole: torch.Tensor,
    out: list[torch.Tensor],
    in_sizes: list[int],
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
    _slots.STATS.sent += whole.numel()
    if g.world != 2:
        return _slots.segments(got, in_sizes), work
    peer = 1 - g.rank
    pieces = [got[:0], got[:0]]
    pieces[peer] = got[peer * whole.numel() : (peer + 1) * whole.numel()]
    return pieces, work
