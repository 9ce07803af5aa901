"""The ``zipccl`` torch.distributed backend: zipccl's collectives under unchanged training code.

``import zipccl`` registers it, so ``dist.init_process_group("zipccl")`` (or
``"cpu:gloo,cuda:zipccl"``, or ``dist.new_group(backend="zipccl")``) makes a group whose
collectives go through zipccl's switch -- DDP, FSDP2, DTensor and anything else that calls
torch.distributed then reach zipccl without a hook.

A :class:`ProcessGroupZipccl` creates, for the same ranks, an inner gloo group (CPU tensors) and,
where there is a GPU, an inner group for CUDA tensors: NCCL, or the gloo group itself -- zipccl's
host-staged transport, through pinned memory -- where ranks share a GPU (NCCL refuses them),
NCCL is missing, or ``ZIPCCL_CUDA_TRANSPORT=gloo`` asks for it (``auto``, the default, picks;
``nccl`` insists). Every call goes to the inner group of its tensors' device:

* what zipccl compresses -- all-gather (list, into-tensor, coalesced), reduce-scatter (list,
  tensor, coalesced), all-reduce, all-to-all (single, list), broadcast -- through zipccl's
  functions, which apply the switch, ``ZIPCCL_MODE`` and verification as on any group; reduce
  ops zipccl does not reduce itself (PREMUL_SUM, bitwise) go to the inner group's own;
* everything else -- send/recv, barrier, gather, scatter, reduce, ``allreduce_coalesced``, the
  ops of a coalescing window -- straight to the inner group, which returns its own Work.

A compressed call returns a completed :class:`~zipccl.collectives.DoneWork` (its future holds the
outputs, CUDA-aware); a call zipccl kept native returns the inner backend's own Work. On the
host-staged transport CUDA calls run on the group's *lanes* (``ZIPCCL_LANES``, zipccl._lanes):
several in flight at once, each on a gloo group of its own, the call returning a Work at once.

The group's ranks agree on their ZIPCCL_* settings when it is created (:mod:`zipccl.settings`):
ranks started with different ones get a CollectiveMismatchError from ``init_process_group``.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TypeVar

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import AllgatherOptions  # (torch.distributed does not export it)

from zipccl import _groups, _lanes, accounting, collectives, settings, switch
from zipccl._errors import CollectiveMismatchError, PeerError
from zipccl._name import NAME
from zipccl.collectives import DoneWork, Forwarding, ReduceOpArg, _agree, _profile, _stripes
from zipccl.collectives._exchange import CODEC_DTYPES
from zipccl.collectives._transport import resolve

_KINDS = {"gloo": dist.ProcessGroup.BackendType.GLOO, "nccl": dist.ProcessGroup.BackendType.NCCL}
_DEVICES = ("cpu", "cuda")
_R = TypeVar("_R")


@dataclass(frozen=True)
class Options:
    """How a zipccl group is made, passed as ``pg_options`` (``init_process_group`` or
    ``new_group``); without it: gloo for CPU tensors, NCCL for CUDA ones where available, and
    the name ``"zipccl"``.

    Args:
        inner (dict of str to str): device type (``"cpu"``, ``"cuda"``) -> the inner backend that
            moves its tensors (``"gloo"`` or ``"nccl"``); empty: the default above.
        inner_options (object): ``pg_options`` for the inner NCCL group
            (``ProcessGroupNCCL.Options``), or None.
        name (str): what the group answers to ``pg.name()``: the zipccl-run launcher
            (:mod:`zipccl.wrap`) gives the inner backend's name, which frameworks check.

    Example::

        >>> import zipccl.backend
        >>> zipccl.backend.Options(inner={"cpu": "gloo"}).name
        'zipccl'
    """

    inner: Mapping[str, str] = field(default_factory=dict)
    inner_options: object | None = None
    name: str = NAME


# The overrides below take the arguments torch's C++ dispatcher passes a Python backend (tensors,
# then an options object); torch's stubs type each as the overload set of the Python-facing
# binding, which such an override cannot match: hence their ``type: ignore[override]`` (and
# ``[assignment]`` on the older names, whose stub parameter names differ).
class ProcessGroupZipccl(dist.ProcessGroup, Forwarding):
    """A process group whose collectives zipccl compresses where it pays (module docstring).

    torch.distributed creates it for the ``zipccl`` backend that ``import zipccl`` registers:
    ``dist.init_process_group("zipccl")``, ``"cpu:gloo,cuda:zipccl"`` or
    ``dist.new_group(ranks, backend="zipccl")``. It first agrees with its peers, through the
    store, on their ``ZIPCCL_*`` settings, then creates an inner gloo group (CPU tensors) and,
    where there is a GPU, an inner NCCL group (CUDA tensors) of the same ranks -- or, where the
    ranks share a GPU, NCCL is missing or ``ZIPCCL_CUDA_TRANSPORT=gloo``, moves CUDA tensors
    through the gloo group, staged through pinned host memory.
    All-gather, reduce-scatter, all-reduce, all-to-all and broadcast go through zipccl's
    functions on the inner group of their tensors' device (the switch, ``ZIPCCL_MODE`` and
    verification as on any group); everything else, and any op inside a coalescing window,
    goes to the inner group as it is. A compressed call returns a completed Work whose future
    holds the outputs (CUDA-aware); a call zipccl kept native returns the inner backend's; a
    CUDA call on the host-staged transport returns at once, running on one of the group's lanes
    (:attr:`lanes`).

    Args:
        store (dist.Store): the group's store.
        rank (int): this process's rank in the group.
        size (int): the group's size.
        timeout (timedelta): the inner groups' timeout.
        global_ranks (list of int): the group's global ranks (empty: the default group).
        name (str): the group's name; the inner groups are named after it.
        options (Options): the inner backends and the reported name (default: :class:`Options`).

    Raises:
        CollectiveMismatchError: the ranks' ``ZIPCCL_*`` settings differ, or one cannot be
            parsed, or their inner backends differ (e.g. one rank sees no GPU) -- on every rank,
            from ``init_process_group`` or ``new_group``.
        ValueError: a setting every rank gives the same malformed value; ``options`` names a
            device or inner backend zipccl does not wrap.
        PeerError: another rank failed while the group started (on every rank whose own start
            did not fail; the failing rank raises its own error), within one store round trip.

    Example::

        >>> import torch.distributed as dist, zipccl
        >>> dist.init_process_group("zipccl")  # was: dist.init_process_group("nccl")
        >>> t = torch.randn(1 << 20, dtype=torch.bfloat16, device="cuda")
        >>> dist.all_reduce(t)  # zipccl.all_reduce on the inner NCCL group
        >>> nccl = dist.group.WORLD.inner("cuda")  # the inner group itself
    """

    def __init__(
        self,
        store: dist.Store,
        rank: int,
        size: int,
        timeout: timedelta,
        global_ranks: list[int],
        name: str,
        options: Options | None = None,
    ) -> None:
        agreed = settings.agree(store, rank, size)  # before anything else: a mismatch raises
        options = options or Options()
        # every rank's plan, checked before any rank blocks in an inner group's connect
        gpus = _round(store, rank, size, "gpus", _gpu_id())  # which ranks share a GPU
        plan, lanes = _together(
            store,
            rank,
            size,
            "plan",
            lambda: _with_lanes(_plan(options, agreed.cuda_transport, gpus), agreed.lanes),
        )
        # the binding's (rank, size) constructor, which torch's stub lacks (it has only the store's)
        super().__init__(rank, size)  # type: ignore[call-arg]
        self._coalescing = False
        self._name = options.name
        self._inner: dict[str, dist.ProcessGroup] = {}
        self._lanes: _lanes.Lanes | None = None  # the staged transport's (ZIPCCL_LANES)

        def build() -> dict[str, str]:
            made: dict[str, dist.ProcessGroup] = {}
            for device, backend in plan.items():
                if backend not in made:
                    made[backend] = _inner_group(
                        backend, store, rank, size, timeout, global_ranks, name, options
                    )
                pg = made[backend]
                on = torch.device(device)  # torch's helpers that look a device's backend up
                self._register_backend(on, _KINDS[backend], pg._get_backend(on))  # (FSDP2, NCCL)
                settings.mark_agreed(pg)
                self._inner[device] = pg
            if lanes:
                self._lanes = _staged_lanes(
                    lanes,
                    lambda lane: _inner_group(
                        "gloo", store, rank, size, timeout, global_ranks, f"{name}:{lane}", options
                    ),
                )
            return plan

        _together(store, rank, size, "inner", build)

    def getBackendName(self) -> str:  # the C++ name, which the trampoline looks up
        """``"zipccl"``, or the name :class:`Options` gives (the inner backend's, under the
        zipccl-run launcher)."""
        return self._name

    def inner(self, device: torch.device | str) -> dist.ProcessGroup:
        """The inner group that moves tensors of ``device``'s type.

        Args:
            device (torch.device or str): e.g. ``"cpu"``, ``"cuda"`` or ``"cuda:1"``.

        Returns:
            ProcessGroup: the inner gloo group for ``"cpu"``; for ``"cuda"`` the inner NCCL
            group, or the gloo group where CUDA tensors are staged through host memory; each
            a regular torch.distributed group of the same ranks.

        Raises:
            ValueError: no inner group moves that device's tensors (``"cuda"`` without a GPU).
        """
        kind = torch.device(device).type
        if kind not in self._inner:
            raise ValueError(
                f"the zipccl backend moves tensors on {sorted(self._inner)}, "
                f"not on {kind} (no inner group for it)"
            )
        return self._inner[kind]

    @property
    def lanes(self) -> int:
        """How many of this group's CUDA calls may be in flight at once on the host-staged
        transport (``ZIPCCL_LANES``; zipccl._lanes); 0: each runs on the calling thread, as on
        NCCL and for CPU tensors always."""
        return len(self._lanes) if self._lanes is not None else 0

    # ----------------------------------------------------------------- compressed ops

    def allreduce(  # type: ignore[override]
        self,
        tensors: list[torch.Tensor],
        opts: dist.AllreduceOptions | None = None,
    ) -> dist.Work:
        """One tensor: :func:`zipccl.all_reduce` on the inner group; several, or inside a
        coalescing window: the inner group's own."""
        opts = opts or dist.AllreduceOptions()
        if self._coalescing or len(tensors) != 1:
            return self._pass("allreduce", tensors, opts)
        (t,) = tensors
        op = _reduce_op(opts)
        return self._run(
            "all_reduce", t, tensors, lambda g, a: collectives.all_reduce(t, op, g, a), reduce=op
        )

    def broadcast(  # type: ignore[override]
        self,
        tensors: list[torch.Tensor],
        opts: dist.BroadcastOptions | None = None,
    ) -> dist.Work:
        """One tensor: :func:`zipccl.broadcast` on the inner group; several, or inside a
        coalescing window: the inner group's own."""
        opts = opts or dist.BroadcastOptions()
        if self._coalescing or len(tensors) != 1:
            return self._pass("broadcast", tensors, opts)
        (t,) = tensors
        src = dist.get_global_rank(self.inner(t.device), opts.rootRank)  # a lane's too
        return self._run(
            "broadcast",
            t,
            tensors,
            lambda g, a: collectives.broadcast(t, src, g, a),
            source=opts.rootRank == self.rank(),
        )

    def allgather(  # type: ignore[override]
        self,
        output_lists: list[list[torch.Tensor]],
        inputs: list[torch.Tensor],
        opts: AllgatherOptions | None = None,
    ) -> dist.Work:
        """One input: :func:`zipccl.all_gather` on the inner group; several, or inside a
        coalescing window: the inner group's own."""
        opts = opts or AllgatherOptions()
        if self._coalescing or len(inputs) != 1:
            return self._pass("allgather", output_lists, inputs, opts)
        (t,), (outs,) = inputs, output_lists
        return self._run("all_gather", t, outs, lambda g, a: collectives.all_gather(outs, t, g, a))

    def all_gather_single(
        self, output: torch.Tensor, input: torch.Tensor, opts: AllgatherOptions | None = None
    ) -> dist.Work:
        """:func:`zipccl.all_gather_into_tensor` on the inner group (inside a coalescing
        window: the inner group's own)."""
        if self._coalescing:
            return self._pass("all_gather_single", output, input, opts or AllgatherOptions())
        return self._run(
            "all_gather",
            input,
            [output],
            lambda g, a: collectives.all_gather_into_tensor(output, input, g, a),
        )

    def all_gather_single_coalesced(
        self,
        outputs: list[torch.Tensor],
        inputs: list[torch.Tensor],
        opts: AllgatherOptions | None = None,
    ) -> dist.Work:
        """One zipccl all-gather per pair (FSDP's and DTensor's coalesced all-gathers), each
        finished before the next; one Work for all."""
        if self._coalescing:
            return self._pass(
                "all_gather_single_coalesced", outputs, inputs, opts or AllgatherOptions()
            )

        def each(g: dist.ProcessGroup) -> None:
            for out, inp in zip(outputs, inputs, strict=True):
                self._counted(
                    "all_gather",
                    inp,
                    functools.partial(collectives.all_gather_into_tensor, out, inp, g),
                )

        return self._run_all("all_gather", outputs, inputs, each)

    def reduce_scatter_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        opts: dist.ReduceScatterOptions | None = None,
    ) -> dist.Work:
        """:func:`zipccl.reduce_scatter_tensor` on the inner group (inside a coalescing window:
        the inner group's own)."""
        opts = opts or dist.ReduceScatterOptions()
        if self._coalescing:
            return self._pass("reduce_scatter_single", output, input, opts)
        op = _reduce_op(opts)
        return self._run(
            "reduce_scatter",
            input,
            [output],
            lambda g, a: collectives.reduce_scatter_tensor(output, input, op, g, a),
            reduce=op,
        )

    def reduce_scatter_single_coalesced(
        self,
        outputs: list[torch.Tensor],
        inputs: list[torch.Tensor],
        opts: dist.ReduceScatterOptions | None = None,
    ) -> dist.Work:
        """One :func:`zipccl.reduce_scatter_tensor` per pair, each finished before the next;
        one Work for all."""
        opts = opts or dist.ReduceScatterOptions()
        if self._coalescing:
            return self._pass("reduce_scatter_single_coalesced", outputs, inputs, opts)
        op = _reduce_op(opts)

        def each(g: dist.ProcessGroup) -> None:
            for out, inp in zip(outputs, inputs, strict=True):
                self._counted(
                    "reduce_scatter",
                    inp,
                    functools.partial(collectives.reduce_scatter_tensor, out, inp, op, g),
                    reduce=op,
                )

        return self._run_all("reduce_scatter", outputs, inputs, each, reduce=op)

    def reduce_scatter(  # type: ignore[override]
        self,
        outputs: list[torch.Tensor],
        input_lists: list[list[torch.Tensor]],
        opts: dist.ReduceScatterOptions | None = None,
    ) -> dist.Work:
        """The list form as one zipccl reduce-scatter of the inputs laid end to end (where they
        all match the output, as torch requires; else the inner group's own)."""
        opts = opts or dist.ReduceScatterOptions()
        if self._coalescing or len(outputs) != 1 or not _alike(outputs[0], input_lists[0]):
            return self._pass("reduce_scatter", outputs, input_lists, opts)
        (out,), (parts,) = outputs, input_lists
        flat = torch.cat([p.reshape(-1) for p in parts])
        op = _reduce_op(opts)
        return self._run(
            "reduce_scatter",
            flat,
            outputs,
            lambda g, a: collectives.reduce_scatter_tensor(out, flat, op, g, a),
            reduce=op,
        )

    def all_to_all_single(  # type: ignore[override]
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_splits: list[int],
        input_splits: list[int],
        opts: dist.AllToAllOptions | None = None,
    ) -> dist.Work:
        """:func:`zipccl.all_to_all_single` on the inner group (empty splits: even); inside a
        coalescing window: the inner group's own."""
        if self._coalescing:
            return self._pass(
                "all_to_all_single",
                output,
                input,
                output_splits,
                input_splits,
                opts or dist.AllToAllOptions(),
            )
        into, rows = list(output_splits) or None, list(input_splits) or None
        return self._run(
            "all_to_all",
            input,
            [output],
            lambda g, a: collectives.all_to_all_single(output, input, into, rows, g, a),
        )

    def alltoall(  # type: ignore[override]
        self,
        outputs: list[torch.Tensor],
        inputs: list[torch.Tensor],
        opts: dist.AllToAllOptions | None = None,
    ) -> dist.Work:
        """The list form as one zipccl all-to-all of the tensors laid end to end, split by their
        sizes (where all share one dtype and device; else the inner group's own)."""
        opts = opts or dist.AllToAllOptions()
        if self._coalescing or len({(t.dtype, t.device) for t in [*outputs, *inputs]}) != 1:
            return self._pass("alltoall", outputs, inputs, opts)
        flat_in = torch.cat([t.reshape(-1) for t in inputs])
        into, rows = [t.numel() for t in outputs], [t.numel() for t in inputs]
        flat_out = torch.empty(sum(into), dtype=flat_in.dtype, device=flat_in.device)

        def each(g: dist.ProcessGroup) -> None:
            self._counted(
                "all_to_all",
                flat_in,
                lambda: collectives.all_to_all_single(flat_out, flat_in, into, rows, g),
            )
            for out, part in zip(outputs, flat_out.split(into), strict=True):
                out.copy_(part.view(out.shape))

        return self._run_all("all_to_all", outputs, [flat_in, flat_out], each)

    # torch's older names for the same calls (still looked up by some callers)
    _allgather_base = all_gather_single
    allgather_into_tensor_coalesced = all_gather_single_coalesced  # type: ignore[assignment]
    _reduce_scatter_base = reduce_scatter_single  # type: ignore[assignment]
    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced  # type: ignore[assignment]
    alltoall_base = all_to_all_single  # type: ignore[assignment]

    # ----------------------------------------------------------------- passed through

    def barrier(  # type: ignore[override]
        self,
        opts: dist.BarrierOptions | None = None,
    ) -> dist.Work:
        """The inner group's barrier: of ``opts.device``'s inner group, else the NCCL one where
        there is one and CUDA is available, else gloo's."""
        opts = opts or dist.BarrierOptions()
        device = (
            opts.device
            if opts.device is not None
            else ("cuda" if "cuda" in self._inner and torch.cuda.is_available() else "cpu")
        )
        return self.inner(device).barrier(opts)

    def _start_coalescing(self, device: torch.device) -> None:
        """Calls between this and :meth:`_end_coalescing` go to the inner backend as they are:
        it runs them together, so none may take zipccl's protocols (host syncs between its
        collectives)."""
        self.inner(device)._start_coalescing(device)
        self._coalescing = True

    def _end_coalescing(self, device: torch.device) -> dist.Work:
        self._coalescing = False
        return self.inner(device)._end_coalescing(device)

    def _run(
        self,
        op: str,
        t: torch.Tensor,
        outputs: list[torch.Tensor],
        call: Callable[[dist.ProcessGroup, bool], dist.Work | None],
        *,
        source: bool = True,
        reduce: ReduceOpArg | None = None,
    ) -> dist.Work:
        """``call(group, async_op)``, one zipccl collective of ``op`` with the input ``t``,
        counted (:meth:`_counted`): on the inner group of ``t``'s device, returning torch's Work
        where zipccl handed the call to torch, else a completed one holding ``outputs``; or,
        where that group has lanes, on the next lane, returning its Work at once."""
        group, lanes = self.inner(t.device), self._lanes_of(t)
        _measure_link_first(op, group, t, reduce, lanes)

        def counted(g: dist.ProcessGroup, async_op: bool) -> dist.Work | None:
            return self._counted(op, t, lambda: call(g, async_op), source=source, reduce=reduce)

        def on_lane(g: dist.ProcessGroup) -> None:
            counted(g, False)

        if lanes is None:
            return _work(outputs, counted(group, True))
        return lanes.submit(on_lane, outputs, [t, *outputs])

    def _run_all(
        self,
        op: str,
        outputs: list[torch.Tensor],
        inputs: list[torch.Tensor],
        each: Callable[[dist.ProcessGroup], None],
        *,
        reduce: ReduceOpArg | None = None,
    ) -> dist.Work:
        """``each(group)``: several zipccl collectives, each counted and finished before the next
        (the list and coalesced forms), on the inner group of the inputs' device or on one lane;
        one Work for all."""
        if not inputs:  # nothing to move (an empty coalesced call)
            return DoneWork(outputs)
        t = inputs[0]
        group, lanes = self.inner(t.device), self._lanes_of(t)
        _measure_link_first(op, group, t, reduce, lanes)
        if lanes is None:
            each(group)
            return DoneWork(outputs)
        return lanes.submit(each, outputs, [*inputs, *outputs])

    def _lanes_of(self, t: torch.Tensor) -> _lanes.Lanes | None:
        """The lanes that run a call on ``t``: this group's, for tensors on their device."""
        lanes = self._lanes
        return lanes if lanes is not None and t.device == lanes.device else None

    def _counted(
        self,
        op: str,
        t: torch.Tensor,
        call: Callable[[], _R],
        *,
        source: bool = True,
        reduce: ReduceOpArg | None = None,
    ) -> _R:
        """``call()``, one zipccl collective of ``op`` on this rank's input ``t``, counted in
        :mod:`zipccl.accounting` with the strategy zipccl took (``collectives.STATS``, this
        thread's: the last call's strategy, unset where zipccl handed the call straight to
        torch) and the bytes it sent (``STATS.sent``); ``source``: a broadcast's source;
        ``reduce``: a reduction's op."""
        nbytes = t.numel() * t.element_size()
        wire = collectives.STATS
        wire.strategy, sent = "", wire.sent
        start = time.perf_counter()
        out = call()
        seconds = time.perf_counter() - start
        strategy = wire.strategy or switch.NATIVE
        bytes_in = accounting.native_bytes(op, nbytes, self.size(), source)
        native = strategy == switch.NATIVE
        accounting.record(
            op,
            t.dtype,
            strategy,
            bytes_in,
            bytes_in if native else wire.sent - sent,
            seconds,
            _why_native(t.dtype, nbytes, reduce) if native else "",
        )
        return out

    def _pass(self, method: str, *args: object) -> dist.Work:
        """``method`` of the inner group of the first tensor in ``args``, with ``args``."""
        return getattr(self.inner(_first_tensor(args).device), method)(*args)

    def __repr__(self) -> str:
        return (
            f"ProcessGroupZipccl(rank={self.rank()}, size={self.size()}, "
            f"inner={sorted(self._inner)})"
        )


def _passed(method: str) -> Callable[..., dist.Work]:
    def call(self: ProcessGroupZipccl, *args: object) -> dist.Work:
        return self._pass(method, *args)

    call.__name__ = method
    call.__doc__ = f"The inner group's own ``{method}``."
    return call


for _method in (
    "send",
    "recv",
    "recv_anysource",
    "gather",
    "scatter",
    "reduce",
    "allreduce_coalesced",
    "allgather_coalesced",
):
    setattr(ProcessGroupZipccl, _method, _passed(_method))


def _plan(options: Options, cuda_transport: str, gpus: list[str]) -> dict[str, str]:
    """Device type -> inner backend, from ``options`` or the default (cpu: gloo always; cuda:
    :func:`_cuda_backend`); ValueError naming what zipccl cannot wrap. NCCL asked for CUDA
    tensors (as the zipccl-run launcher asks for a script's ``"nccl"`` group) is also subject to
    :func:`_cuda_backend`: the host-staged gloo transport where ranks share a GPU, which NCCL
    refuses, or where ``ZIPCCL_CUDA_TRANSPORT=gloo`` asks for it."""
    if not options.inner:
        cuda = _cuda_backend(cuda_transport, gpus)
        return {"cpu": "gloo", "cuda": cuda} if cuda else {"cpu": "gloo"}
    plan = dict(sorted(options.inner.items()))
    for device, backend in plan.items():
        if device not in _DEVICES or backend not in _KINDS:
            raise ValueError(
                f"the zipccl backend wraps {sorted(_KINDS)} on {list(_DEVICES)}, "
                f"not {backend!r} on {device!r}"
            )
    if plan.get("cuda") == "nccl":
        plan["cuda"] = _cuda_backend(cuda_transport, gpus) or "nccl"  # (no GPU: NCCL's own error)
    return plan


def _with_lanes(plan: dict[str, str], lanes: int) -> tuple[dict[str, str], int]:
    """The plan and its lane count: ``ZIPCCL_LANES`` where CUDA tensors take the host-staged
    transport on a GPU here, else 0 (ranks that differ, e.g. one without CUDA, raise in the plan's
    round instead of one waiting in a lane group's connect)."""
    staged = plan.get("cuda") == "gloo" and torch.cuda.is_available()
    return plan, lanes if staged else 0


_SEP = "\x1f"


def _together(store: dist.Store, rank: int, size: int, step: str, build: Callable[[], _R]) -> _R:
    """``build()`` on every rank of a starting group, then one store round in which each rank
    tells the others its outcome: a rank whose ``build`` raised tells its error and re-raises;
    the others raise PeerError naming it, instead of waiting for it in a later connect or
    collective until the group's timeout. Every rank's result must match (its repr):
    CollectiveMismatchError otherwise."""
    try:
        result = build()
    except Exception as error:
        _round(store, rank, size, step, f"error{_SEP}{type(error).__name__}: {error}"[:512])
        raise
    outcomes = _round(store, rank, size, step, f"ok{_SEP}{result!r}")
    failures = {r: o.split(_SEP, 1)[1] for r, o in enumerate(outcomes) if o.startswith("error")}
    if failures:
        raise PeerError(
            f"zipccl: the group could not start ({step}): "
            + "; ".join(f"rank {r}: {what}" for r, what in failures.items()),
            failures,
        )
    if len(set(outcomes)) > 1:
        raise CollectiveMismatchError(
            f"zipccl: ranks start the group with different inner backends ({step}): "
            + "; ".join(f"rank {r}: {o.split(_SEP, 1)[1]}" for r, o in enumerate(outcomes))
        )
    return result


def _round(store: dist.Store, rank: int, size: int, step: str, mine: str) -> list[str]:
    """Publish ``mine`` and read every rank's, in the group's store; rounds numbered by arrival
    (as settings.agree), so a group re-created on the same store starts a new round."""
    round_no = (store.add(f"zipccl/start/{step}/arrivals", 1) - 1) // size
    keys = [f"zipccl/start/{step}/{round_no}/{r}" for r in range(size)]
    store.set(keys[rank], mine)
    store.wait(keys)
    return [value.decode() for value in store.multi_get(keys)]


def _cuda_backend(choice: str, gpus: list[str]) -> str | None:
    """What moves the group's CUDA tensors (None: no GPU here): NCCL, or gloo -- the host-staged
    transport, for ranks that share a GPU (NCCL refuses them), without NCCL, or where
    ``ZIPCCL_CUDA_TRANSPORT`` asks for it. Every rank decides alike: the setting is agreed, and
    ``auto`` looks at every rank's GPU (``gpus``, from one store round)."""
    if not torch.cuda.is_available():
        return None
    if choice == "nccl" and not dist.is_nccl_available():
        raise ValueError("ZIPCCL_CUDA_TRANSPORT=nccl, but this torch has no NCCL")
    if choice != "auto":
        return choice
    shared = len(set(gpus)) < len(gpus)
    return "nccl" if dist.is_nccl_available() and not shared else "gloo"


def _gpu_id() -> str:
    """This rank's GPU (its UUID; empty without one)."""
    if not torch.cuda.is_available():
        return ""
    return str(torch.cuda.get_device_properties(torch.cuda.current_device()).uuid)


def _inner_group(
    backend: str,
    store: dist.Store,
    rank: int,
    size: int,
    timeout: timedelta,
    global_ranks: list[int],
    name: str,
    options: Options,
) -> dist.ProcessGroup:
    """A registered ``backend`` group of the same ranks (zipccl._groups.make) under a name and
    tag of its own."""
    inner_options = options.inner_options if backend == "nccl" else None
    inner_name = f"{name}:zipccl:{backend}"
    return _groups.make(
        backend, store, rank, size, global_ranks, inner_name, timeout, inner_options
    )


def _staged_lanes(count: int, gloo_group: Callable[[str], dist.ProcessGroup]) -> _lanes.Lanes:
    """``count`` lanes for CUDA tensors on the host-staged transport, each with a gloo group of
    the same ranks (``gloo_group(name)``; zipccl._lanes: why), on this rank's GPU."""
    groups = []
    for i in range(count):
        lane = gloo_group(f"lane{i}")
        settings.mark_agreed(lane)
        _stripes.unstriped(lane)  # its calls run on its thread, where ranks' orders may differ
        groups.append(lane)
    return _lanes.Lanes(groups, torch.device("cuda", torch.cuda.current_device()))


def _reduce_op(opts: dist.AllreduceOptions | dist.ReduceScatterOptions) -> ReduceOpArg:
    """The reduce op as zipccl takes it: the plain op type, or PREMUL_SUM whole (with its
    factor), which zipccl leaves to the inner backend."""
    op = opts.reduceOp
    kind = op.op  # type: ignore[attr-defined]  # ReduceOp.op: in the binding, not in the stub
    return op if kind == dist.ReduceOp.PREMUL_SUM else kind


def _measure_link_first(
    op: str,
    group: dist.ProcessGroup,
    t: torch.Tensor,
    reduce: ReduceOpArg | None,
    lanes: _lanes.Lanes | None,
) -> None:
    """Where auto mode's switch would measure ``group``'s link inside this call (its first such
    call: _profile.profile_for, collectives on the group), measure it now, so that its traffic is
    not counted as the call's bytes; ``lanes`` (gloo groups of the same ranks over the same
    link) take the same profile, not one measured per lane while the others run. Every rank
    takes the same branch: the conditions are the plan's (collectives), on values the ranks
    share (an uneven all-to-all's sizes aside, which the plan does not look at either)."""
    nbytes = t.numel() * t.element_size()
    if (
        switch.mode() == "auto"
        and t.dtype in CODEC_DTYPES
        and (nbytes or op == "all_to_all")
        and (reduce is None or _agree.reduce_code(reduce) != 99)
    ):
        g = resolve(group, t)
        profile = _profile.profile_for(g)
        for lane in lanes.groups if lanes is not None else ():
            switch.PROFILES.setdefault(switch.profile_key(lane, g.staged), profile)


def _why_native(dtype: torch.dtype, nbytes: int, reduce: ReduceOpArg | None) -> str:
    """Why zipccl kept a call native, for the report (the checks collectives' plan makes)."""
    if switch.mode() == "never":
        return "ZIPCCL_MODE=never"
    if dtype not in CODEC_DTYPES:
        return f"dtype {str(dtype).removeprefix('torch.')}"
    if reduce is not None and _agree.reduce_code(reduce) == 99:
        return "reduce op"
    if nbytes <= _agree.SMALL_BYTES:
        return f"size: at most {_agree.SMALL_BYTES} bytes"
    return "switch: size/link"


def _work(outputs: list[torch.Tensor], returned: dist.Work | None) -> dist.Work:
    """What a compressed op returns: torch's Work where zipccl handed the call to torch, else a
    completed one holding the outputs."""
    if isinstance(returned, DoneWork):
        return DoneWork(outputs)
    assert returned is not None  # async_op=True: torch's own Work
    return returned


def _alike(out: torch.Tensor, parts: list[torch.Tensor]) -> bool:
    return all(p.shape == out.shape and p.dtype == out.dtype for p in parts)


def _first_tensor(args: tuple[object, ...]) -> torch.Tensor:
    found = next(_tensors(args), None)
    if found is None:
        raise ValueError("the zipccl backend routes a call by its tensors' device, and got none")
    return found


def _tensors(args: Iterable[object]) -> Iterator[torch.Tensor]:
    for arg in args:
        if isinstance(arg, torch.Tensor):
            yield arg
        elif isinstance(arg, list | tuple):
            yield from _tensors(arg)


def create(
    opts: dist.distributed_c10d._DistributedBackendOptions, backend_options: object
) -> ProcessGroupZipccl:
    """torch's extended backend API: what the group's creator needs, ranks included;
    ``backend_options``: the caller's ``pg_options``, an :class:`Options` or None."""
    if backend_options is not None and not isinstance(backend_options, Options):
        raise TypeError(
            "pg_options of a zipccl group must be zipccl.backend.Options, "
            f"got {type(backend_options).__name__}"
        )
    return ProcessGroupZipccl(
        opts.store,
        opts.group_rank,
        opts.group_size,
        opts.timeout,
        list(opts.global_ranks_in_group),
        str(opts.group_id),
        backend_options,
    )


__all__ = ["NAME", "Options", "ProcessGroupZipccl", "create"]
