"""What zipccl did in this process: per (op, dtype), calls, compressed calls, bytes, time.

Each collective that zipccl decides on -- compressed or kept native -- is counted once by
:func:`record`, under its op and dtype. :func:`stats` returns the counts so far (a
:class:`Report`); ``ZIPCCL_LOG`` (parsed in :mod:`zipccl.settings`) prints them:

* ``ZIPCCL_LOG=summary``: the report, on stderr at exit, one table per process (rank);
* ``ZIPCCL_LOG=calls``: one line per call as it finishes -- op, dtype, bytes, strategy, time,
  and for a call not compressed the reason (size or link: the switch; dtype; ``ZIPCCL_MODE``;
  reduce op; ``a2a_reduce``: raw bytes, reduced by zipccl) -- and the report at exit;
* ``ZIPCCL_LOG=off`` (default): nothing printed; counting goes on.

Bytes are counted in one measure for both columns: ``bytes_in`` is what a native call of the op
hands the transport for other ranks (:func:`native_bytes`), ``bytes_out`` what zipccl handed it
(equal for a native call). Time is the host's wall time inside the call: for an asynchronous
native CUDA call, the time to enqueue it.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from dataclasses import asdict, dataclass, field

import torch

from zipccl import settings

OPS = ("all_gather", "reduce_scatter", "all_reduce", "all_to_all", "broadcast")
COMPRESSED = "compressed"  # switch.COMPRESSED: the one strategy that compresses


@dataclass
class OpStats:
    """The counts of one (op, dtype), or of several added up (:meth:`Report.total`)."""

    calls: int = 0
    compressed: int = 0  # calls whose strategy was "compressed"
    bytes_in: int = 0  # bytes native calls would have handed the transport (native_bytes)
    bytes_out: int = 0  # bytes zipccl handed it
    seconds: float = 0.0  # host wall time inside the calls
    not_compressed: dict[str, int] = field(default_factory=dict)  # reason -> other calls

    @property
    def ratio(self) -> float:
        """bytes_in / bytes_out: how many times fewer bytes went out (1.0 with none counted)."""
        return self.bytes_in / self.bytes_out if self.bytes_out else 1.0

    def add(self, other: OpStats) -> None:
        self.calls += other.calls
        self.compressed += other.compressed
        self.bytes_in += other.bytes_in
        self.bytes_out += other.bytes_out
        self.seconds += other.seconds
        for reason, n in other.not_compressed.items():
            self.not_compressed[reason] = self.not_compressed.get(reason, 0) + n


@dataclass
class Report:
    """Counts per (op, dtype name), e.g. ``report.ops["all_reduce", "bfloat16"].compressed``."""

    ops: dict[tuple[str, str], OpStats] = field(default_factory=dict)

    def total(self) -> OpStats:
        """Every op and dtype added up."""
        out = OpStats()
        for one in self.ops.values():
            out.add(one)
        return out

    def as_dict(self) -> dict[str, dict[str, object]]:
        """JSON-ready: ``{"all_reduce/bfloat16": {"calls": ..., ...}, ...}``."""
        return {f"{op}/{dtype}": asdict(s) for (op, dtype), s in sorted(self.ops.items())}

    def __str__(self) -> str:
        rows = [("op", "dtype", "calls", "compressed", "MB in", "MB out", "ratio", "s")]
        items = [*sorted(self.ops.items()), (("total", ""), self.total())]
        for (op, dtype), s in items:
            rows.append(
                (
                    op,
                    dtype,
                    str(s.calls),
                    str(s.compressed),
                    f"{s.bytes_in / 1e6:.3f}",
                    f"{s.bytes_out / 1e6:.3f}",
                    f"{s.ratio:.3f}",
                    f"{s.seconds:.3f}",
                )
            )
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
        reasons = self.total().not_compressed
        if reasons:
            lines.append(
                "not compressed: " + ", ".join(f"{r} ({n})" for r, n in sorted(reasons.items()))
            )
        return "\n".join(lines)


_LOCK = threading.Lock()
_COUNTS: dict[tuple[str, str], OpStats] = {}


def record(
    op: str,
    dtype: torch.dtype,
    strategy: str,
    bytes_in: int,
    bytes_out: int,
    seconds: float,
    reason: str = "",
) -> None:
    """Count one finished collective call (once per top-level call, on every rank).

    Args:
        op (str): one of :data:`OPS` (``"all_gather"``, ``"reduce_scatter"``, ``"all_reduce"``,
            ``"all_to_all"``, ``"broadcast"``), whatever form the caller used.
        dtype (torch.dtype): the payload's dtype.
        strategy (str): ``"native"``, ``"a2a_reduce"`` or ``"compressed"`` (switch's names);
            only ``"compressed"`` counts as compressed.
        bytes_in (int): the bytes a native call would hand the transport (:func:`native_bytes`).
        bytes_out (int): the bytes zipccl handed it (``bytes_in`` for a native call).
        seconds (float): host wall time inside the call.
        reason (str): for a call not compressed, why (e.g. ``"switch: size/link"``,
            ``"dtype int64"``, ``"ZIPCCL_MODE=never"``; empty: the strategy's name); counted
            in :attr:`OpStats.not_compressed`, printed per call under ``ZIPCCL_LOG=calls``.

    Raises:
        ValueError: ``op`` is not one of :data:`OPS`, or a byte count is negative.
    """
    if op not in OPS:
        raise ValueError(f"zipccl.accounting.record: op must be one of {OPS}, got {op!r}")
    if bytes_in < 0 or bytes_out < 0:
        raise ValueError(f"zipccl.accounting.record: negative bytes ({bytes_in}, {bytes_out})")
    name = str(dtype).removeprefix("torch.")
    compressed = strategy == COMPRESSED
    why = "" if compressed else reason or strategy
    with _LOCK:
        s = _COUNTS.setdefault((op, name), OpStats())
        s.calls += 1
        s.compressed += compressed
        s.bytes_in += bytes_in
        s.bytes_out += bytes_out
        s.seconds += seconds
        if not compressed:
            s.not_compressed[why] = s.not_compressed.get(why, 0) + 1
    if settings.value("ZIPCCL_LOG") == "calls":
        why = f" ({why})" if why and why != strategy else ""
        print(
            f"zipccl{_who()}: {op} {name} {bytes_in} B -> {bytes_out} B "
            f"{strategy}{why} {seconds * 1e3:.3f} ms",
            file=sys.stderr,
            flush=True,
        )


def native_bytes(op: str, nbytes: int, world: int, is_source: bool = True) -> int:
    """The bytes a native call hands the transport for other ranks: the measure of
    :func:`record`'s ``bytes_in``.

    Args:
        op (str): one of :data:`OPS`.
        nbytes (int): the bytes of this rank's input tensor (all of it, e.g. every rank's block
            of a reduce-scatter).
        world (int): the group's size.
        is_source (bool): for a broadcast, whether this rank is its source.

    Returns:
        int: all-gather: ``nbytes`` (this rank's block, once); reduce-scatter and all-to-all:
        the blocks for the other ranks, ``nbytes * (world - 1) // world``; all-reduce: its
        reduce-scatter and all-gather halves, ``nbytes``; broadcast: ``nbytes`` on the source,
        0 elsewhere.
    """
    if op in ("reduce_scatter", "all_to_all"):
        return nbytes * (world - 1) // world
    if op == "broadcast":
        return nbytes if is_source else 0
    if op in ("all_gather", "all_reduce"):
        return nbytes
    raise ValueError(f"zipccl.accounting.native_bytes: op must be one of {OPS}, got {op!r}")


def stats(reset: bool = False) -> Report:
    """What zipccl did in this process so far, per (op, dtype) (module docstring).

    Args:
        reset (bool): also start counting afresh (the returned report keeps the old counts).

    Returns:
        Report: a copy; ``str(report)`` is the table ``ZIPCCL_LOG=summary`` prints,
        ``report.as_dict()`` a JSON-ready dict, ``report.total()`` the sums.

    Example::

        >>> import zipccl
        >>> report = zipccl.stats()
        >>> report.total().calls >= 0
        True
    """
    with _LOCK:
        out = Report(
            {
                k: OpStats(**{**asdict(v), "not_compressed": dict(v.not_compressed)})
                for k, v in _COUNTS.items()
            }
        )
        if reset:
            _COUNTS.clear()
    return out


def reset_stats() -> None:
    """Start counting afresh (:func:`stats` then reports only later calls).

    Example::

        >>> import zipccl
        >>> zipccl.reset_stats()
        >>> zipccl.stats().ops
        {}
    """
    with _LOCK:
        _COUNTS.clear()


def _who() -> str:
    rank = os.environ.get("RANK")
    return f"[rank {rank}]" if rank is not None else f"[pid {os.getpid()}]"


def _at_exit() -> None:
    """The report on stderr, where ``ZIPCCL_LOG`` asks for it (an invalid value: nothing, as
    exit is no place to raise)."""
    try:
        level = settings.value("ZIPCCL_LOG")
    except ValueError:
        return
    if level != "off":
        print(f"zipccl{_who()} summary:\n{stats()}", file=sys.stderr, flush=True)


atexit.register(_at_exit)

__all__ = ["OPS", "OpStats", "Report", "native_bytes", "record", "reset_stats", "stats"]
