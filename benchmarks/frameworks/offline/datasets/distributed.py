"""``datasets.distributed.split_dataset_by_node`` for the stand-in's map-style Dataset."""

from __future__ import annotations

from . import Dataset


def split_dataset_by_node(dataset: Dataset, rank: int, world_size: int) -> Dataset:
    """Rank ``rank``'s contiguous share, as the real library splits a map-style dataset."""
    return dataset.shard(num_shards=world_size, index=rank, contiguous=True)
