"""Compressed collectives with torch.distributed's signatures and results.

The package's modules, each calling only those above it in this list:

* ``_stripes``: the more gloo groups of a staged group's ranks (below) that one call's bytes
  cross at once (``ZIPCCL_STRIPES``);
* ``_transport``: the process group as the protocols see it (:class:`Group`) and how a buffer
  crosses it -- NCCL on the device, gloo on host memory, or *staged*: CUDA tensors on a gloo
  group, moved through pinned host memory -- plus the side streams that pipeline a call;
* ``_exchange``: the one agreement exchange (a fixed-length descriptor row per rank) and the
  closing agreement on a call's outcome;
* ``_slots``: how a piece travels (golden's split layout in a slot both ends size alike), what
  every rank knows after the exchange (:class:`~zipccl.collectives._slots.Agreed`), packing and
  unpacking;
* ``_protocols``: the compressed all-gather, all-to-all and broadcast, chunked and pipelined;
* ``_profile``: the switch's measured profile of a group (native lines, codec, protocol
  overhead), agreed across ranks and cached;
* ``_agree``: what to send -- the local decision, the plan cache (zipccl._plans) and the
  descriptor exchange that fixes strategy and chunks on every rank;
* ``_gather``, ``_alltoall``, ``_reduce``, ``_broadcast``: the public ops.

The cost model (zipccl.switch), the plans (zipccl._plans), the settings and the codec sit below
the package and never import it.
Every op is a drop-in for its torch.distributed namesake (same arguments, same result tensor
contents) plus two keyword-only extras: ``table`` (a Codebook every rank must pass identically;
default: each rank's own theory table, carried inside its buffers) and ``verify``.

Settings, for every op (read at every call; a group's ranks agree on them before its first
zipccl call, else CollectiveMismatchError): ``ZIPCCL_MODE`` (``auto``, default: compress where the
switch's cost model, measured once per group and cached, predicts a gain; ``always``; ``never``:
plain torch.distributed, no verification), ``ZIPCCL_VERIFY`` (unless ``verify`` is given),
``ZIPCCL_CHUNK_BYTES`` (per-rank bytes per pipeline chunk; default: the model's chunk count in
``auto`` on CUDA -- 4 MiB chunks where CUDA tensors cross gloo --, else 32 MiB on CUDA and one
chunk on CPU), ``ZIPCCL_PLAN_CALLS`` (calls one plan serves, default 64; 0: no plans),
``ZIPCCL_NATIVE_REDUCE=1`` (reductions only: let ``auto`` take the backend's own reduction for
any world size, giving up rank-order determinism when it does), ``ZIPCCL_STRIPES`` (gloo groups
a staged call's bytes cross at once, default 4); the codec's ``ZIPCCL_BACKEND``
and ``ZIPCCL_FAST`` choose its kernels (same bytes, so not agreed).

The native fast path: each call first takes a *local* decision from values every rank shares in a
correct program -- op, dtype, the collective's size, reduce op, world size, ``ZIPCCL_MODE`` and
the rank-agreed switch profile -- cached per group and call shape, so it is a few dict lookups.
When that decision is native, zipccl calls the torch.distributed op with the caller's own tensors
and ``async_op`` and returns torch's own Work: no allocation, no copy; and where no verification
is asked for (by default: on NCCL), no descriptor and no sync.

Verification (``verify=`` overrides ``ZIPCCL_VERIFY``): the descriptor exchange -- one small
round and a host sync -- turns mismatched calls (dtype, sizes, splits, table, src, reduce op,
mode, different ops) into a CollectiveMismatchError on every rank. On a host transport a call
that does not compress and whose input fits the descriptor row's room (4 KiB, grown to the
largest input of the group's recent exchanges, at most 64 KiB per rank between two ranks:
``_exchange.room_bytes``) carries it in that round and completes from it: moves copy, and
reductions give what the call's strategy gives -- the rank-order reference of a2a_reduce, or the
backend's own bits where every order of its reduction gives them (integers; floating point SUM
and PRODUCT of two ranks; else torch's call follows the exchange).

* ``auto`` (default): verify every call on a host transport (gloo), native ones included -- a
  rank going native while another compresses, or two native calls of different sizes, would
  otherwise abort gloo or corrupt its output -- and on NCCL every call that takes zipccl's own
  protocols (compressed, a2a_reduce), handing native NCCL calls straight to torch (an exchange
  there is a host sync), whose behaviour on mismatched arguments is then exactly torch's.
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
* all-reduce: with two ranks, compressed, one all-gather of the whole tensors, reduced on both
  (the bytes reduce-scatter + all-gather would move, in one round); otherwise reduce-scatter +
  all-gather on a flat copy padded to a multiple of W (on a first call the all-gather half
  exchanges its shards' summaries first).

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
fingerprint -- and, for an all-reduce, its tensor's address (DDP all-reduces each bucket in its
own buffer, and equal-sized buckets hold gradients of other scales). A key's first call
runs as above; once its agreement has passed on every rank, each rank keeps the outcome as an
immutable plan: strategy, chunks, every rank's table, and every split piece's payload size from
the headers of the final read (an all-gather's and a broadcast's ranks read every header; both
ends of an all-to-all piece read its header), so both ends of every piece hold the same number
without another collective. The key's later calls

* exchange the same descriptor row in the same round, with the plan's tag where the
  summary goes: no sample summary is taken, no table built, no strategy or chunk count decided;
* encode with the plan's tables (each rank its first call's theory table), which the receivers
  hold before the data arrives, so the CUDA decoder still decodes every piece as it lands (a
  table per call from each rank's own data would need a summary and a table build before the
  wire, and a host read of every received header before its decode);
* size every piece by the largest payload the plan's calls measured of it, times MEASURED_MARGIN
  (a quarter more for exponent formats, whose escapes vary from call to call) plus SLACK (raw
  where it went raw); a payload that outgrew that room goes through the raw resend above -- the
  dynamic phase after the main collective -- and drops the plan: its tables no longer fit the
  data (gradients drift as training goes on), so the key's next call is agreed afresh, with
  tables from a fresh sample;
* an all-reduce's all-gather half skips its summary exchange;
* on a host transport, an all-gather (and two ranks' all-reduce) is *packed*
  (``_slots.Packed``): the rank takes its sample, builds its table and encodes every piece
  before the exchange, and its row carries the summary and every piece's payload size where a
  summary goes, so every rank decodes with tables from this call's data and sends every piece in
  exactly its width: nothing overflows, nothing goes again, whatever the data did since the
  plan's first call (gradient buckets coded with a plan's tables overflowed on every call). The
  host waits for the encode there anyway, before the wire.

Why an exchange stays before the wire: a rank whose call differs from its peers' would otherwise
issue a different first collective (another size or kind: gloo aborts, NCCL hangs or corrupts), and
no rank can learn a peer's call without a collective of a shape fixed in advance. The descriptor
row is that collective: one length for every op, with or without a plan, so a rank repeating a plan
and one on a first call issue the same round. The tag hashes the exchange that made the plan
(its rows and its number in the group) and the calls the plan served, so equal tags on every rank
mean one plan in one state. The descriptor checks raise CollectiveMismatchError on every rank where
the calls differ, planned or not; where they pass but the tags differ (a rank lost its plans) every
rank exchanges once more, with summaries, and they agree on a new plan. So a planned call keeps one
small exchange and its host sync before the wire and drops the work around it.
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
  reads -- keeps the exception and still issues each of the call's collectives (sending what its
  buffers hold: its peers may fail decoding that too). The call then ends with the ranks'
  agreement (:class:`~zipccl.collectives._exchange.Outcome`): one exchange of every rank's
  report -- whether it failed, where (preparing what it sends, or on what it received), "Type:
  message", and whether it has overflowed pieces, which tells every rank of an all-to-all that
  the raw resend follows. The rank that failed raises its own exception (ValueError for a
  corrupt piece), with the report as a note; every other rank a PeerError naming it and what it
  reported. A failure preparing what a rank sends is the cause, before its peers' failures on
  what they received. Every rank issued the same collectives, so the group carries the next
  call.
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

from zipccl._errors import CollectiveMismatchError, PeerError
from zipccl.collectives._agree import (
    VERIFY_POLICIES,
    ReduceOp,
    ReduceOpArg,
    all_reduce_strategy,
    verify_policy,
)
from zipccl.collectives._alltoall import all_to_all_single
from zipccl.collectives._broadcast import broadcast
from zipccl.collectives._gather import all_gather, all_gather_into_tensor
from zipccl.collectives._reduce import all_reduce, reduce_scatter_tensor, reference_reduce
from zipccl.collectives._slots import STATS, WireStats
from zipccl.collectives._transport import DoneWork, Forwarding

__all__ = [
    "STATS",
    "VERIFY_POLICIES",
    "CollectiveMismatchError",
    "DoneWork",
    "Forwarding",
    "PeerError",
    "ReduceOp",
    "ReduceOpArg",
    "WireStats",
    "all_gather",
    "all_gather_into_tensor",
    "all_reduce",
    "all_reduce_strategy",
    "all_to_all_single",
    "broadcast",
    "reduce_scatter_tensor",
    "reference_reduce",
    "verify_policy",
]
