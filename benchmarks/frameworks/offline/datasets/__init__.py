"""A stand-in for Hugging Face ``datasets`` with just what torchtitan's text dataset calls --
``load_dataset`` of a local folder of JSON-lines files, ``Dataset`` (``len``, iteration,
``skip``, ``shard``) and ``distributed.split_dataset_by_node`` -- for the GPU machine, which has
no internet and no ``datasets``: the real one needs pyarrow, alone larger than every other
wheel the torchtitan run carries (``benchmarks/frameworks/torchtitan_h200.py`` puts this folder
on the workers' path only where ``import datasets`` fails). Same rows, same order, same split
as the real library's map-style dataset."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any


class Dataset:
    """Rows (dicts) in file order."""

    def __init__(self, rows: Sequence[dict[str, Any]]) -> None:
        self._rows = list(rows)

    def __len__(self) -> int:
        return len(self._rows)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self._rows)

    def skip(self, n: int) -> Dataset:
        return Dataset(self._rows[n:])

    def shard(self, num_shards: int, index: int, contiguous: bool = True) -> Dataset:
        """The real ``Dataset.shard``: contiguous blocks, the first ``len % num_shards`` one
        row longer (or every ``num_shards``-th row from ``index``)."""
        if not contiguous:
            return Dataset(self._rows[index::num_shards])
        size, extra = divmod(len(self._rows), num_shards)
        start = index * size + min(index, extra)
        return Dataset(self._rows[start : start + size + (index < extra)])


def load_dataset(path: str, name: str | None = None, split: str = "train", **_: Any) -> Dataset:
    """Every row of the ``*.json`` / ``*.jsonl`` files (JSON lines) in folder ``path``, files in
    name order; ``name`` and ``split`` are accepted and ignored (one split per folder)."""
    files = sorted(p for p in Path(path).iterdir() if p.suffix in (".json", ".jsonl"))
    if not files:
        raise FileNotFoundError(f"no .json or .jsonl files in {path!r}")
    return Dataset([json.loads(line) for f in files for line in f.open() if line.strip()])
