"""zipccl's public names, which need torch; ``zipccl/__init__.py`` loads them on first use
(and registers the ``zipccl`` torch.distributed backend: :mod:`zipccl._register`)."""

from zipccl.accounting import reset_stats, stats
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
from zipccl.hooks import ddp_hook
from zipccl.offload import ActivationOffload, HostCopy, offload_activations, offload_tensor
