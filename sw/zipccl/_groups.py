"""A process group's identity in zipccl's caches, which never keeps the group alive.

zipccl keeps state per group: the settings agreement, the switch's profiles and routes, the
plans, the exchange's row room, the resolved groups. Keyed by the group object itself, those
caches held every group a script destroyed: its gloo threads and sockets lived on, and a gloo
group alive into interpreter shutdown can abort the process there (a gloo worker thread frees a
finished call's tensors after Python has begun finalizing: ``terminate called without an
active exception``). The caches key by :func:`key` instead: a token the group holds weakly, made
once per group, so a destroyed group is freed as it would be without zipccl, and a new group --
even at a freed one's address -- gets a new token, never a stale entry.
"""

from __future__ import annotations

import weakref
from datetime import timedelta
from typing import cast

import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d


class GroupKey:
    """A group's token: compared by identity, holding nothing of the group."""

    __slots__ = ("__weakref__",)


_KEYS: weakref.WeakKeyDictionary[dist.ProcessGroup, GroupKey] = weakref.WeakKeyDictionary()


def current(group: dist.ProcessGroup | None) -> dist.ProcessGroup | None:
    """The group a call names: ``group``, or for None the *current* default group."""
    return dist.group.WORLD if group is None else group


def key(group: dist.ProcessGroup | None) -> GroupKey | None:
    """The token of ``group`` (None: the current default group, so a default group destroyed
    and re-created is another key); None while there is no such group."""
    pg = current(group)
    if pg is None:
        return None
    found = _KEYS.get(pg)
    if found is None:
        found = _KEYS[pg] = GroupKey()
    return found


def make(
    backend: str,
    store: dist.Store,
    rank: int,
    size: int,
    global_ranks: list[int],
    name: str,
    timeout: timedelta,
    options: object = None,
) -> dist.ProcessGroup:
    """A registered ``backend`` group of ``size`` ranks, ``global_ranks`` (empty: the world),
    under ``name``: made by torch's own helper behind ``new_group`` (the original, where
    zipccl.wrap patched it, so that a gloo group zipccl makes for itself is gloo, never a zipccl
    group) and registered, so that every torch.distributed function takes it and
    ``destroy_process_group`` ends it."""
    helper = c10d._new_process_group_helper
    helper = getattr(helper, "__wrapped__", helper)
    pg, _ = helper(
        size,
        rank,
        global_ranks,
        backend,
        store,
        group_name=cast(c10d.GroupName, name),
        backend_options=options,
        timeout=timeout,
        pg_tag=name,
    )
    ranks = global_ranks or range(size)
    c10d._world.pg_group_ranks[pg] = {g: r for r, g in enumerate(ranks)}
    return pg
