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

from golden import builders, tablefile
from golden.codebook import ALPHABET, Codebook
from golden.container import DEFAULT_BLOCK
from golden.formats import FloatFormat
from golden.tablefile import Entry, check_key
from zipccl import codec

DEFAULT_STEPS = 100


@dataclass
class _Counts:
    """A key still calibrating: its format, the summed histogram and how many observations."""

    fmt: FloatFormat
    hist: np.ndarray
    seen: int = 0


class Calibrator:
    """Per-key tables from the first ``steps`` observations; see the module docstring."""

    def __init__(self, steps: int = DEFAULT_STEPS) -> None:
        if isinstance(steps, bool) or not isinstance(steps, int):
            raise TypeError(f"steps must be an int, got {type(steps).__name__}")
        if steps < 1:
            raise ValueError(f"steps must be at least 1, got {steps}")
        self.steps = steps
        self._counts: dict[str, _Counts] = {}
        self._tables: dict[str, Entry] = {}

    def observe(self, key: str, tensor: torch.Tensor) -> None:
        """Count ``tensor``'s symbols under ``key``; a no-op once the key is calibrated."""
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
        return check_key(key) in self._tables

    def table(self, key: str) -> Codebook:
        """The key's table (ValueError before its ``steps``-th observation)."""
        if self.calibrated(key):
            return self._tables[key].table
        seen = self._counts[key].seen if key in self._counts else 0
        raise ValueError(f"key {key!r} is not calibrated: {seen} of {self.steps} observations")

    def tables(self) -> dict[str, Codebook]:
        """Every calibrated key's table, in the order the keys were calibrated (or loaded)."""
        return {k: e.table for k, e in self._tables.items()}

    def compress(self, key: str, tensor: torch.Tensor, *,
                 block: int = DEFAULT_BLOCK) -> codec.Compressed:
        """zipccl.compress with the key's table once calibrated, else the default table."""
        self._format(key, tensor)
        entry = self._tables.get(key)
        return codec.compress(tensor, entry.table if entry else None, block=block)

    def save(self, path: str | Path) -> None:
        """Write the calibrated keys' tables as one table set (keys still counting are left out)."""
        tablefile.save(path, self._tables)

    @classmethod
    def load(cls, path: str | Path, steps: int = DEFAULT_STEPS) -> Calibrator:
        """A calibrator holding a saved table set; new keys calibrate over ``steps``."""
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
