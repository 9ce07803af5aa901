"""zipccl.Calibrator: a table per tensor key (a layer's weights, activations, gradients), fitted
on the key's first N observations and then fixed, as the QLC paper calibrates on 100-200 warm-up
samples and keeps one table per layer.

    cal = zipccl.Calibrator(steps=100)
    for step in range(warmup):
        cal.observe("layer3.ffn1", x)          # accumulates the symbol histogram
    c = cal.compress("layer3.ffn1", x)         # the key's table once calibrated, else the default
    cal.save("tables.json")                    # one file per model (golden/tablefile.py)
    cal = zipccl.Calibrator.load("tables.json")

Symbols are the FP8 byte, or the exponent field of BF16/FP16/FP32 (golden/formats.py), counted
over the whole tensor; the table is golden.builders.best_table of the sum (the exhaustive
search), built once when the key's N-th observation arrives. On CUDA each observation reads its
histogram back (one host sync): calibration is meant for warm-up steps, and stops at N.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from zipccl import codec
from zipccl.golden import builders, tablefile
from zipccl.golden.codebook import ALPHABET, Codebook
from zipccl.golden.container import DEFAULT_BLOCK
from zipccl.golden.formats import FloatFormat
from zipccl.golden.tablefile import Entry, check_key

DEFAULT_STEPS = 100


@dataclass
class _Counts:
    """A key still calibrating: its format, the summed histogram and how many observations."""

    fmt: FloatFormat
    hist: np.ndarray
    seen: int = 0


class Calibrator:
    """Per-key tables fitted on each key's first ``steps`` observations, then fixed.

    A key names one tensor of the model (a layer's weights, activations or gradients). Each
    :meth:`observe` adds the tensor's symbol histogram -- the FP8 byte, or the exponent field of
    BF16/FP16/FP32, over every value -- to the key's sum; the ``steps``-th builds the key's table,
    golden.builders.best_table of the sum (the exhaustive search, named after the key), and later
    observations are ignored. :meth:`compress` codes with the key's table once it has one, else
    with the default table. :meth:`save` / :meth:`load` keep the tables in one JSON table set
    (golden/tablefile.py) that ``python -m zipccl.hw.generate --table`` can also read per entry.

    On CUDA every observation copies its histogram to the host (one sync): calibration is meant
    for warm-up steps, and stops at ``steps``.

    Args:
        steps (int, optional): observations per key before its table is built (at least 1;
            default ``DEFAULT_STEPS`` = 100).

    Raises:
        TypeError: ``steps`` is not an int.
        ValueError: ``steps`` is less than 1.

    Example::

        >>> cal = zipccl.Calibrator(steps=2)
        >>> for _ in range(2):
        ...     cal.observe("layer3.ffn1", torch.randn(4096).to(torch.float8_e4m3fn))
        >>> cal.calibrated("layer3.ffn1")
        True
        >>> c = cal.compress("layer3.ffn1", torch.randn(4096).to(torch.float8_e4m3fn))
        >>> c.table == cal.table("layer3.ffn1")
        True
        >>> cal.save("tables.json")
        >>> zipccl.Calibrator.load("tables.json").tables() == cal.tables()
        True
    """

    def __init__(self, steps: int = DEFAULT_STEPS) -> None:
        if isinstance(steps, bool) or not isinstance(steps, int):
            raise TypeError(f"steps must be an int, got {type(steps).__name__}")
        if steps < 1:
            raise ValueError(f"steps must be at least 1, got {steps}")
        self.steps = steps
        self._counts: dict[str, _Counts] = {}
        self._tables: dict[str, Entry] = {}

    def observe(self, key: str, tensor: torch.Tensor) -> None:
        """Add ``tensor``'s symbol histogram to ``key``'s; the ``steps``-th builds its table.

        A no-op (after the checks) once the key is calibrated. The first observation fixes the
        key's dtype. On CUDA one host sync (the histogram).

        Args:
            key (str): 1 to 256 characters.
            tensor (Tensor): ``bfloat16``, ``float16``, ``float32``, ``float8_e4m3fn`` or
                ``float8_e5m2``, the key's dtype; any shape, any device.

        Raises:
            TypeError: ``key`` is not a str; ``tensor`` is not a tensor, not of the five dtypes,
                or not of the dtype the key was first seen with.
            ValueError: ``key`` is empty or longer than 256 characters.
        """
        fmt = self._format(key, tensor)
        if key in self._tables:
            return
        counts = self._counts.setdefault(key, _Counts(fmt, np.zeros(ALPHABET, np.int64)))
        counts.hist += codec._histogram(codec._symbols(tensor, fmt))
        counts.seen += 1
        if counts.seen == self.steps:
            hist = codec._nonempty(counts.hist)
            self._tables[key] = Entry(fmt, builders.best_table(hist, name=key))
            del self._counts[key]

    def calibrated(self, key: str) -> bool:
        """Whether ``key`` has its table (observed ``steps`` times, or loaded).

        Args:
            key (str): 1 to 256 characters (TypeError, ValueError otherwise).

        Returns:
            bool
        """
        return check_key(key) in self._tables

    def table(self, key: str) -> Codebook:
        """The key's table.

        Args:
            key (str): a key.

        Returns:
            golden.codebook.Codebook: the table :meth:`compress` codes the key's tensors with.

        Raises:
            ValueError: the key is not calibrated yet (the message says how many of ``steps``
                observations it has), or is not 1 to 256 characters.
            TypeError: ``key`` is not a str.
        """
        if self.calibrated(key):
            return self._tables[key].table
        seen = self._counts[key].seen if key in self._counts else 0
        raise ValueError(f"key {key!r} is not calibrated: {seen} of {self.steps} observations")

    def tables(self) -> dict[str, Codebook]:
        """Every calibrated key's table, in the order the keys were calibrated (or loaded).

        Returns:
            dict[str, golden.codebook.Codebook]: a new dict; keys still counting are absent.
        """
        return {k: e.table for k, e in self._tables.items()}

    def compress(
        self, key: str, tensor: torch.Tensor, *, block: int = DEFAULT_BLOCK
    ) -> codec.Compressed:
        """:func:`zipccl.compress` with the key's table once calibrated, else the default table.

        Does not observe ``tensor``: call :meth:`observe` for that. The codec's settings
        (``ZIPCCL_BACKEND``, ``ZIPCCL_FAST``) apply as in :func:`zipccl.compress`.

        Args:
            key (str): a key (need not be known yet).
            tensor (Tensor): the key's dtype once it has been observed, else any of the five.
            block (int, optional): a power of two in [64, 1 << 20]; default 4096.

        Returns:
            zipccl.Compressed: as :func:`zipccl.compress` returns it.

        Raises:
            TypeError: as :meth:`observe`, and as :func:`zipccl.compress`.
            ValueError: a bad key or ``block``, as :meth:`observe` and :func:`zipccl.compress`.
        """
        self._format(key, tensor)
        entry = self._tables.get(key)
        return codec.compress(tensor, entry.table if entry else None, block=block)

    def save(self, path: str | Path) -> None:
        """Write the calibrated keys' tables as one JSON table set (golden/tablefile.py).

        Keys still counting are left out; :meth:`load` reads the file back, table for table.

        Args:
            path (str or Path): the file to write (replaced if it exists).

        Raises:
            zipccl.golden.codebook.TableError: (a ValueError) more than 4096 tables, or a file over
                32 MiB.
            OSError: the file cannot be written.
        """
        tablefile.save(path, self._tables)

    @classmethod
    def load(cls, path: str | Path, steps: int = DEFAULT_STEPS) -> Calibrator:
        """A calibrator holding a saved table set; new keys calibrate over ``steps``.

        Args:
            path (str or Path): a file :meth:`save` wrote.
            steps (int, optional): observations per new key; default 100.

        Returns:
            Calibrator: every key in the file calibrated, with its table and dtype.

        Raises:
            zipccl.golden.codebook.TableError: (a ValueError) the file is malformed, too large or of
                another format or version (parsed strictly: golden/tablefile.py).
            OSError: the file cannot be read.
            TypeError, ValueError: a bad ``steps``, as for the constructor.
        """
        out = cls(steps)
        out._tables = tablefile.load(path)
        return out

    def _format(self, key: str, tensor: torch.Tensor) -> FloatFormat:
        """The tensor's format, which must be the one the key was first seen with."""
        check_key(key)
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"expected a torch.Tensor, got {type(tensor).__name__}")
        fmt = codec._fmt(tensor.dtype)
        known = self._tables.get(key) or self._counts.get(key)
        if known is not None and known.fmt != fmt:
            raise TypeError(f"key {key!r} holds {known.fmt.name} tensors, got {fmt.name}")
        return fmt
