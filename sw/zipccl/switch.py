"""The adaptive switch: when does compressing a collective pay?

On first use per process group (the group object; None means the current default group, so a
re-created one is profiled afresh) the switch profiles the native collectives (latency alpha and
bandwidth beta per op, least squares over three sizes; every (op, size) timed in interleaved
rounds, fastest of 11, so a burst of load on a shared machine cannot skew one op), the codec
(compress / decompress alpha and beta on BF16 N(0,1), and the ratio it reaches per dtype) and
the fp32 local reduction. The ranks take the element-wise maximum of their measurements, so
every rank holds the *same* profile and therefore makes the same choice for the same agreed (op,
size, dtype) -- a divergent choice would deadlock. Rank 0 caches the profile as JSON
(``$ZIPCCL_CACHE_DIR``, default ``~/.cache/zipccl``), keyed by backend, world size, device, torch
version and the NCCL transport variables, and broadcasts it on later runs.

Cost model for a message of ``n`` bytes per rank (``W`` ranks, ``r`` the dtype's ratio)::

    native      a_op + n / b_op
    compressed  the descriptor exchange and the tables once, then three stages -- compress,
                wire (per chunk, the transfer the protocol makes: its own line, measured on
                the group, a_w + r n / b_w), decompress -- pipelined
                over ``C`` chunks: max(stage) + (sum - max) / C + (C - 1) * per-chunk latency,
                plus the profile's measured overhead of a compressed call

``ZIPCCL_MODE=never`` is plain torch.distributed; ``always`` compresses every float collective;
``auto`` (default) compresses only where the model predicts a win of at least ``MARGIN``, so a
mispredicted small call costs at most noise; likewise it takes zipccl's uncompressed a2a_reduce
over a native reduction only for a win of ``MARGIN``.

Native reductions are offered only where they give the rank-order fp32 result bit for bit (two
ranks) unless ``ZIPCCL_NATIVE_REDUCE=1``, which offers the backend's own reduce-scatter /
all-reduce for every world size and gives up rank-order determinism for W > 2.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist

from zipccl import _groups, _plans, settings
from zipccl.settings import MODES

MARGIN = 0.9  # compress only when predicted at <= 90 % of the native time
OPS = ("all_gather", "all_to_all", "reduce_scatter", "all_reduce", "broadcast")
WIRE_OPS = ("all_gather", "all_to_all", "broadcast")  # the transfers zipccl's protocols make
NATIVE, A2A_REDUCE, COMPRESSED = "native", "a2a_reduce", "compressed"
PRIOR_DTYPES = (
    torch.bfloat16,
    torch.float16,
    torch.float32,
    torch.float8_e4m3fn,
    torch.float8_e5m2,
)


def mode() -> str:
    """``ZIPCCL_MODE``: auto (default), always or never."""
    return settings.value("ZIPCCL_MODE")


def native_reduce() -> bool:
    """``ZIPCCL_NATIVE_REDUCE`` (default 0): 1 lets auto take the backend's reductions for any W."""
    return settings.value("ZIPCCL_NATIVE_REDUCE")


def chunk_bytes(cuda: bool) -> int:
    """Per-rank input bytes per pipeline chunk (``ZIPCCL_CHUNK_BYTES``; CPU: no chunking).

    In ``auto`` mode on CUDA without the variable the cost model picks the chunk count instead
    (:func:`best_chunks`; on a host-staged group :func:`host_chunks`); this size is then only
    the ``always`` mode's.
    """
    given = settings.value("ZIPCCL_CHUNK_BYTES")
    return given if given is not None else 32 << 20 if cuda else 1 << 62


@dataclass(frozen=True)
class Line:
    """t(n) = alpha + n / beta, seconds and bytes."""

    alpha: float
    beta: float

    def __call__(self, nbytes: float) -> float:
        return self.alpha + nbytes / self.beta

    @classmethod
    def fit(cls, sizes: list[float], times: list[float]) -> Line:
        """Least squares with alpha >= 0 and a positive bandwidth, from >= 2 points."""
        mx, mt = statistics.fmean(sizes), statistics.fmean(times)
        sxx = sum((x - mx) ** 2 for x in sizes)
        slope = sum((x - mx) * (t - mt) for x, t in zip(sizes, times, strict=True)) / sxx
        slope = max(slope, 1e-15)
        alpha = max(mt - slope * mx, 0.0)
        return cls(alpha, 1.0 / slope)


@dataclass(frozen=True)
class Profile:
    native: dict[str, Line]
    compress: Line  # one chunk, table given
    decompress: Line
    reduce: Line  # fp32 local reduction, per input byte
    table: Line  # the theory table, once per call (alpha only)
    ratio: dict[str, float]  # dtype name -> compressed / raw bytes
    exchange: Line = Line(0.0, 1e18)  # the descriptor exchange, once per call (alpha only)
    overhead: Line = Line(0.0, 1e18)  # what the lines miss of a compressed call (alpha only)
    # The transfers the compressed protocols themselves make, per WIRE_OPS entry, for n input
    # bytes per rank -- not the native op: on gloo an all-gather travels as an all-to-all and a
    # staged group's bytes through pinned memory, several times faster than gloo's own handling
    # of the same op. None (a synthetic profile): the native ops' lines.
    wire: dict[str, Line] | None = None

    def __post_init__(self) -> None:
        if self.wire is None:
            object.__setattr__(self, "wire", {op: self.native[op] for op in WIRE_OPS})

    @property
    def wires(self) -> dict[str, Line]:
        assert self.wire is not None  # (set by __post_init__)
        return self.wire

    def vector(self) -> list[float]:
        out: list[float] = []
        for line in [
            *(self.native[o] for o in OPS),
            *(self.wires[o] for o in WIRE_OPS),
            self.compress,
            self.decompress,
            self.reduce,
            self.table,
            self.exchange,
            self.overhead,
        ]:
            out += [line.alpha, line.beta]
        return out + [self.ratio[dtype_name(d)] for d in PRIOR_DTYPES]

    @classmethod
    def from_vector(cls, v: list[float]) -> Profile:
        lines = [Line(v[i], v[i + 1]) for i in range(0, 2 * LINES, 2)]
        ratios = v[2 * LINES :]
        wires = len(OPS) + len(WIRE_OPS)
        comp, dec, red, table, exchange, overhead = lines[wires:]
        return cls(
            dict(zip(OPS, lines[: len(OPS)], strict=True)),
            comp,
            dec,
            red,
            table,
            ratio={dtype_name(d): r for d, r in zip(PRIOR_DTYPES, ratios, strict=True)},
            exchange=exchange,
            overhead=overhead,
            wire=dict(zip(WIRE_OPS, lines[len(OPS) : wires], strict=True)),
        )

    def to_json(self) -> str:
        return json.dumps({"vector": self.vector()})

    @classmethod
    def from_json(cls, text: str) -> Profile:
        """A cached profile, validated: a corrupt one (zeros, NaN, negative times) would divide
        by zero or mislead every later decision, so any doubt is a ValueError."""
        try:
            doc = json.loads(text)
            vector = doc["vector"]
        except (KeyError, TypeError, RecursionError) as exc:
            raise ValueError(f"not a profile: {exc!r}") from None
        return cls.from_vector(_checked_vector(vector))


def _checked_vector(v: object) -> list[float]:
    """A profile vector: alphas >= 0, bandwidths and ratios > 0, all finite numbers."""
    size = 2 * LINES + len(PRIOR_DTYPES)
    if not isinstance(v, list) or len(v) != size:
        raise ValueError(f"a profile vector has {size} numbers")
    if not all(type(x) in (int, float) and abs(x) < _MAX_VALUE for x in v):
        raise ValueError(f"a profile vector holds finite numbers below {_MAX_VALUE:g} only")
    floats = [float(x) for x in v]  # (an int past float's range is refused above)
    alphas, positive = floats[0 : 2 * LINES : 2], floats[1 : 2 * LINES : 2] + floats[2 * LINES :]
    if min(alphas) < 0 or min(positive) <= 0:
        raise ValueError("a profile has negative latencies or non-positive bandwidths or ratios")
    return floats


_MAX_VALUE = 1e300  # NaN and the infinities compare False; a 400-digit int compares True


LINES = len(OPS) + len(WIRE_OPS) + 6  # Lines in a Profile's vector form


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True)
class Call:
    """What the cost model needs to know about one collective (agreed by all ranks)."""

    op: str
    nbytes: int  # input bytes per rank (all-gather: the local shard; all-reduce: the tensor)
    dtype: torch.dtype
    world: int
    chunks: int = 1
    native_reduce: bool | None = None  # may a reduction go native? None: only with two ranks

    @property
    def native_ok(self) -> bool:
        return self.world == 2 if self.native_reduce is None else self.native_reduce


def predict(p: Profile, call: Call) -> dict[str, float]:
    """Predicted seconds of every strategy eligible for this call.

    zipccl's own protocols (a2a_reduce, compressed) also pay the descriptor exchange: the default
    verification policy runs it for them. It is charged whatever ``ZIPCCL_VERIFY`` says, so the
    choice never depends on a variable the ranks do not agree on.
    """
    return {
        k: t + (p.exchange.alpha if k != NATIVE else 0.0)
        for k, t in predict_stages(p, call).items()
    }


def wire_line(p: Profile, op: str) -> Line:
    """What the compressed protocol's bytes travel on: the transfer it makes for the op
    (reduce-scatter and all-reduce: the all-to-all's), as the profile measured it on the group."""
    return p.wires[op if op in WIRE_OPS else "all_to_all"]


def predict_stages(p: Profile, call: Call) -> dict[str, float]:
    n, w, op = float(call.nbytes), call.world, call.op
    r = p.ratio.get(dtype_name(call.dtype), 1.0)
    recv = {"all_gather": w * n, "broadcast": n}.get(op, n)  # bytes each rank decompresses

    def zipped(line: Line, reduce: float) -> float:
        stages = [p.compress(n), line.alpha + r * n / line.beta, p.decompress(recv) + reduce]
        c = max(call.chunks, 1)
        per_chunk = p.compress.alpha + line.alpha + p.decompress.alpha
        pipelined = max(stages) + (sum(stages) - max(stages)) / c + (c - 1) * per_chunk
        return p.table.alpha + p.overhead.alpha + pipelined

    if op in ("all_gather", "all_to_all", "broadcast"):
        return {NATIVE: p.native[op](n), COMPRESSED: zipped(wire_line(p, op), 0.0)}
    a2a, red = p.native["all_to_all"], p.reduce(n)
    if op == "reduce_scatter":
        out = {A2A_REDUCE: a2a(n) + red, COMPRESSED: zipped(wire_line(p, op), red)}
        if call.native_ok:  # two operands: every order is the one fp32-then-round result
            out[NATIVE] = p.native["reduce_scatter"](n)
        return out
    if op == "all_reduce":
        rs = predict_stages(p, replace(call, op="reduce_scatter"))
        ag = predict_stages(p, Call("all_gather", call.nbytes // w, call.dtype, w, call.chunks))
        if all_reduce_gathers(COMPRESSED, w):
            whole = Call("all_gather", call.nbytes, call.dtype, w, call.chunks)
            zipped_all = predict_stages(p, whole)[COMPRESSED] + red
        else:
            zipped_all = min(rs.values()) + min(ag.values())
        out = {
            A2A_REDUCE: min(v for k, v in rs.items() if k != COMPRESSED) + ag[NATIVE],
            COMPRESSED: zipped_all,
        }
        if call.native_ok:
            out[NATIVE] = p.native["all_reduce"](n)
        return out
    raise ValueError(f"unknown op {op!r}")


def all_reduce_gathers(strategy: str, world: int) -> bool:
    """Whether a compressed all-reduce is one all-gather of the whole tensor, reduced on every
    rank: with two ranks it moves the bytes reduce-scatter + all-gather would, in one round."""
    return strategy == COMPRESSED and world == 2


def choose(p: Profile, call: Call) -> str:
    """Auto mode's pick: native unless one of zipccl's own protocols clearly wins (by
    ``MARGIN``), so a noisy profile cannot trade the backend's reduction for a2a_reduce on a
    close call; then compressed only if it clearly beats the best uncompressed strategy."""
    times = predict(p, call)
    plain = min((k for k in times if k != COMPRESSED), key=times.__getitem__)
    if NATIVE in times and times[plain] > MARGIN * times[NATIVE]:
        plain = NATIVE
    return COMPRESSED if times[COMPRESSED] <= MARGIN * times[plain] else plain


CHUNK_CHOICES = (1, 2, 4, 8, 16)
MIN_CHUNK_BYTES = 4 << 20
CHUNK_GAIN = 1.01  # more chunks only where the model predicts at least a 1 % gain


def chunks_given() -> bool:
    return settings.value("ZIPCCL_CHUNK_BYTES") is not None


def best_chunks(p: Profile, call: Call) -> int:
    """Auto's chunk count: the one of CHUNK_CHOICES (chunks of at least MIN_CHUNK_BYTES) for
    which the model predicts the fastest compressed call, the fewest within CHUNK_GAIN of it.
    Each chunk costs the latency of its collective, so on a slow-latency link few chunks win:
    a fixed 32 MiB chunk size once charged a 256 MiB all-gather over sockets eight (then
    two-collective) chunks of 1.5 ms latency each and kept it native though compressing it was
    1.4x faster (BENCHMARKS.md, run D).
    Rank-agreed like the profile."""
    options = [c for c in CHUNK_CHOICES if c == 1 or call.nbytes // c >= MIN_CHUNK_BYTES]
    times = {c: predict(p, replace(call, chunks=c))[COMPRESSED] for c in options}
    return min(c for c in options if times[c] <= CHUNK_GAIN * min(times.values()))


#  Auto decides a host-staged group's all-reduce by its size where gloo's own reduction gives
#  zipccl's bits (two ranks), not by the model: native below STAGED_ALL_REDUCE_COMPRESS_FROM
#  bytes, compressed from it. DDP's gradient buckets (25 MB by default), the calls that matter,
#  run faster as gloo's own on the zipccl backend's lanes (zipccl._lanes) than compressed -- one
#  H100, 2 ranks, 4 lanes: DDP step 245 ms native against 398 ms compressed -- and a lone call of
#  32 MiB compresses slower (0.82-0.90x of gloo, native 0.90-1.03x). From 64 MiB a lone call
#  compresses faster in every launch measured, on an H100 and an H200 (64 MiB 1.16-1.57x of
#  gloo, 96 MiB 1.16-1.71x, 256 MiB 1.45-1.71x), where the model, whose native line runs low
#  there (64 MiB: 35 ms predicted, 50 ms measured), kept 64 MiB native (BENCHMARKS.md section
#  6). ZIPCCL_MODE=always compresses them all.
STAGED_ALL_REDUCE_COMPRESS_FROM = 64 << 20


def staged_all_reduce(nbytes: int) -> str:
    """Auto's strategy for a host-staged two-rank all-reduce of ``nbytes``
    (STAGED_ALL_REDUCE_COMPRESS_FROM)."""
    return NATIVE if nbytes < STAGED_ALL_REDUCE_COMPRESS_FROM else COMPRESSED


#  Auto keeps a host-staged broadcast native below STAGED_BROADCAST_COMPRESS_FROM bytes whatever
#  the model predicts; from there the model decides. A compressed broadcast pays the source's
#  encode and copy down before its wire starts and two agreement rounds, against gloo's one-way
#  broadcast: at 16 MiB it measured 0.69-0.89x of gloo's in eight launches on H100 hosts
#  (``always``), and the model, whose lines are the fastest of few timings, once predicted 0.82x
#  of native time and compressed it: 0.66x; at 32 MiB 0.96-1.14x (in 4 MiB chunks, three
#  launches); from 64 MiB 1.23-1.59x (BENCHMARKS.md section 6).
STAGED_BROADCAST_COMPRESS_FROM = 64 << 20


#  Auto's chunk size on a host-staged transport (CUDA tensors on gloo): see host_chunks
HOST_CHUNK_BYTES = 4 << 20


def host_chunks(nbytes: int) -> int:
    """Auto's chunk count on a host-staged transport: chunks of HOST_CHUNK_BYTES, at most
    CHUNK_CHOICES' largest count. The model's lines cannot see what chunks gain there: gloo
    moves several all-to-alls in flight faster than one, and the copies through pinned memory
    and the codec overlap the wire (2 ranks on one H200, BF16, ``always``: a 24 MiB all-reduce
    0.86x of gloo's in one chunk, 1.03x in 4 MiB chunks; a 64 MiB reduce-scatter 1.53x -> 2.76x
    with 1 MiB -> 4 MiB chunks; BENCHMARKS.md section 6). The switch still decides with the
    model's own count (:func:`best_chunks`): its lines charge every chunk a whole collective's
    latency, which the chunks in flight hide, so deciding with these would keep large calls
    native that compress faster. Rank-agreed: it depends on the agreed size only."""
    return max(1, min(CHUNK_CHOICES[-1], -(-nbytes // HOST_CHUNK_BYTES)))


def can_compress(p: Profile, op: str, dtype: torch.dtype, world: int) -> bool:
    """Whether :func:`choose` picks compression for a data-moving ``op`` at *some* size.

    Rank-agreed (profile, op, dtype and world only), so an all-to-all with uneven splits -- whose
    sizes differ per rank -- may go native without agreeing on a size when this is False.
    Sound (False only if no size and chunk count compresses), not sampled: the compressed time is
    at least ``table + exchange + max(stage lines)`` (pipelining only adds), and that bound minus
    ``MARGIN * native`` is convex piecewise linear in n, so its minimum over n >= 0 lies at 0,
    where two stage lines cross, or at infinity.
    """
    line, wire, r = p.native[op], wire_line(p, op), p.ratio.get(dtype_name(dtype), 1.0)
    fan = {"all_gather": world}.get(op, 1)  # bytes decompressed per input byte
    stages = [
        (p.compress.alpha, 1 / p.compress.beta),
        (wire.alpha, r / wire.beta),
        (p.decompress.alpha, fan / p.decompress.beta),
    ]

    def gap(n: float) -> float:
        fixed = p.table.alpha + p.exchange.alpha + p.overhead.alpha
        return fixed + max(a + s * n for a, s in stages) - MARGIN * line(n)

    if max(s for _, s in stages) < MARGIN / line.beta:
        return True  # the gap keeps falling: compression wins for large enough n
    cross = [(a1 - a2) / (s2 - s1) for a1, s1 in stages for a2, s2 in stages if s2 > s1]
    return any(gap(n) <= 0 for n in [0.0, *(c for c in cross if c > 0)])


# --------------------------------------------------------------------------- profiling

PROFILES: dict[object, Profile] = {}
ROUTES: dict[tuple, tuple[str, int]] = {}  # per-call (strategy, chunks); depends on the profiles
_DEPENDENTS: list[Callable[[], None]] = []  # other caches of decisions made under the profiles


def on_new_profile(clear: Callable[[], None]) -> None:
    """Have ``clear`` called with ROUTES cleared (:func:`set_profile`): a cache of decisions made
    under the profiles that a module above the switch keeps (the collectives' repeats), so that
    the switch drops it without holding its objects."""
    _DEPENDENTS.append(clear)


def set_profile(
    group: dist.ProcessGroup | None, profile: Profile | None, staged: bool = False
) -> None:
    """Install (or with None forget) the profile for a group, e.g. a synthetic one in tests;
    the calls' decisions and plans made under the old one go too. ``staged``: the profile of
    the group's CUDA tensors on a host transport (gloo), which has its own."""
    ROUTES.clear()
    for clear in _DEPENDENTS:
        clear()
    _plans.forget()
    if profile is None:
        PROFILES.pop(profile_key(group, staged), None)
    else:
        PROFILES[profile_key(group, staged)] = profile


def profile_key(group: dist.ProcessGroup | None, staged: bool = False) -> object:
    """The profile cache's key (the group's token, _groups.key: None is the current default
    group): a gloo group moves host tensors and, staged through pinned memory, CUDA ones --
    two transports, two profiles."""
    return (_groups.key(group), "staged") if staged else _groups.key(group)


__all__ = [
    "A2A_REDUCE",
    "COMPRESSED",
    "MODES",
    "NATIVE",
    "Call",
    "Line",
    "Profile",
    "best_chunks",
    "can_compress",
    "choose",
    "chunk_bytes",
    "chunks_given",
    "mode",
    "native_reduce",
    "on_new_profile",
    "predict",
    "set_profile",
    "wire_line",
]
