"""The one agreement exchange of a call, and the closing agreement on its outcome.

A verified zipccl collective (see the package docstring for when: by default every call on gloo,
and on NCCL every call on zipccl's own protocols) starts with one exchange of a fixed-length
int64 *descriptor* row per rank (op, dtype, sizes, table hash, a local error code, ..., and for
a call that may compress the words of its sample summary, which the device appends; a planned
call sends its plan's tag instead and zeros there, or, packed, its summary and its pieces'
payload sizes: the package docstring, Plans): an all-gather on NCCL, and on a host transport an
all-to-all of the row's copies (gloo's fastest small round), whose row also has room for the
call's own input (:class:`Carry`): a call whose input fits (:func:`room_bytes`) completes from
the exchanged rows, in one round. The row's length depends only on the world size, the transport
and what the group's earlier exchanges carried -- the same on every rank -- so it can never
mismatch; after it every rank knows every other rank's call, checks the same things in the same
order and either proceeds with the same decision or raises the same
:class:`CollectiveMismatchError`. A rank whose own arguments are bad does not raise early (the
others would hang in the exchange): it reports an error code in its descriptor instead; so does
a rank whose sample summary raises, which then raises that exception while the others raise a
:class:`PeerError` naming it.

A compressed protocol ends the same way (:class:`Outcome`): a rank whose own step fails (encode,
decode, the checks of what it received) keeps the exception, still issues every collective of
the call -- their sizes were agreed before any data moved, so its peers never wait for it -- and
reports it in one small exchange after the last of them, before the call returns. Then every
rank raises: the one that failed its own exception, the others a PeerError naming it and what it
reported.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from zipccl import _groups, codec
from zipccl._errors import CollectiveMismatchError, PeerError
from zipccl.collectives import _transport
from zipccl.golden.formats import FORMATS

#  Local error codes a rank reports in its descriptor (0 = fine).
ERRORS = {
    1: "output tensor has the wrong number of elements for this collective",
    2: "input and output dtypes differ",
    3: "split sizes do not add up to the tensor's first dimension",
    4: "tensor is not contiguous",
    5: "tensors are on the wrong device for this process group's backend",
    6: "src is not a rank of the group",
    8: "table is neither a golden Codebook nor None",
    9: "an entry of the output list differs from the input in shape or dtype",
}
BAD_TABLE = 8
UNLIKE_LIST = 9


SUMMARY_FAILED = 7  # the error code of a rank whose exchange ``fill`` raised (not a mismatch)


OP_CODES = {
    "all_gather": 1,
    "all_to_all": 2,
    "reduce_scatter": 3,
    "all_reduce": 4,
    "broadcast": 5,
}


#  A descriptor's dtype code: the codec's formats carry golden's own format codes (the
#  compressed-buffer header's), the dtypes zipccl only moves natively codes of their own.
CODEC_DTYPES = frozenset(getattr(torch, f.name) for f in FORMATS.values())


DTYPE_CODES: dict[torch.dtype, int] = {getattr(torch, f.name): f.code for f in FORMATS.values()}


DTYPE_CODES |= {
    torch.float64: 16,
    torch.uint8: 17,
    torch.int8: 18,
    torch.int16: 19,
    torch.int32: 20,
    torch.int64: 21,
    torch.bool: 22,
}


assert len(set(DTYPE_CODES.values())) == len(DTYPE_CODES), "dtype codes must be distinct"


_CODE_NAMES = {c: str(d).removeprefix("torch.") for d, c in DTYPE_CODES.items()}


UNNAMED_DTYPE = 255  # the code of a dtype zipccl does not name (moved natively only)


#  A descriptor row's words: the common head (op, error, dtype, table hash, mode, reduce op,
#  nbytes) and the plan tag (collectives._agree fills them), then the op's own fields
HEAD_WORDS = 8


def descriptor_words(world: int) -> int:
    """A descriptor row's length in a group of ``world`` ranks, the same for every op (so no
    op can mismatch another's): the head, then room for an all-to-all's two split vectors and
    row size, the most any op sends."""
    return HEAD_WORDS + 2 * world + 1


#  Words after a descriptor's fields: a sample summary (codec.SUMMARY_WORDS), then the payload
#  sizes of a call whose pieces were encoded before its exchange (collectives._slots.Packed)
SIZE_WORDS = 16
TAIL_WORDS = codec.SUMMARY_WORDS + SIZE_WORDS


def dtype_code(dtype: torch.dtype) -> int:
    return DTYPE_CODES.get(dtype, UNNAMED_DTYPE)


def dtype_name(code: int) -> str:
    return _CODE_NAMES.get(int(code), f"unsupported dtype code {int(code)}")


def to_i64(value: int) -> int:
    """A uint64 (a table hash) as the int64 with the same bits, so it fits the descriptor."""
    return value - (1 << 64) if value >= 1 << 63 else value


def exchange(
    g: _transport.Group,
    fields: Sequence[int],
    op_name: str,
    extra_words: int = 0,
    fill: Callable[[torch.Tensor], object] | None = None,
    carry: Carry | None = None,
) -> tuple[np.ndarray, bool]:
    """Exchange one descriptor row per rank; raise on every rank if any rank reported an error.

    Returns an int64 array of shape (world, len(fields) + extra_words) (numpy: the checks that
    follow are a few small reads, cheaper there than as torch ops), and whether every rank sent
    this rank's row without an error -- then whatever the caller checks of the rows holds if it
    holds of this rank's. Field 0 must be the op code and field 1 the local error code.
    ``fill(words)``: writes ``extra_words`` int64 words into the row's tail on the group's device
    (computed there, never seen by this host): one copy, one sync for both; None: zeros. A
    ``fill`` that raises still sends the row, with SUMMARY_FAILED as its error code: then this
    rank raises what ``fill`` raised, every other rank a PeerError. ``carry``: the call's own
    input travels in the same round (:class:`Carry`; host transports) where it fits the row's
    room (:func:`room_bytes`), and the returned rows end with every rank's bytes of it: as many
    words as the largest input any rank's row claims (its column NBYTES), at most the room's --
    so every rank's input was carried where that many bytes are at least the largest claim.
    """
    table, failed = _gather(g, fields, extra_words, fill, carry)
    if failed is None and not fields[1] and alike(table[:, : len(fields) + extra_words]):
        return table, True  # one op, no error (the common case)
    ops = table[:, 0].tolist()
    if len(set(ops)) != 1:
        raise CollectiveMismatchError(
            f"zipccl.{op_name}: ranks called different collectives (op codes by rank: {ops})"
        )
    codes = table[:, 1].tolist()
    _raise_reported(
        op_name,
        failed,
        SENDING,
        {
            r: (SENDING, "its sample summary or its packed pieces raised")
            for r, code in enumerate(codes)
            if code == SUMMARY_FAILED
        },
    )
    bad = [(r, int(code)) for r, code in enumerate(codes) if code]
    if bad:
        what = "; ".join(f"rank {r}: {ERRORS.get(code, f'error {code}')}" for r, code in bad)
        raise CollectiveMismatchError(f"zipccl.{op_name}: {what}")
    return table, False


def alike(rows: np.ndarray) -> bool:
    """Whether every rank sent the same row: then whatever must agree does (one comparison
    of bytes per rank, cheaper than the checks that name a difference)."""
    first = rows[0].tobytes()
    return all(row.tobytes() == first for row in rows[1:])


def _gather(
    g: _transport.Group,
    fields: Sequence[int],
    extra_words: int = 0,
    fill: Callable[[torch.Tensor], object] | None = None,
    carry: Carry | None = None,
) -> tuple[np.ndarray, BaseException | None]:
    """Every rank's row (``fields``, then ``fill``'s words, then ``carry``'s) and what ``fill``
    raised here.

    The row and the gathered table live in buffers kept per thread, device and width (every
    call allocating and pinning its own cost more host time than the rest of the exchange).
    """
    head = len(fields)
    rooms = None if carry is None else _rooms(g)
    room = 0 if rooms is None else room_bytes(rooms)
    bufs = _rows(g, head + extra_words, room // 8)
    if bufs.uploaded is not None:
        bufs.uploaded.synchronize()  # the last call's upload of the host row is done (normally)
    failed = None
    if extra_words and fill is not None:
        try:
            fill(bufs.row[head : head + extra_words])
        except BaseException as exc:  # reported in the row: the peers wait in the exchange
            failed = exc
    elif extra_words and g.nccl:
        bufs.row[head : head + extra_words].zero_()
    elif extra_words:
        bufs.words[head : head + extra_words] = 0
    bufs.words[:head] = fields
    if failed is not None:
        bufs.words[1] = SUMMARY_FAILED
    if carry is not None:
        fits = carry.data is not None and carry.data.numel() <= room
        bufs.carry(carry.data if fits else None)
    if g.nccl:
        assert bufs.uploaded is not None  # made with an event on CUDA
        bufs.row[:head].copy_(bufs.host_row[:head], non_blocking=True)
        bufs.uploaded.record()
        _transport.native_all_gather(bufs.table, bufs.row, g.pg)
        bufs.host_table.copy_(bufs.table)  # into pinned memory: one copy, then the host waits
    else:
        if fill is not None and extra_words and g.staged:  # the words ``fill`` wrote, down
            bufs.host_row[head : head + extra_words].copy_(bufs.row[head:])
        _swap_rows(g, bufs)
    width = head + extra_words
    if rooms is None:  # no carry
        return bufs.gathered[:, :width].copy(), failed
    claimed = max(bufs.gathered[:, NBYTES].tolist())
    rooms.append(claimed if 0 < claimed <= inline_bytes(g.world) else 0)
    return bufs.gathered[:, : width - (-min(max(claimed, 0), room) // 8)].copy(), failed


NBYTES = 6  # the descriptor's column of the byte count of the rank's input


@functools.cache
def inline_bytes(world: int) -> int:
    """The most input per rank that a host-transport call may carry in its descriptor row, and
    so complete in that one round: 64 KiB between two ranks, halved as the world doubles (every
    row has the room, so the round moves about 128 KiB in all), never below 4 KiB."""
    room = 64 << 10
    while room * world > 128 << 10 and room > MIN_ROOM:
        room //= 2
    return room


MIN_ROOM = 4 << 10  # bytes of input every carrying row has room for
ROOM_WINDOW = 16  # a group's carrying exchanges whose claims size its next row's room


def room_bytes(rooms: collections.deque[int]) -> int:
    """The room for the input in the group's next carrying row: the least power of two, at
    least MIN_ROOM, that holds the largest input any rank claimed in the group's last
    ROOM_WINDOW carrying exchanges (``rooms``: :func:`_rooms`), where that input could ride (at
    most :func:`inline_bytes`); MIN_ROOM where none could. A row as small as the calls allow
    (the round's cost grows with it), and a function of what every rank exchanged alike, so the
    same on every rank: a call larger than its predecessors rides from its second time on."""
    largest = max(rooms, default=0)
    return max(MIN_ROOM, 1 << (largest - 1).bit_length()) if largest else MIN_ROOM


def _rooms(g: _transport.Group) -> collections.deque[int]:
    """The largest claim of each of the group's last ROOM_WINDOW carrying exchanges, 0 where
    it could not ride (more than :func:`inline_bytes`)."""
    key = _groups.key(g.pg)
    found = _ROOMS.get(key)
    if found is None:
        found = _ROOMS.setdefault(key, collections.deque(maxlen=ROOM_WINDOW))
    return found


#  by group token (_groups.key), held weakly: they go with the group
_ROOMS: weakref.WeakKeyDictionary[object, collections.deque[int]] = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class Carry:
    """A call's input riding in its descriptor row on a host transport: ``data``, this rank's
    bytes (sent where they fit the row's room, :func:`room_bytes`), or None where it sends none
    (too large, or not needed). Every rank's row has the same room, so the exchange's size never
    depends on a rank's own call."""

    data: torch.Tensor | None


def _swap_rows(g: _transport.Group, bufs: _Rows) -> None:
    """Every rank's host row into the table (rank order) over a host transport: an all-to-all
    of the row's copies, gloo's steadiest small round (its all-gather costs up to 2x, and its
    point-to-point sends stalled ~4 ms a call under CPU contention: BENCHMARKS.md section 4b)."""
    assert bufs.outbox is not None  # made with one on a host transport
    bufs.outbox_words[1:, : bufs.used] = bufs.outbox_words[0, : bufs.used]  # past it: zeros
    g.handle.alltoall_base(bufs.host_table, bufs.outbox, [], []).wait()  # torch's, unwrapped


#  Where a rank's step failed, as it reports it: a failure while preparing what it sends leaves
#  its pieces invalid, so it is the cause of any failure of its peers on what they received.
SENDING, RECEIVING = 1, 2


_PHASES = {SENDING: "preparing what it sends", RECEIVING: "on what it received"}


TEXT_WORDS = 16  # int64 words of "Type: message" that a failing rank reports


class Outcome:
    """This rank's part in a protocol call's closing agreement on whether it failed.

    The call's local steps run inside :meth:`local`, which keeps the first exception instead of
    raising it, so the rank still issues every collective its peers are waiting in; after the
    last one, :meth:`agree` exchanges every rank's report and raises on every rank if any
    failed. Cost: one exchange of W x (TEXT_WORDS + 2) int64 -- on CUDA one more host sync,
    after the call's read of its headers and decoder flag.
    """

    def __init__(self, g: _transport.Group, name: str) -> None:
        self.g, self.name = g, name
        self.error: BaseException | None = None
        self.phase = 0

    @contextlib.contextmanager
    def local(self, phase: int = RECEIVING) -> Iterator[None]:
        """Run a local step of the call; its exception (the call's first; a KeyboardInterrupt
        too: the peers are waiting in the call's collectives) waits for agree."""
        try:
            yield
        except BaseException as exc:
            if self.error is None:
                self.error, self.phase = exc, phase

    def agree(self, flag: bool = False) -> bool:
        """Raise on every rank if any rank failed; else whether any rank passed ``flag``."""
        text = _words(self.error) if self.error is not None else [0] * TEXT_WORDS
        table, _ = _gather(self.g, [self.phase, int(flag), *text])
        _raise_reported(
            self.name,
            self.error,
            self.phase,
            {r: (int(row[0]), _text(row[2:])) for r, row in enumerate(table) if row[0]},
        )
        return bool(table[:, 1].any())


def _words(exc: BaseException) -> list[int]:
    raw = f"{type(exc).__name__}: {exc}".encode()[: 8 * TEXT_WORDS].ljust(8 * TEXT_WORDS, b"\0")
    return np.frombuffer(raw, dtype=np.int64).tolist()


def _text(words: np.ndarray) -> str:
    return words.astype(np.int64).tobytes().rstrip(b"\0").decode(errors="replace")


def _raise_reported(
    op_name: str, own: BaseException | None, phase: int, reports: dict[int, tuple[int, str]]
) -> None:
    """Raise on every rank when any rank reported a failure.

    ``reports``: group rank -> (phase, what it reported), the same on every rank; ``own`` and
    ``phase``: this rank's. The ranks whose failure comes first (SENDING before RECEIVING: a
    peer's invalid piece may be why a receiver failed) raise their own exception, the whole
    report added as a note; every other rank a PeerError, from its own exception if it had one.
    """
    if not reports:
        return
    first = min(p for p, _ in reports.values())
    listed = sorted(reports.items(), key=lambda item: (item[1][0], item[0]))  # causes first
    message = f"zipccl.{op_name}: " + "; ".join(
        f"rank {r} failed {_PHASES.get(p, f'in an unknown phase {p}')}: {text}"
        for r, (p, text) in listed
    )
    if own is not None and phase == first:
        own.add_note(message)
        raise own
    raise PeerError(message, {r: text for r, (_, text) in reports.items()}) from own


@dataclass
class _Rows:
    """One thread's exchange buffers for a (device, row width, world size)."""

    host_row: torch.Tensor  # pinned for NCCL; the row itself on gloo with host tensors
    row: torch.Tensor  # where ``fill`` writes: the call's device
    table: torch.Tensor
    host_table: torch.Tensor
    uploaded: torch.cuda.Event | None  # after the host row's upload (CUDA)
    carried: int = 0  # int64 words of a call's input at the host row's end (host transports)
    dirty: int = 0  # bytes of that room an earlier call wrote
    outbox: torch.Tensor | None = None  # host transports: the row, once for every rank
    used: int = 0  # words of the row that may differ from zero (a host transport's copies)

    def __post_init__(self) -> None:
        """numpy and byte views, made once: each costs more than the small copies it serves."""
        self.words = self.host_row.numpy()
        self.gathered = self.host_table.numpy().reshape(len(self.host_table) // len(self.words), -1)
        self.room = self.host_row[len(self.words) - self.carried :].view(torch.uint8)
        self.room_array = self.room.numpy()
        if self.outbox is not None:
            self.outbox_words = self.outbox.numpy().reshape(self.gathered.shape)
        self.used = len(self.words) - self.carried

    def carry(self, data: torch.Tensor | None) -> None:
        """Put ``data`` (bytes) in the row's room; zero what an earlier call left after it:
        nothing of an earlier call's input goes to the peers. The words up to the end of either
        are the row's ``used`` ones (past them every copy of the row is zeros). Host bytes are
        copied in numpy: a torch copy of a few KiB costs several times more (and the round
        after it ran slower, measured on gloo)."""
        n = 0 if data is None else data.numel()
        if data is not None and n and data.device.type == "cpu":
            self.room_array[:n] = data.detach().numpy()
        elif data is not None and n:  # a staged group's device tensor: one copy down
            self.room[:n].copy_(data)
        if self.dirty > n:
            self.room_array[n : self.dirty] = 0
        self.used = len(self.words) - self.carried - (-max(n, self.dirty) // 8)
        self.dirty = n


def _rows(g: _transport.Group, width: int, carried: int = 0) -> _Rows:
    key = ("rows", g.device, g.staged, width, carried, g.world)
    return _transport.per_thread(key, lambda: _new_rows(g, width, carried))


def _new_rows(g: _transport.Group, width: int, carried: int) -> _Rows:
    """NCCL gathers device rows (uploaded from a pinned host row); gloo host rows, which for a
    staged group's device sample summary means one copy down. ``carried``: words of a call's
    input after the row (host transports only), which only the host row holds."""
    if not g.nccl:
        outbox = torch.zeros(g.world * (width + carried), dtype=torch.int64)
        host_row = outbox[: width + carried]  # copied into the others' places before each send
        row = torch.zeros(width, dtype=torch.int64, device=g.device) if g.staged else host_row
        table = torch.zeros_like(outbox)
        return _Rows(host_row, row, table, table, None, carried, outbox=outbox)
    if carried:
        raise ValueError("a call's input rides in its descriptor on host transports only")
    table = torch.empty(g.world * width, dtype=torch.int64, device=g.device)
    return _Rows(
        torch.zeros(width, dtype=torch.int64).pin_memory(),
        torch.zeros(width, dtype=torch.int64, device=g.device),
        table,
        torch.zeros_like(table, device="cpu").pin_memory(),
        torch.cuda.Event(),
    )


def require_same(table: np.ndarray, column: int, what: str, op_name: str, show=str) -> int:
    """The value every rank put in ``column``; a clear error naming each rank's value otherwise."""
    values = table[:, column].tolist()
    if len(set(values)) != 1:
        listed = ", ".join(f"rank {r}: {show(v)}" for r, v in enumerate(values))
        raise CollectiveMismatchError(f"zipccl.{op_name}: ranks disagree on {what} ({listed})")
    return int(values[0])
