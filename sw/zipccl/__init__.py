"""zipccl: lossless compression of LLM-training tensors and compressed collectives.

The codec (:mod:`zipccl.codec`) writes golden/container.py buffers on CPU or CUDA; the collectives
(:mod:`zipccl.collectives`) have torch.distributed's signatures; :mod:`zipccl.hooks` plugs them
into DDP and FSDP2; :class:`Calibrator` (:mod:`zipccl.calibration`) fits a table per layer;
importing the package registers the ``zipccl`` torch.distributed backend
(:mod:`zipccl.backend`), through which unchanged training code reaches the collectives.

Every public name documents its dtypes, arguments, result, exceptions and settings
(``help(zipccl.compress)``). The codec codes ``torch.bfloat16``, ``float16``, ``float32``,
``float8_e4m3fn`` and ``float8_e5m2``; the collectives take any dtype and compress those five.

Settings, environment variables parsed in :mod:`zipccl.settings`:

* the codec's kernels (same bytes whichever): ``ZIPCCL_BACKEND`` (``auto`` | ``torch`` |
  ``triton``) and ``ZIPCCL_FAST`` (``0`` turns off the CUDA kernels' BF16 fast path);
* what the collectives put on the wire, agreed across a group's ranks before its first zipccl
  call: ``ZIPCCL_MODE`` (``auto`` | ``always`` | ``never``), ``ZIPCCL_VERIFY`` (``auto`` | ``1``
  | ``0``), ``ZIPCCL_CHUNK_BYTES``, ``ZIPCCL_NATIVE_REDUCE`` (reductions only),
  ``ZIPCCL_PLAN_CALLS`` and ``ZIPCCL_CHECKSUM`` (``1``: compressed pieces carry a values
  checksum, checked by the receiver);
* ``ZIPCCL_CACHE_DIR``: where the CUDA kernels' build and the switch's profiles are cached
  (default ``~/.cache/zipccl``).
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
