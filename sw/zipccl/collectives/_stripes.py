"""Stripes: a staged group's bytes moved over several gloo groups of its ranks at once.

Why: a gloo group moves a collective's bytes over one TCP connection per pair of ranks, served
by one thread, and that, not the copies through pinned memory, is what bounds a host-staged
call (CUDA tensors on gloo): BENCHMARKS.md section 6, Stripes. So a staged group gets
``ZIPCCL_STRIPES - 1`` more gloo groups of the same ranks, made when its first call that uses
them needs them -- every rank of the group is in that call, at the same point of its sequence
of collectives -- and kept while the group lives. A native all-reduce or broadcast cuts its
host bytes into that many contiguous stripes, all in flight at once (:func:`cut`); a compressed
protocol sends its chunk k on stripe k (:func:`wire`).

Each stripe group sees the same calls in the same order on every rank, so the stripes never
need an agreement of their own, and a reduction cut into stripes gives the bits of the uncut
one wherever every element's reduction is its own (two ranks, or an order-free op).
"""

from __future__ import annotations

import weakref
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from zipccl import _groups, settings

MIN_STRIPE_BYTES = 1 << 20  # a smaller stripe's round costs more than its bytes save

#  Reductions whose result is the same whatever order the ranks' values meet in; with more than
#  two ranks gloo's ring gives each cut of the buffer its own order, so only these may be cut
ORDER_FREE = frozenset(
    (
        dist.ReduceOp.MIN,
        dist.ReduceOp.MAX,
        dist.ReduceOp.BAND,
        dist.ReduceOp.BOR,
        dist.ReduceOp.BXOR,
    )
)


def groups(group: dist.ProcessGroup | None) -> tuple[dist.ProcessGroup | None, ...]:
    """``group`` first, then its stripe groups: ``ZIPCCL_STRIPES`` in all, made on first use
    (every rank of ``group`` must be in the call that first asks). Held weakly -- torch's
    registry holds them, and ``destroy_process_group()`` ends them with the rest -- and ended
    when ``group`` itself is freed: a gloo group left alive into interpreter shutdown can abort
    the process there (zipccl._groups)."""
    count = settings.value("ZIPCCL_STRIPES")
    token = _groups.key(group)
    assert token is not None  # a call on a group that exists
    refs = _MADE.get(token)
    if refs is None:
        refs = _MADE[token] = []
        # on the group, not its token: caches keyed by (token, ...) keep a token past its group
        weakref.finalize(_groups.current(group), _end, refs)
    held = [pg for ref in refs if (pg := ref()) is not None]
    if len(held) + 1 < count:
        held = _make(group, count - 1, held)
        refs[:] = [weakref.ref(pg) for pg in held]
    return (group, *held[: count - 1])


def _end(refs: list[weakref.ref[dist.ProcessGroup]]) -> None:
    """End the stripe groups still registered (their group is gone, or Python is exiting)."""
    for ref in refs:
        pg = ref()
        if pg is not None and dist.is_initialized() and pg in c10d._world.pg_map:
            dist.destroy_process_group(pg)


def unstriped(group: dist.ProcessGroup) -> None:
    """Mark ``group`` as one that never gets stripes: a group whose calls run on threads (the
    zipccl backend's lanes), where ranks could make groups in different orders."""
    token = _groups.key(group)
    if token is not None:
        _NEVER.add(token)


def wire(group: dist.ProcessGroup | None, k: int) -> dist.ProcessGroup | None:
    """The group that carries a protocol's chunk ``k``: stripe k, round robin. Stripe 0 is the
    group itself, so a call that only ever sends chunk 0 (a single transfer) makes no stripes."""
    stripe = k % settings.value("ZIPCCL_STRIPES")
    if stripe == 0 or _never(group):
        return group
    return groups(group)[stripe]


def cut(
    group: dist.ProcessGroup | None,
    host: torch.Tensor,
    world: int,
    op: object = None,
) -> list[tuple[torch.Tensor, dist.ProcessGroup | None]]:
    """The flat ``host`` bytes as contiguous stripes, each with the group that moves it: as
    many as ``ZIPCCL_STRIPES`` allows with at least MIN_STRIPE_BYTES each, one where that is one
    or ``op`` (a reduction) may not be cut for ``world`` ranks (:data:`ORDER_FREE`)."""
    count = min(
        settings.value("ZIPCCL_STRIPES"), host.numel() * host.element_size() // MIN_STRIPE_BYTES
    )
    if count <= 1 or _never(group) or not _cuttable(op, world):
        return [(host, group)]
    parts = host.view(-1).tensor_split(count)
    return list(zip(parts, groups(group)[:count], strict=True))


def _cuttable(op: object, world: int) -> bool:
    return op is None or world == 2 or op in ORDER_FREE


def _never(group: dist.ProcessGroup | None) -> bool:
    token = _groups.key(group)
    return token is None or token in _NEVER


def _make(
    group: dist.ProcessGroup | None, count: int, have: list[dist.ProcessGroup]
) -> list[dist.ProcessGroup]:
    """``have`` and gloo groups of ``group``'s ranks to ``count`` in all. Each is named after
    its group and made in a store round of its own (numbered by arrival, as settings.agree's),
    so a group re-created under a freed one's name never meets the old one's keys."""
    pg = _groups.current(group)
    assert pg is not None
    ranks = dist.get_process_group_ranks(pg)
    name = f"{pg.group_name}:zipccl:stripe"
    store = c10d._get_default_store()
    round_no = (store.add(f"zipccl/stripes/{name}/arrivals", 1) - 1) // len(ranks)
    rank, timeout = dist.get_rank(pg), _timeout(pg)
    made = list(have)
    while len(made) < count:
        where = f"{name}{len(made)}:{round_no}"
        prefixed = dist.PrefixStore(f"zipccl/stripes/{where}/", store)
        made.append(_groups.make("gloo", prefixed, rank, len(ranks), ranks, where, timeout))
    return made


def _timeout(pg: dist.ProcessGroup) -> timedelta:
    """``pg``'s own timeout, which its stripes take (a stripe of a group that fails fast must
    too); torch's default where ``pg`` shows none."""
    try:
        found = pg._get_backend(torch.device("cpu")).options._timeout
    except (AttributeError, RuntimeError):
        return c10d.default_pg_timeout
    return found if isinstance(found, timedelta) else c10d.default_pg_timeout


#  by group token (_groups.key), held weakly: the stripes go with their group
_MADE: weakref.WeakKeyDictionary[object, list[weakref.ref[dist.ProcessGroup]]] = (
    weakref.WeakKeyDictionary()
)
_NEVER: weakref.WeakSet[object] = weakref.WeakSet()
