"""The compressed protocols: all-gather, all-to-all and broadcast of slots, in chunks whose
encode, transfer and decode overlap, each ending with the ranks' agreement on the outcome and a
raw resend of any piece whose payload outgrew its room.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from typing import TypeVar, cast

import torch

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


_T = TypeVar("_T")

#  Chunks a host transport (gloo) keeps in flight ahead of the one being received: its wire
#  runs while the host queues the next chunk's encode and waits for its copy down
HOST_AHEAD = 2


def pipelined(
    g: _transport.Group,
    chunks: Iterable[int],
    send: Callable[[int], _T],
    receive: Callable[[int, _T], None],
) -> None:
    """``send(k)`` then ``receive(k, sent)`` for every chunk k, in order. NCCL queues both
    without blocking the host, so each chunk's receive follows its send; a host transport
    blocks the host in both (the staged copy down before the wire, the wire itself), so the
    next HOST_AHEAD chunks are sent before a chunk is received: their encode and copies
    overlap its wire, and its decode the next chunk's."""
    ahead = 0 if g.nccl else HOST_AHEAD
    queue: deque[tuple[int, _T]] = deque()
    for k in chunks:
        queue.append((k, send(k)))
        if len(queue) > ahead:
            receive(*queue.popleft())
    while queue:
        receive(*queue.popleft())


def protocol_call(
    g: _transport.Group, op: str, x: torch.Tensor, chunks: int = 1
) -> Callable[[], object]:
    """A compressed ``op`` ("all_gather", "all_to_all" or "broadcast" from group rank 0) of the
    flat ``x`` in ``chunks`` through the protocol alone -- the summary exchange, each rank's
    theory table, no descriptor checks: what the switch's profile measures its model against
    (_profile.overhead)."""
    flat = _slots.flat(x)

    def agreed(sample: torch.Tensor | None) -> _slots.Agreed:
        sources = _slots.shared_sources(g, op, x.dtype, sample, None)
        return _slots.Agreed(g, op, switch.COMPRESSED, None, chunks, sources)

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


def packs_gather(x: torch.Tensor) -> Callable[[_slots.Agreed], _slots.Packed | None]:
    """The ``pack`` of a planned call (collectives._agree.agree) that all-gathers the flat
    ``x`` compressed: its pieces encoded before the exchange, where the row has room for
    their sizes."""

    def pack(a: _slots.Agreed) -> _slots.Packed | None:
        fits = a.strategy == switch.COMPRESSED and a.chunks <= _exchange.SIZE_WORDS
        return _slots.Packed(a, x) if fits else None

    return pack


def gather_compressed(a: _slots.Agreed, inp: torch.Tensor, out: torch.Tensor) -> _slots.Measured:
    """One all-gather per chunk of every rank's piece in its agreed width (the largest rank's),
    decoded as it lands; after the last, one host read finds overflowed payloads, whose pieces
    their ranks then broadcast raw. Returns every split piece's payload size (every rank reads
    every header) and whether any overflowed. A packed call's pieces (``a.packed``) are
    encoded already, in exactly their agreed widths."""
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
    stores = a.packed.stores if a.packed is not None else _slots.buffers(widths, g.device)
    received = _slots.buffers([g.world * w for w in widths], g.device)
    outcome = _exchange.Outcome(g, a.name)
    copied = False  # the rank's own row: copied once the first chunk is on the wire

    def send_chunk(k: int) -> _transport.Pending:
        s, m = pieces[k]
        mine, store = segs[k][g.rank], stores[k][: widths[k]]
        with streams.on(streams.compress):
            if a.packed is None or mine.raw:  # packed: its split layout was no smaller
                with outcome.local(_exchange.SENDING):
                    _slots.pack(inp[s : s + m], mine, a.sources[g.rank].table, store)
            sent = _transport.all_gather(g, received[k], store, chunk=k)
        _slots.STATS.sent += widths[k]
        return sent

    def receive_chunk(k: int, sent: _transport.Pending) -> None:
        nonlocal copied
        s, m = pieces[k]
        with streams.on(streams.decompress):
            if not copied:
                copy_behind(streams, rows[g.rank], inp)
                copied = True
            sent.wait()
            got = received[k].view(g.world, widths[k])
            with outcome.local():
                for r, (seg, src) in enumerate(zip(segs[k], a.sources, strict=True)):
                    if r == g.rank:  # every rank notes every header: same overflows
                        unpack.note((k, r), got[r], seg, src.table)
                    else:
                        unpack((k, r), got[r], seg, src.table, rows[r, s : s + m])

    with _transport.ordered(g, streams):
        pipelined(g, [k for k, (_, m) in enumerate(pieces) if m], send_chunk, receive_chunk)
        over, anywhere = settle(outcome, unpack, streams)
        for r in range(g.world):
            ks = [k for k in range(a.chunks) if (k, r) in over]
            if ks:
                resend(
                    g, streams, r, [(rows[r], *pieces[k]) for k in ks], inp if r == g.rank else None
                )
    return _slots.Measured(unpack.sizes, anywhere)


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
        _transport.broadcast(g, _slots.as_wire(buf), src).wait()
        _slots.STATS.sent += buf.numel() * buf.element_size() if own is not None else 0
        if own is None:
            for (row, s, m), piece in zip(parts, buf.split([m for *_, m in parts]), strict=True):
                row[s : s + m].copy_(piece)


def broadcast_compressed(a: _slots.Agreed, flat: torch.Tensor, group_src: int) -> _slots.Measured:
    """One broadcast per chunk of the source's piece in the width every rank computes from its
    summary (or the key's previous call), decoded as it lands; after the last, one host read
    finds overflowed payloads, whose pieces the source then broadcasts raw. Returns the split
    pieces' payload sizes and whether any overflowed."""
    g = a.g
    streams = _transport.streams_for(g)
    sender, source = g.rank == group_src, a.sources[group_src]
    unpack = _slots.Unpack(g, flat.dtype)
    pieces = _slots.pieces(flat.numel(), a.chunks)
    segs = [a.seg(k, flat.dtype, m, group_src) for k, (_, m) in enumerate(pieces)]
    buffers = _slots.buffers([seg.width for seg in segs], g.device)
    outcome = _exchange.Outcome(g, a.name)

    def send_chunk(k: int) -> _transport.Pending:
        s, m = pieces[k]
        with streams.on(streams.compress):
            if sender:
                with outcome.local(_exchange.SENDING):
                    _slots.pack(flat[s : s + m], segs[k], source.table, buffers[k])
            sent = _transport.broadcast(g, buffers[k], group_src, chunk=k)
        _slots.STATS.sent += segs[k].width if sender else 0
        return sent

    def receive_chunk(k: int, sent: _transport.Pending) -> None:
        s, m = pieces[k]
        with streams.on(streams.decompress):
            sent.wait()
            if sender:
                unpack.note(k, buffers[k], segs[k], source.table)
            else:
                with outcome.local():
                    unpack(k, buffers[k], segs[k], source.table, flat[s : s + m])

    with _transport.ordered(g, streams):
        pipelined(g, [k for k, (_, m) in enumerate(pieces) if m], send_chunk, receive_chunk)
        over, anywhere = settle(outcome, unpack, streams)
        if over:
            resend(
                g,
                streams,
                group_src,
                [(flat, *pieces[k]) for k in sorted(cast("set[int]", over))],  # keys: k
                flat if sender else None,
            )
    return _slots.Measured(unpack.sizes, anywhere)


def a2a_compressed(
    a: _slots.Agreed, send: list[torch.Tensor], recv: list[torch.Tensor]
) -> _slots.Measured:
    """Compressed all-to-all of flat segments: per chunk, one :func:`swap` of every (src, dst)
    piece in the width both ends compute from the agreed splits and the sender's summary (or
    what the plan's calls measured of that piece: both ends read its header), decoded as
    it lands; after the last chunk, one host read finds overflowed payloads, whose pieces one
    all-to-all then moves raw. Returns the payload sizes of the split pieces this rank sent and
    received, and whether any piece overflowed on any rank."""
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

    def send_chunk(k: int) -> tuple[list[torch.Tensor], _transport.Pending | None]:
        mine = _slots.segments(stores[k], [s.width for s in outs[k]])
        with streams.on(streams.compress), outcome.local(_exchange.SENDING):
            for j in peers:
                s, m = sent_at[j][k]
                if m and j != g.rank:
                    _slots.pack(send[j][s : s + m], outs[k][j], me.table, mine[j])
                    unpack.note(("out", k, j), mine[j], outs[k][j], me.table)
        got, sent = swap(g, streams, stores[k], mine, [s.width for s in ins[k]], k)
        keep.append(got)
        return got, sent

    def receive_chunk(
        k: int, swapped: tuple[list[torch.Tensor], _transport.Pending | None]
    ) -> None:
        got, sent = swapped
        with streams.on(streams.decompress):
            if k == 0:  # the rank's piece to itself, once the first chunk is on the wire
                copy_behind(streams, recv[g.rank], send[g.rank])
            if sent is not None:
                sent.wait()
            with outcome.local():
                for i in peers:
                    s, m = got_at[i][k]
                    if m and i != g.rank:
                        unpack(
                            ("in", k, i), got[i], ins[k][i], a.sources[i].table, recv[i][s : s + m]
                        )

    with _transport.ordered(g, streams):
        pipelined(g, range(a.chunks), send_chunk, receive_chunk)
        over, anywhere = settle(outcome, unpack, streams)
        if anywhere:  # an all-to-all: every rank takes part, with or without pieces of its own
            resend_pairs(g, streams, over, send, sent_at, recv, got_at)
    return _slots.Measured(unpack.sizes, anywhere)


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
        _transport.all_to_all(
            g,
            _slots.as_wire(got),
            _slots.as_wire(buf),
            [sum(m for _, m in at) for at in incoming],
            [sum(m for _, m in at) for at in outgoing],
        ).wait()
        _slots.STATS.sent += buf.numel() * buf.element_size()
        pieces = got.split([m for at in incoming for _, m in at])
        targets = [recv[i][s : s + m] for i, at in enumerate(incoming) for s, m in at]
        for target, piece in zip(targets, pieces, strict=True):
            target.copy_(piece)


def swaps_by_gather(g: _transport.Group) -> bool:
    """Whether :func:`swap` moves an all-to-all as one all-gather (two ranks on NCCL)."""
    return g.world == 2 and g.nccl


def swap(
    g: _transport.Group,
    streams: _transport.Streams,
    whole: torch.Tensor,
    out: list[torch.Tensor],
    in_sizes: list[int],
    chunk: int = 0,
) -> tuple[list[torch.Tensor], _transport.Pending | None]:
    """Send ``out[j]`` (views of the one buffer ``whole``, in rank order) to every rank j and
    receive ``in_sizes[i]`` bytes from every rank i, issued from the compress stream (``chunk``:
    the protocol's chunk number, whose stripe carries it on a staged group); returns the
    received pieces and the transfer (None where two ranks have nothing to swap).

    Two ranks on NCCL: one all-gather of the outgoing piece, which the caller made as wide as
    the incoming one; NCCL's all-gather outruns its all-to-all of the same bytes over sockets by
    ~1.4x. Otherwise all_to_all_single (gloo's all-to-all outruns its all-gather). Called on the
    caller's stream, where receive buffers are allocated (see :func:`ordered`).
    """
    if g.world == 2 and not whole.numel():  # nothing either way: both ranks skip
        return [whole, whole], None
    by_gather = swaps_by_gather(g)
    got = torch.empty(
        2 * whole.numel() if by_gather else sum(in_sizes), dtype=torch.uint8, device=g.device
    )
    with streams.on(streams.compress):
        if by_gather:
            sent = _transport.all_gather(g, got, whole, chunk)
        else:
            outs = [t.numel() for t in out]
            sent = _transport.all_to_all(g, got, whole, in_sizes, outs, chunk=chunk)
    _slots.STATS.sent += whole.numel()
    if not by_gather:
        return _slots.segments(got, in_sizes), sent
    peer = 1 - g.rank
    pieces = [got[:0], got[:0]]
    pieces[peer] = got[peer * whole.numel() : (peer + 1) * whole.numel()]
    return pieces, sent
