"""zipccl: lossless compression of LLM-training tensors and compressed collectives.

The codec (:mod:`zipccl.codec`) writes golden/container.py buffers on CPU or CUDA; the collectives
(:mod:`zipccl.collectives`) have torch.distributed's signatures; :mod:`zipccl.hooks` plugs them
into DDP and FSDP2; :class:`Calibrator` (:mod:`zipccl.calibration`) fits a table per layer;
importing the package registers the ``zipccl`` torch.distributed backend
(:mod:`zipccl.backend`), through which unchanged training code reaches the collectives.
"""

from zipccl.backend import ProcessGroupZipccl
from zipccl.calibration import Calibrator
from zipccl.codec import (
    Compressed,
    check_errors,
    compress,
    compress_into,
    decompress,
    default_table,
    fixed_part_bytes,
    histogram_table,
    max_compressed_bytes,
)
from zipccl.collectives import (
    CollectiveMismatchError,
    PeerError,
    all_gather,
    all_gather_into_tensor,
    all_reduce,
    all_reduce_strategy,
    all_to_all_single,
    broadcast,
    reduce_scatter_tensor,
    reference_reduce,
)
from zipccl.hooks import FSDP2_HOOKS, ZipAllGather, ZipReduceScatter, ddp_hook

__all__ = [
    "FSDP2_HOOKS",
    "Calibrator",
    "CollectiveMismatchError",
    "Compressed",
    "PeerError",
    "ProcessGroupZipccl",
    "ZipAllGather",
    "ZipReduceScatter",
    "all_gather",
    "all_gather_into_tensor",
    "all_reduce",
    "all_reduce_strategy",
    "all_to_all_single",
    "broadcast",
    "check_errors",
    "compress",
    "compress_into",
    "ddp_hook",
    "decompress",
    "default_table",
    "fixed_part_bytes",
    "histogram_table",
    "max_compressed_bytes",
    "reduce_scatter_tensor",
    "reference_reduce",
]
