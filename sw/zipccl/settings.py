"""The ZIPCCL_* settings that decide what a collective puts on the wire, parsed in one place and
agreed across a group's ranks.

Ranks that disagree on one of them would run different protocols -- one compressing, one not;
one exchanging a descriptor, one calling torch straight away; different chunk counts -- and abort
or hang inside the transport. So every group agrees on them once, before its first zipccl call:
each rank publishes its values, and every rank reads every rank's, so all raise the same
:class:`~zipccl.CollectiveMismatchError` within one round trip, naming each rank's value. A gloo
group agrees in one small all-gather of its own (:func:`agree_in`): a peer that is gone fails it
at once, where a store would wait out the group's timeout. An NCCL group, where a collective
would not notice a dead peer sooner, and the ``zipccl`` backend, when it creates a group, agree
through the group's store (:func:`agree`). Values are still read at every call (tests and
benchmarks change them between calls); a program that changes them must change them on every
rank between the same two calls.

Settings that leave the bytes on the wire unchanged are parsed here too but not agreed
(:data:`LOCAL_KEYS`: which kernels this process runs, what it logs); ``ZIPCCL_CACHE_DIR``, a
path, is read by zipccl._kernel_cache.
"""

from __future__ import annotations

import functools
import os
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from zipccl._errors import CollectiveMismatchError

MODES = ("auto", "always", "never")
VERIFY_POLICIES = ("auto", "1", "0")
KEYS = (
    "ZIPCCL_MODE",
    "ZIPCCL_VERIFY",
    "ZIPCCL_CHUNK_BYTES",
    "ZIPCCL_NATIVE_REDUCE",
    "ZIPCCL_PLAN_CALLS",
    "ZIPCCL_CHECKSUM",
    "ZIPCCL_CUDA_TRANSPORT",
    "ZIPCCL_LANES",
    "ZIPCCL_STRIPES",
)
CUDA_TRANSPORTS = ("auto", "nccl", "gloo")  # what moves a zipccl group's CUDA tensors
BACKENDS = ("auto", "torch", "triton")  # auto: the CUDA kernels on CUDA tensors, torch elsewhere
LOCAL_KEYS = ("ZIPCCL_BACKEND", "ZIPCCL_FAST", "ZIPCCL_LOG")  # same bytes on the wire whichever
LOGS = ("off", "summary", "calls")  # ZIPCCL_LOG: zipccl.accounting's report at exit / per call
MAX_STRIPES = 16  # ZIPCCL_STRIPES: gloo groups per staged group, each with its sockets and threads


@dataclass(frozen=True)
class Settings:
    """One rank's parsed settings (the defaults are the variables' unset values)."""

    mode: str = "auto"  # ZIPCCL_MODE: auto | always | never
    verify: str = "auto"  # ZIPCCL_VERIFY: auto | 1 | 0
    chunk_bytes: int | None = None  # ZIPCCL_CHUNK_BYTES; None: the mode's own choice
    native_reduce: bool = False  # ZIPCCL_NATIVE_REDUCE=1
    plan_calls: int = 64  # ZIPCCL_PLAN_CALLS: calls one plan serves (0: no plan cache)
    checksum: bool = False  # ZIPCCL_CHECKSUM=1: compressed pieces carry a values checksum
    cuda_transport: str = "auto"  # ZIPCCL_CUDA_TRANSPORT: the zipccl backend's inner CUDA group
    lanes: int = 8  # ZIPCCL_LANES: the backend's calls in flight on the staged transport (0: none)
    stripes: int = 4  # ZIPCCL_STRIPES: gloo groups one staged call's bytes cross at once


_ENV_DATA = getattr(os.environ, "_data", None) if os.name == "posix" else None
_RAW_KEYS = {k: k.encode() for k in (*KEYS, *LOCAL_KEYS)}


_ENCODED_KEYS = tuple(_RAW_KEYS[k] for k in KEYS)


def raw() -> tuple[object, ...]:
    """The variables' raw values (None where unset), e.g. for cache keys: as :func:`_raw` reads
    them, in one map over the environment's dict (no Python call per variable: every zipccl
    call reads them)."""
    if _ENV_DATA is None:
        return tuple(map(os.environ.get, KEYS))
    return tuple(map(_ENV_DATA.get, _ENCODED_KEYS))


def _raw(key: str) -> object:
    """On POSIX read from os.environ's own bytes dict: a plain dict lookup, several times
    cheaper than os.environ.get on a collective's hot path."""
    if _ENV_DATA is None:
        return os.environ.get(key)
    return _ENV_DATA.get(_RAW_KEYS[key])


def current() -> Settings:
    """This rank's settings now; ValueError naming the variable if one is malformed."""
    return Settings(*map(value, KEYS))


def value(key: str) -> Any:  # the field's type: str, bool, int or int | None by key
    """One setting's value now (a Settings field); ValueError naming it if malformed. Cheaper
    than :func:`current` where a call needs only one, and independent of the others."""
    return _parse(key, _raw(key))


@functools.lru_cache(maxsize=256)
def _parse(key: str, raw_value: object) -> Any:
    return _PARSERS[key](_text(raw_value))


def _text(value: object) -> str:
    """A raw value as lower-case text; bytes that are not UTF-8 (or a str that os.environ
    surrogate-escaped from them) become ``\\xff`` escapes, which no parser accepts: a
    ValueError naming the variable, never a UnicodeError."""
    if not isinstance(value, bytes):
        text = str(value or "")
        try:
            value = text.encode(errors="surrogateescape")
        except UnicodeEncodeError:  # a surrogate no byte maps to
            value = text.encode(errors="backslashreplace")
    return value.decode(errors="backslashreplace").strip().lower()


_MAX_DIGITS = 18  # < 2**63 and far below int()'s digit limit


def _count(key: str, value: str, what: str, least: int) -> int:
    """A decimal integer >= ``least`` in ASCII digits, else a ValueError naming ``key``."""
    if not (value.isascii() and value.isdigit() and len(value) <= _MAX_DIGITS):
        raise ValueError(f"{key} must be a {what} integer, got {value[:40]!r}")
    number = int(value)
    if number < least:
        raise ValueError(f"{key} must be a {what} integer, got {value!r}")
    return number


def _choice(key: str, value: str, allowed: tuple[str, ...]) -> str:
    """``value`` if allowed, the first choice (the default) if empty, else a ValueError."""
    if not value:
        return allowed[0]
    if value not in allowed:
        raise ValueError(f"{key} must be one of {allowed}, got {value!r}")
    return value


def _chunk_bytes(value: str) -> int | None:
    return _count("ZIPCCL_CHUNK_BYTES", value, "positive", 1) if value else None


def _lanes(value: str) -> int:
    if not value:
        return Settings.lanes
    return _count("ZIPCCL_LANES", value, "non-negative", 0)


def _stripes(value: str) -> int:
    if not value:
        return Settings.stripes
    stripes = _count("ZIPCCL_STRIPES", value, "positive", 1)
    if stripes > MAX_STRIPES:
        raise ValueError(f"ZIPCCL_STRIPES must be at most {MAX_STRIPES}, got {stripes}")
    return stripes


def _plan_calls(value: str) -> int:
    if not value:
        return Settings.plan_calls
    return _count("ZIPCCL_PLAN_CALLS", value, "non-negative", 0)


_PARSERS: dict[str, Callable[[str], object]] = {  # KEYS order: Settings' fields
    "ZIPCCL_MODE": lambda v: _choice("ZIPCCL_MODE", v, MODES),
    "ZIPCCL_VERIFY": lambda v: _choice("ZIPCCL_VERIFY", v, VERIFY_POLICIES),
    "ZIPCCL_CHUNK_BYTES": _chunk_bytes,
    "ZIPCCL_NATIVE_REDUCE": lambda v: _choice("ZIPCCL_NATIVE_REDUCE", v, ("0", "1")) == "1",
    "ZIPCCL_PLAN_CALLS": _plan_calls,
    "ZIPCCL_CHECKSUM": lambda v: _choice("ZIPCCL_CHECKSUM", v, ("0", "1")) == "1",
    "ZIPCCL_CUDA_TRANSPORT": lambda v: _choice("ZIPCCL_CUDA_TRANSPORT", v, CUDA_TRANSPORTS),
    "ZIPCCL_LANES": _lanes,
    "ZIPCCL_STRIPES": _stripes,
    "ZIPCCL_BACKEND": lambda v: _choice("ZIPCCL_BACKEND", v, BACKENDS),
    "ZIPCCL_FAST": lambda v: _choice("ZIPCCL_FAST", v, ("1", "0")) == "1",  # byte-escape fast path
    "ZIPCCL_LOG": lambda v: _choice("ZIPCCL_LOG", v, LOGS),
}


def _published(values: tuple[object, ...]) -> list[str]:
    """What a rank tells the others, one entry per key: the parsed value (so "Always" and
    "always" agree), or the raw text where it does not parse (so a malformed value on one rank is
    a mismatch every rank reports, not a ValueError on that rank alone)."""
    out = []
    for key, raw_value in zip(KEYS, values, strict=True):
        try:
            out.append(str(_parse(key, raw_value)))
        except ValueError:
            out.append(f"invalid {_text(raw_value)!r}")
    return out


_SEP = "\x1f"


def agree(store: dist.Store, rank: int, world: int) -> Settings:
    """Publish this rank's settings in ``store`` (a group's own) and check every rank's: the same
    CollectiveMismatchError on every rank where they differ, else this rank's settings.

    Every rank of the group must call it, once per agreement: the store's arrival counter numbers
    the rounds, so a group may agree again on the same store.
    """
    mine = _published(raw())
    round_no = (store.add("zipccl/settings/arrivals", 1) - 1) // world
    keys = [f"zipccl/settings/{round_no}/{r}" for r in range(world)]
    store.set(keys[rank], _SEP.join(mine))
    store.wait(keys)
    return _checked([value.decode().split(_SEP) for value in store.multi_get(keys)])


_WIDTH = 64  # bytes of a setting's published text in agree_in (a longer one: its start)


def agree_in(group: dist.ProcessGroup) -> Settings:
    """:func:`agree` in one all-gather of ``group`` (host tensors: gloo), every rank's text of
    each setting cut or padded to _WIDTH bytes. Every rank of the group must call it."""
    mine = b"".join(
        text.encode(errors="backslashreplace")[:_WIDTH].ljust(_WIDTH, b"\0")
        for text in _published(raw())
    )
    row = torch.frombuffer(bytearray(mine), dtype=torch.uint8)
    rows = [torch.empty_like(row) for _ in range(dist.get_world_size(group))]
    dist.all_gather(rows, row, group=group)
    return _checked(
        [
            [
                r.numpy().tobytes()[i : i + _WIDTH].rstrip(b"\0").decode(errors="replace")
                for i in range(0, len(mine), _WIDTH)
            ]
            for r in rows
        ]
    )


def _checked(ranks: list[list[str]]) -> Settings:
    """This rank's settings, if every rank published the same values (``ranks``: each rank's,
    KEYS order); else the same CollectiveMismatchError on every rank."""
    differ = [i for i in range(len(KEYS)) if len({values[i] for values in ranks}) > 1]
    if differ:
        what = "; ".join(
            f"{KEYS[i]} ("
            + ", ".join(f"rank {r}: {values[i]}" for r, values in enumerate(ranks))
            + ")"
            for i in differ
        )
        raise CollectiveMismatchError(f"zipccl: ranks disagree on {what}")
    return current()


#  groups whose ranks have agreed, held weakly: a group the script destroys is freed (_groups)
_AGREED: weakref.WeakSet[dist.ProcessGroup] = weakref.WeakSet()


def ensure_agreed(group: dist.ProcessGroup) -> None:
    """Agree on the settings in ``group`` (a group object, the default one included) unless its
    ranks have already: before a group's first zipccl call."""
    if group in _AGREED:
        return
    if "nccl" in str(dist.get_backend(group)).lower():
        store = dist.distributed_c10d._get_process_group_store(group)
        agree(store, dist.get_rank(group), dist.get_world_size(group))
    else:
        agree_in(group)
    _AGREED.add(group)


def mark_agreed(group: dist.ProcessGroup) -> None:
    """Record that ``group``'s ranks agreed elsewhere (the backend, for its inner groups)."""
    _AGREED.add(group)


__all__ = [
    "CUDA_TRANSPORTS",
    "KEYS",
    "MODES",
    "VERIFY_POLICIES",
    "Settings",
    "agree",
    "agree_in",
    "current",
    "ensure_agreed",
    "mark_agreed",
    "raw",
    "value",
]
