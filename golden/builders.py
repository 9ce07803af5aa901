"""Table builders: complete region codes (``Codebook``) from a 256-bin symbol histogram.

Every builder ranks the symbols by frequency (most frequent first, ties to the smaller symbol) and
fills the ranked regions in prefix order, so the only real choice is the width vector. Unseen
symbols are always coded (ranked capacity covers all 256, or a literal escape region exists).

* :func:`best_table` -- exhaustive search for the least expected code length.
* :func:`qlc_heuristic` -- the QLC paper's ``optimize_zones`` rule mapped to widths {3,4,5,8}.
* :func:`qlc_dynamic` -- the paper's variant for a dominant symbol: a w=1 head for the top 2,
  then six w=5 middles (the paper's layout read literally), or ``middle=None``: the best
  3/4/5 middles.
* :func:`zipccl_histogram_table` -- the ZipCCL exponent layout with the measured top 7.
* :func:`staircase_table` -- the fast builder: the best of a fixed family of 666 staircase
  layouts (:func:`staircase_layouts`), the FP8 default of zipccl's CPU path.

Tables from theory (no histogram) live in :mod:`golden.theory`.

Reading of ``optimize_zones`` (QLC paper, section 6.2). The paper's function walks the
frequency-sorted histogram and closes a zone once the zone holds >= 2 % of the total mass, with at
most ``max_zones = 8`` zones. As printed it has an off-by-one (after 7 zones it appends every
remaining index as a new zone) and it returns zone boundaries, not widths. Its intent, read
together with the paper's fixed payload widths 3/4/5/8 (code lengths 6/7/8/11) and its decoder (the
11-bit codes carry the byte itself), is implemented here as:

1. a zone starts at the first unassigned rank and needs ``n`` symbols to reach 2 % of the mass;
2. its width is the smallest allowed middle width (3, 4 or 5) with ``2**w >= n``; the zone then
   takes ``2**w`` symbols, since symbols in the same region cost the same bits, so filling the
   region's capacity is free;
3. after 7 zones, or once a zone would need more than ``2**5`` symbols (the tail is too flat for
   a short code to pay), the rest go to the last region, an 8-bit literal escape (11-bit codes).

:func:`optimize_zones` is the paper's function itself with the off-by-one fixed (zone end indices,
no capacity rounding), kept so the reading above can be compared with the original.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from itertools import combinations_with_replacement

import numpy as np
from zipccl.golden.codebook import ALPHABET, MAX_WIDTH, NUM_REGIONS, PREFIX_BITS, Codebook
from zipccl.golden.theory import ZIPCCL_TOP, top_symbols, zipccl_layout

ZONE_THRESHOLD = 0.02  # the paper's "each zone holds at least 2 % of the mass"
QLC_MIDDLE_WIDTHS = (3, 4, 5)  # plus the 8-bit escape: code lengths 6/7/8/11
DYNAMIC_HEAD_WIDTH = 1  # the 2 most frequent symbols get 4-bit codes
DYNAMIC_MIDDLE_WIDTH = 5  # middle regions widened from 8 to 32 symbols


def check_histogram(hist: np.ndarray) -> np.ndarray:
    """A 256-bin histogram of non-negative integer counts with at least one count, as int64."""
    h = np.asarray(hist)
    if h.shape != (ALPHABET,):
        raise ValueError(f"a histogram has {ALPHABET} bins, got shape {h.shape}")
    if not (np.issubdtype(h.dtype, np.number) or np.issubdtype(h.dtype, np.bool_)):
        raise TypeError(f"histogram counts must be numbers, got dtype {h.dtype}")
    is_int = np.issubdtype(h.dtype, np.integer) or np.issubdtype(h.dtype, np.bool_)
    if not is_int and (not np.all(np.isfinite(h)) or np.any(h != np.round(h))):
        raise ValueError("histogram counts must be finite integers")
    h = h.astype(np.int64)
    if (h < 0).any():
        raise ValueError("histogram counts must be non-negative")
    if h.sum() == 0:
        raise ValueError("histogram is empty: no symbol has a count")
    return h


def ranks_by_frequency(hist: np.ndarray) -> list[int]:
    """All 256 symbols, most frequent first; ties go to the smaller symbol."""
    return top_symbols(check_histogram(hist), ALPHABET)


def _sorted_counts(hist: np.ndarray) -> tuple[list[int], np.ndarray]:
    """(ranks, cum) where cum[k] is the count of the k most frequent symbols (cum[0] = 0)."""
    h = check_histogram(hist)
    order = np.lexsort((np.arange(ALPHABET), -h))  # top_symbols' order, without a Python sort
    return order.tolist(), np.concatenate([[0], np.cumsum(h[order])])


def _book(widths: Iterable[int], literal: int | None, order: list[int], name: str) -> Codebook:
    """A codebook whose ranked regions take the most frequent symbols up to their capacity."""
    widths = tuple(widths)
    cap = sum(1 << w for p, w in enumerate(widths) if p != literal)
    return Codebook(widths, literal, tuple(order[: min(cap, ALPHABET)]), name=name)


# --------------------------------------------------------------------------- exhaustive search
@functools.cache
def _candidates(allowed: tuple[int, ...], literal: bool, head: tuple[int, ...]) -> np.ndarray:
    """Width vectors of the ranked regions (one row each): ``head``, then non-decreasing widths.

    Expected length does not depend on region order (the most frequent symbols always go to the
    narrowest regions, by the rearrangement inequality), so only multisets of widths need trying:
    C(16, 8) = 12,870 vectors instead of 9**8 = 43 M. Ranked-only vectors must hold all 256 symbols.
    """
    k = NUM_REGIONS - (1 if literal else 0) - len(head)
    rows = np.array(list(combinations_with_replacement(allowed, k)), np.int64).reshape(-1, k)
    rows = np.concatenate([np.tile(np.asarray(head, np.int64), (len(rows), 1)), rows], axis=1)
    if not literal:
        rows = rows[(1 << rows).sum(axis=1) >= ALPHABET]
    rows.flags.writeable = False  # cached: shared by every call
    return rows


def _costs(rows: np.ndarray, cum: np.ndarray, literal: bool) -> np.ndarray:
    """Total code bits of each width vector (sorted ascending) under the cumulative counts."""
    ends = np.minimum(np.cumsum(1 << rows, axis=1), ALPHABET)
    starts = np.concatenate([np.zeros((len(rows), 1), np.int64), ends[:, :-1]], axis=1)
    bits = ((PREFIX_BITS + rows) * (cum[ends] - cum[starts])).sum(axis=1)
    if literal:
        bits += (PREFIX_BITS + MAX_WIDTH) * (cum[-1] - cum[ends[:, -1]])
    return bits


def best_table(
    hist: np.ndarray,
    widths: Iterable[int] = range(MAX_WIDTH + 1),
    literal: bool | None = None,
    head: Iterable[int] = (),
    name: str = "best",
) -> Codebook:
    """The table of least expected code length, by exhaustive search over width vectors.

    ``widths`` restricts the ranked regions' widths (e.g. ``(3, 4, 5, 8)`` for the QLC paper's
    lengths); ``literal`` forces (True) or forbids (False) an escape region, None tries both;
    ``head`` fixes the first regions' widths (they take the most frequent symbols), e.g. ``(1,)``
    for the dynamic variant. The search is exact (integer bit totals); ties keep the ranked-only,
    lexicographically smallest vector. Ranked regions after the head are emitted narrowest first;
    the escape, if any, is prefix 7.
    """
    allowed = tuple(sorted({int(w) for w in widths}))
    head = tuple(int(w) for w in head)
    if not allowed or allowed[0] < 0 or allowed[-1] > MAX_WIDTH:
        raise ValueError(f"widths must be a non-empty subset of 0..{MAX_WIDTH}, got {allowed}")
    if len(head) >= NUM_REGIONS - 1 or not all(0 <= w <= MAX_WIDTH for w in head):
        raise ValueError(f"head must be at most {NUM_REGIONS - 2} widths in 0..{MAX_WIDTH}")
    order, cum = _sorted_counts(hist)
    best: tuple[int, tuple[int, ...], bool] | None = None
    for lit in {None: (False, True), False: (False,), True: (True,)}[literal]:
        rows = _candidates(allowed, lit, head)
        if len(rows) == 0:
            continue
        costs = _costs(rows, cum, lit)
        i = int(np.argmin(costs))
        if best is None or costs[i] < best[0]:
            best = (int(costs[i]), tuple(int(w) for w in rows[i]), lit)
    if best is None:
        raise ValueError(f"widths {allowed} cannot hold {ALPHABET} symbols without an escape")
    _, ranked, lit = best
    return _book(
        ranked + ((MAX_WIDTH,) if lit else ()), NUM_REGIONS - 1 if lit else None, order, name
    )


# --------------------------------------------------------------------------- the QLC heuristic
def _check_threshold(threshold: float) -> float:
    if not 0.0 < threshold <= 1.0:
        raise ValueError(f"zone threshold must be a mass fraction in (0, 1], got {threshold}")
    return float(threshold)


def _zone_size(cum: np.ndarray, start: int, need: float) -> int:
    """Symbols from rank ``start`` until their count reaches ``need`` (the rest if never)."""
    reach = int(np.searchsorted(cum, cum[start] + need, side="left"))
    return max(min(reach, ALPHABET) - start, 1)


def optimize_zones(
    hist: np.ndarray, max_zones: int = NUM_REGIONS, threshold: float = ZONE_THRESHOLD
) -> list[int]:
    """The paper's ``optimize_zones``: end ranks (exclusive) of zones over the sorted histogram.

    A zone closes once it holds >= ``threshold`` of the total mass; the last of ``max_zones``
    zones takes all remaining symbols (the printed code's off-by-one, which opened a zone per
    remaining symbol after the 7th, is fixed).
    """
    _, cum = _sorted_counts(hist)
    need = _check_threshold(threshold) * cum[-1]
    ends: list[int] = []
    start = 0
    while start < ALPHABET:
        size = ALPHABET - start if len(ends) == max_zones - 1 else _zone_size(cum, start, need)
        start += size
        ends.append(start)
    return ends


def qlc_heuristic(
    hist: np.ndarray,
    threshold: float = ZONE_THRESHOLD,
    middle: Iterable[int] = QLC_MIDDLE_WIDTHS,
    name: str = "qlc-heuristic",
) -> Codebook:
    """The QLC paper's zone heuristic as a table: see the module docstring for the reading."""
    middle = tuple(sorted(middle))
    order, cum = _sorted_counts(hist)
    need = _check_threshold(threshold) * cum[-1]
    widths: list[int] = []
    start = 0
    while len(widths) < NUM_REGIONS - 1 and start < ALPHABET:
        n = _zone_size(cum, start, need)
        fits = [w for w in middle if (1 << w) >= n]
        if not fits:
            break
        widths.append(fits[0])
        start += 1 << fits[0]
    unused = [0] * (NUM_REGIONS - 1 - len(widths))  # regions left over hold no rank: never emitted
    ranks = tuple(order[: min(start, ALPHABET)])
    return Codebook((*widths, *unused, MAX_WIDTH), NUM_REGIONS - 1, ranks, name=name)


def qlc_dynamic(
    hist: np.ndarray,
    head: int = DYNAMIC_HEAD_WIDTH,
    middle: int | None = DYNAMIC_MIDDLE_WIDTH,
    name: str = "qlc-dynamic",
) -> Codebook:
    """The paper's variant for a dominant symbol (zeros): the 2 most frequent symbols in a w=1
    region (4-bit codes), wider middle regions, and the 8-bit escape last.

    ``middle=5`` (default) is the paper's layout read literally: six w=5 regions, 8-bit codes
    for ranks 2..193.
    ``middle=None`` searches the six middle widths over the paper's 3/4/5 instead (exhaustively,
    as :func:`best_table` with the head fixed).
    """
    if middle is None:
        return best_table(hist, QLC_MIDDLE_WIDTHS, literal=True, head=(head,), name=name)
    order, _ = _sorted_counts(hist)
    widths = (head,) + (middle,) * (NUM_REGIONS - 2) + (MAX_WIDTH,)
    return _book(widths, NUM_REGIONS - 1, order, name)


def zipccl_histogram_table(hist: np.ndarray, name: str = "zipccl-histogram") -> Codebook:
    """The ZipCCL exponent layout (escape + 7 one-symbol regions) with the measured top 7."""
    return zipccl_layout(top_symbols(check_histogram(hist), ZIPCCL_TOP), name)


# --------------------------------------------------------------------------- the fast builder
STAIRCASE_STARTS = range(6)  # eight w=5 regions hold all 256 symbols at 8 bits: raw's cost


def _completing_width(head: tuple[int, ...]) -> int | None:
    """The narrowest width >= head[-1] for the last region that ranks all 256 symbols."""
    room = ALPHABET - sum(1 << w for w in head)
    fits = [w for w in range(head[-1], MAX_WIDTH + 1) if (1 << w) >= room]
    return fits[0] if fits else None


def _staircases(head: tuple[int, ...]) -> Iterable[tuple[int, ...]]:
    """Every layout that extends ``head``, in lexicographic order (rises tried smallest first)."""
    if len(head) == NUM_REGIONS - 1:
        last = _completing_width(head)
        if last is not None:
            yield (*head, last)
        return
    w = head[-1]
    for nxt in range(w, MAX_WIDTH + 1) if w == 0 else range(w, min(w + 1, MAX_WIDTH) + 1):
        yield from _staircases((*head, nxt))


@functools.cache
def staircase_layouts() -> np.ndarray:
    """The fixed family of :func:`staircase_table`: one ranked-only width vector per row.

    Regions 0..6 start at a width 0..5 and rise by 0 or 1 bit per region, except that a run of
    w=0 regions (one dominant symbol each: zero, -0) may rise by any amount; region 7 takes the
    narrowest width that ranks all 256 symbols (rows where even w=8 cannot are left out). No
    literal region: an escape costs 11 bits, as the ranked w=8 region it would replace does, so
    it never shortens a code. 666 rows, in lexicographic order; (5,)*8 is one of them (every
    code 8 bits), so the best row is never longer than raw.
    """
    rows = np.array([r for w in STAIRCASE_STARTS for r in _staircases((w,))], np.int64)
    rows.flags.writeable = False  # cached: shared by every call
    return rows


def staircase_table(hist: np.ndarray, name: str = "staircase") -> Codebook:
    """The table of least expected code length among :func:`staircase_layouts`.

    Cheap and deterministic, so that a device can build the same bytes: rank the symbols by
    count (ties to the smaller symbol), score every row by its exact integer bit total, take the
    first row of the least total. It lands within ~0.02 bit/symbol of :func:`best_table` on
    FP8 tensors, at a few hundred microseconds instead of the exhaustive search's 0.1-0.3 s.
    """
    order, cum = _sorted_counts(hist)
    rows = staircase_layouts()
    best = int(np.argmin(_costs(rows, cum, literal=False)))
    return _book((int(w) for w in rows[best]), None, order, name)
