"""The plan cache: what the later calls of one collective reuse from its first.

Training repeats the same calls every step. A call's *key* is its fingerprint on this rank --
the descriptor it would exchange (op, dtype, sizes and splits, table hash, mode, reduce op), the
device, whether it verifies, and the raw ``ZIPCCL_*`` settings -- and a key's first call runs
the full descriptor exchange. Once it has completed on every rank, each rank keeps a
:class:`Plan`: the call's agreed outcome (``collectives._slots.Agreed``: strategy, chunks, every
rank's table, and, for a compressed call, the payload size of every piece as the call's headers told
it), which the key's next call then uses instead of exchanging summaries and predicting.

The ranks must agree that they all run the same plan, without trusting that they do: a plan's
:attr:`Plan.tag` hashes what every rank shares about it -- the digest of the exchange that made
it (every rank's descriptor row, gathered alike on every rank, and the exchange's number in its
group: every rank takes part in every exchange, so the count is alike however the ranks' caches
differ) and the calls it has served -- so equal tags on every rank mean one plan in one state.
collectives._agree.agree sends the tag where a sample summary would go, and exchanges afresh
when the tags differ.

``ZIPCCL_PLAN_CALLS`` (agreed like the other settings; default 64) is how many calls a plan
serves before its key is agreed afresh (new tables from a fresh sample; 0: no plans).
"""

from __future__ import annotations

import hashlib
import struct
import weakref
from dataclasses import dataclass, field, replace
from typing import Any

from zipccl import settings

MAX_PLANS = 1024  # per group; the least recently used go first


@dataclass(frozen=True)
class Plan:
    """One key's agreed outcome as its last call left it (immutable: each call makes the next)."""

    key: tuple
    digest: int  # of the exchange that made it
    uses: int  # calls served
    agreed: Any  # collectives._slots.Agreed, with the last call's measured piece sizes

    @property
    def tag(self) -> int:
        """A non-zero int64 that every rank computes alike for this plan in this state."""
        return _hash(struct.pack("<qq", self.digest, self.uses)) or 1


@dataclass(frozen=True)
class Ticket:
    """What a call needs to keep its outcome: its group and key, and either the plan it ran on
    (``previous``) or the digest of the exchange it ran (a first call)."""

    group: object
    key: tuple
    previous: Plan | None = None
    digest: int = 0


@dataclass
class _Book:
    plans: dict[tuple, Plan] = field(default_factory=dict)
    exchanges: int = 0  # descriptor exchanges the group has run: alike on every rank


#  a group's token (zipccl._groups.key) -> its plans; held weakly: they go with the group
_BOOKS: weakref.WeakKeyDictionary[object, _Book] = weakref.WeakKeyDictionary()


def find(group: object, key: tuple) -> Plan | None:
    """``key``'s plan in ``group``, if the cache is on and the plan has calls left."""
    limit = settings.value("ZIPCCL_PLAN_CALLS")
    book = _BOOKS.get(group)
    plan = book.plans.get(key) if book is not None and limit else None
    return plan if plan is not None and plan.uses < limit else None


def exchanged(group: object) -> int:
    """Count one descriptor exchange of ``group`` (before it starts); the count so far."""
    book = _BOOKS.get(group)
    if book is None:  # (not setdefault: every call would build a book to throw away)
        book = _BOOKS[group] = _Book()
    book.exchanges += 1
    return book.exchanges


def digest(count: int, rows: bytes) -> int:
    """The digest of the ``count``-th exchange of a group, whose gathered rows are ``rows``."""
    return _hash(struct.pack("<q", count) + rows)


def _hash(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little", signed=True)


def keep(ticket: Ticket, agreed: Any) -> None:
    """Record that every rank completed the call of ``ticket`` with outcome ``agreed``: the next
    plan of its key (a new one after a first call), dropped once it has served its calls.

    Every rank must call it at the same calls -- after the call's last agreement -- so that the
    uses stay alike (where they do not, the tags differ and the ranks exchange afresh)."""
    limit = settings.value("ZIPCCL_PLAN_CALLS")
    if not limit:
        return
    book = _BOOKS.setdefault(ticket.group, _Book())
    if ticket.previous is None:
        plan = Plan(ticket.key, ticket.digest, 1, agreed)
    else:
        plan = replace(ticket.previous, uses=ticket.previous.uses + 1, agreed=agreed)
    book.plans.pop(ticket.key, None)
    if plan.uses >= limit:
        return
    book.plans[ticket.key] = plan
    if len(book.plans) > MAX_PLANS:
        del book.plans[next(iter(book.plans))]


def drop(ticket: Ticket) -> None:
    """Forget the plan of ``ticket``'s key: its next call is agreed afresh. Every rank must call
    it at the same call, as :func:`keep`."""
    book = _BOOKS.get(ticket.group)
    if book is not None:
        book.plans.pop(ticket.key, None)


def forget() -> None:
    """Drop every plan (the switch's profile changed: strategies and chunks may too); the
    exchange counts stay."""
    for book in _BOOKS.values():
        book.plans.clear()
