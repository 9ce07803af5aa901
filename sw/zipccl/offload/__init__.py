"""Compressed offload to host memory: tensors and saved activations moved over PCIe coded.

:func:`offload_tensor` compresses a tensor on its device (the codec, :mod:`zipccl.codec`) and
copies only the compressed bytes into host memory; :meth:`HostCopy.load` copies them back and
decompresses. :func:`offload_activations` does that to the tensors autograd saves for backward
(``torch.autograd.graph.saved_tensors_hooks``), bringing them back ahead of the backward pass.

How a CUDA tensor travels (docs/offload.md has the whole story):

* down: the caller's thread queues, on the caller's stream, the compression of each chunk of the
  tensor (``chunk_bytes``) into a device buffer and, where a tensor of the same kind (dtype, size,
  chunking) went down before, the chunk's copy on a device-to-host stream into pinned host memory
  (_host_pool) for that tensor's worst chunk ratio plus a margin: the compressed size is
  only known on the device, and the caller's thread never waits for it. A worker thread per
  device copies a tensor of a new kind: it waits for the first chunk's 512-byte header (copied on
  that stream) and guesses the later chunks from it. Each guessed copy is settled once it has
  landed, by the worker in the background or by whichever call needs it first: the chunk's
  header is read from its host copy, the unused end of its host memory given back, or, where
  the guess was short, the bytes past it copied into a tail of their own. Chunk k is copied
  while chunk k+1 is compressed, and nothing but the codec runs on the caller's stream.
* up: :meth:`HostCopy.load` queues each chunk's copy on a host-to-device stream and its
  decompression on a decode stream (the worker does, after :meth:`HostCopy.prefetch`), so chunk
  k decodes while chunk k+1 crosses the link; the caller's stream waits for the result with an
  event, not the caller's thread.
* raw: dtypes the codec does not code and ``compress=False`` are copied as they are, on the same
  streams (their copy queued by the caller's thread: their size is known); so are chunks the codec
  stores in its raw layout (compression would not shrink them).

On CPU the same code runs without streams or events (the host copy is a compact CPU buffer),
which is what the CPU tests exercise.
"""

from zipccl.offload._activations import ActivationOffload, offload_activations
from zipccl.offload._host_copy import HostCopy, offload_tensor
from zipccl.offload._lanes import HostMemory, empty_host_cache, host_memory

__all__ = [
    "ActivationOffload",
    "HostCopy",
    "HostMemory",
    "empty_host_cache",
    "host_memory",
    "offload_activations",
    "offload_tensor",
]
