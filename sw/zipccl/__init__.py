"""zipccl: lossless compression of LLM-training tensors and compressed collectives.

The codec (:mod:`zipccl.codec`) writes golden/container.py buffers on CPU or CUDA; the collectives
(:mod:`zipccl.collectives`) have torch.distributed's signatures, on NCCL, on gloo and for CUDA
tensors on gloo (staged through pinned host memory); :mod:`zipccl.offload` moves tensors and
saved activations to host memory compressed; :mod:`zipccl.hooks` plugs the collectives
into DDP and FSDP2; :class:`Calibrator` (:mod:`zipccl.calibration`) fits a table per layer;
importing the package, before or after torch, registers the ``zipccl`` torch.distributed backend
(:mod:`zipccl.backend`), through which unchanged training code reaches the collectives; the
``zipccl-run`` launcher (:mod:`zipccl.run`) makes a script's own gloo and NCCL groups zipccl
ones without an edit. :func:`stats` reports what zipccl did (:mod:`zipccl.accounting`).

Every public name documents its dtypes, arguments, result, exceptions and settings
(``help(zipccl.compress)``). The codec codes ``torch.bfloat16``, ``float16``, ``float32``,
``float8_e4m3fn`` and ``float8_e5m2``; the collectives take any dtype and compress those five.

Settings, environment variables parsed in :mod:`zipccl.settings`:

* the codec's kernels (same bytes whichever): ``ZIPCCL_BACKEND`` (``auto`` | ``torch`` |
  ``triton``) and ``ZIPCCL_FAST`` (``0`` turns off the CUDA kernels' byte-escape fast path);
* what the collectives put on the wire, agreed across a group's ranks before its first zipccl
  call: ``ZIPCCL_MODE`` (``auto`` | ``always`` | ``never``), ``ZIPCCL_VERIFY`` (``auto`` | ``1``
  | ``0``), ``ZIPCCL_CHUNK_BYTES``, ``ZIPCCL_NATIVE_REDUCE`` (reductions only),
  ``ZIPCCL_PLAN_CALLS``, ``ZIPCCL_CHECKSUM`` (``1``: compressed pieces carry a values
  checksum, checked by the receiver) and ``ZIPCCL_CUDA_TRANSPORT`` (``auto`` | ``nccl`` |
  ``gloo``: what moves a ``zipccl`` group's CUDA tensors; gloo stages them through pinned host
  memory, as zipccl does for CUDA tensors on any gloo group);
* ``ZIPCCL_LOG`` (``off`` | ``summary`` | ``calls``): the :func:`stats` report printed at exit,
  and one line per call with the reason a call stayed native (:mod:`zipccl.accounting`);
* ``ZIPCCL_CACHE_DIR``: where the CUDA kernels' build and the switch's profiles are cached
  (default ``~/.cache/zipccl``).

``zipccl.golden`` (the NumPy reference model, the folder golden/), ``zipccl.hw`` (the Amaranth
RTL, hw/) and ``zipccl.sim`` (its testbenches, sim/) need no torch: zipccl's own names load on
first use, or at once when torch is imported already, so importing those does not import torch
(the backend then registers when torch.distributed is imported: :mod:`zipccl._register`).
"""

import importlib
import sys
from typing import TYPE_CHECKING

from zipccl import _register

_register.register_when_torch_loads()  # now, or as soon as torch.distributed is imported

if TYPE_CHECKING or sys.modules.get("torch") is not None:  # torch loaded: load the names now
    from zipccl._public import *  # noqa: F403
if TYPE_CHECKING:
    from zipccl._fsdp2 import FSDP2_HOOKS, ZipAllGather, ZipReduceScatter

#  zipccl._fsdp2's names: loaded on first use only, since importing FSDP pins the default group
_FSDP2 = ("FSDP2_HOOKS", "ZipAllGather", "ZipReduceScatter")

__all__ = [
    "FSDP2_HOOKS",
    "ActivationOffload",
    "Calibrator",
    "CollectiveMismatchError",
    "Compressed",
    "HostCopy",
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
    "offload_activations",
    "offload_tensor",
    "reduce_scatter_tensor",
    "reference_reduce",
    "reset_stats",
    "stats",
]


def __getattr__(name: str) -> object:
    """A public name on first use: the torch-based modules load, the backend registers."""
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        public = importlib.import_module("zipccl._fsdp2" if name in _FSDP2 else "zipccl._public")
    except ModuleNotFoundError as exc:
        if exc.name != "torch":
            raise
        raise ModuleNotFoundError(
            f"zipccl.{name} needs PyTorch, which is not installed. Install torch first -- on a "
            "CPU machine `python -m pip install torch==2.13.0 --index-url "
            "https://download.pytorch.org/whl/cpu`, on a CUDA machine the build for its CUDA "
            '(README, "Install") -- then `python -m pip install "zipccl[torch]"`. '
            "zipccl.golden, zipccl.hw and zipccl.sim work without it.",
            name="torch",
        ) from exc
    names = _FSDP2 if name in _FSDP2 else [n for n in __all__ if n not in _FSDP2]
    globals().update({n: getattr(public, n) for n in names})
    return globals()[name]
