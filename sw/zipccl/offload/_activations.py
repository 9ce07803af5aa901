"""Activation offloading: the saved-tensor hooks (:class:`ActivationOffload`, made by
:func:`offload_activations`) that send what autograd saves to host memory as :class:`HostCopy`
objects and bring them back, prefetched, for the backward pass."""

from __future__ import annotations

import collections
import weakref
from dataclasses import dataclass
from typing import NamedTuple

import torch

from zipccl.offload._host_copy import (
    CHUNK_BYTES,
    HostCopy,
    check_bool,
    check_chunk_bytes,
    dense_order,
    unsupported,
)


@dataclass(eq=False)
class _Saved:
    """What autograd keeps for an offloaded tensor: its host copy and its place in the order of
    the forward pass it was saved in (``run``: weak references to that pass's entries).

    One entry may stand for several saved tensors (the same tensor saved twice, views of one
    base): ``uses`` counts them. The tensor the first of them brings back is held (``held``)
    until all ``uses`` have been unpacked, so that the others take it instead of copying it up
    again, then only referenced weakly (``last``)."""

    copy: HostCopy
    run: list[weakref.ref[_Saved]]
    index: int
    uses: int = 0
    unpacked: int = 0
    held: torch.Tensor | None = None
    last: weakref.ref[torch.Tensor] | None = None

    def restored(self) -> torch.Tensor | None:
        """The tensor an unpack brought back, while it is alive."""
        if self.held is not None:
            return self.held
        return self.last() if self.last is not None else None

    def unpack_done(self, tensor: torch.Tensor) -> None:
        self.last, self.unpacked = weakref.ref(tensor), self.unpacked + 1
        if self.unpacked >= self.uses:  # (a new round for each backward with retain_graph)
            self.held, self.unpacked = None, 0
        else:
            self.held = tensor


class _View(NamedTuple):
    """What autograd keeps for a view offloaded through its base: the base's entry (shared by
    every view of it) and where the view lies in it."""

    base: _Saved
    size: torch.Size
    stride: tuple[int, ...]
    offset: int


VIEW_SPAN = 4  # a view is offloaded through its base when the base is at most this many times it


_Place = tuple[torch.Size, tuple[int, ...], int]  # a view's size, stride and offset in its base


def _through_base(tensor: torch.Tensor) -> tuple[torch.Tensor, _Place | None]:
    """What to offload for ``tensor``: its base where it is a view that lies inside a dense base
    of its dtype at most ``VIEW_SPAN`` times its size (then also the view's place in it), else
    the tensor itself (and None).

    Restoring the base and taking the view of it gives backward the tensor it saved: the same
    strides and storage offset (some kernels choose their algorithm, and so their rounding, by
    layout and alignment), views of one base sharing one storage, and one copy of the base's
    bytes however many views of it are saved (q, k and v of one projection, say)."""
    base = tensor._base
    if (
        base is None
        or type(base) is not torch.Tensor
        or base.dtype != tensor.dtype
        or base.device != tensor.device
        or tensor.numel() == 0
        or base.numel() > VIEW_SPAN * tensor.numel()
        or unsupported(base) is not None
        or dense_order(base) is None
    ):
        return tensor, None
    offset = int(tensor.storage_offset() - base.storage_offset())
    last = offset + sum((n - 1) * s for n, s in zip(tensor.shape, tensor.stride(), strict=True))
    extent = 1 + sum((n - 1) * s for n, s in zip(base.shape, base.stride(), strict=True))
    if offset < 0 or last >= extent:
        return tensor, None
    return base, (tensor.shape, tensor.stride(), offset)


class ActivationOffload(torch.autograd.graph.saved_tensors_hooks):
    """A context manager that keeps the tensors autograd saves for backward in host memory,
    compressed; made by :func:`offload_activations`, which documents it.

    Attributes:
        min_bytes, compress, prefetch_bytes, max_inflight_bytes, chunk_bytes: the arguments of
            :func:`offload_activations`.

    Example::

        >>> offload = zipccl.ActivationOffload(min_bytes=1 << 16)  # one for every step
        >>> layer = torch.nn.Linear(512, 512)
        >>> for step in range(2):
        ...     with offload:
        ...         loss = layer(torch.randn(256, 512)).square().mean()
        ...     loss.backward()
    """

    def __init__(
        self,
        *,
        min_bytes: int = 1 << 20,
        compress: bool = True,
        prefetch_bytes: int = 1 << 30,
        max_inflight_bytes: int = 1 << 30,
        chunk_bytes: int = CHUNK_BYTES,
    ) -> None:
        self.min_bytes = _check_count("min_bytes", min_bytes)
        self.compress = check_bool("compress", compress)
        self.prefetch_bytes = _check_count("prefetch_bytes", prefetch_bytes)
        self.max_inflight_bytes = _check_count("max_inflight_bytes", max_inflight_bytes)
        self.chunk_bytes = check_chunk_bytes(chunk_bytes)
        self._run: list[weakref.ref[_Saved]] = []
        self._seen: dict[int, tuple[weakref.ref[torch.Tensor], int, weakref.ref[_Saved]]] = {}
        self._inflight: collections.deque[tuple[weakref.ref[HostCopy], int]] = collections.deque()
        self._inflight_bytes = 0
        self._active = False
        super().__init__(self._pack, self._unpack)

    def __enter__(self) -> ActivationOffload:  # type: ignore[override]  # (torch's: None)
        if self._active:
            raise RuntimeError(
                "this offload_activations() is already active: nest a new one instead"
            )
        self._active, self._run, self._seen = True, [], {}
        super().__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        self._active = False
        self._seen = {}
        self._prefetch_below(len(self._run), self._run)  # the backward pass starts at the end

    def keeps(self, tensor: torch.Tensor) -> bool:
        """Whether a saved tensor stays where it is (the rule in :func:`offload_activations`).

        Args:
            tensor (Tensor): a tensor autograd would save.

        Returns:
            bool: True where it is kept, False where it would be offloaded.
        """
        base = tensor._base if tensor._base is not None else tensor
        return (
            type(tensor) is not torch.Tensor  # parameters, subclasses (FakeTensor, DTensor...)
            or isinstance(base, torch.nn.Parameter)
            or (base.is_leaf and base.requires_grad)
            or tensor.numel() * tensor.element_size() < self.min_bytes
            or unsupported(tensor) is not None
        )

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor | _Saved | _View:
        if self.keeps(tensor):
            return tensor
        source, place = _through_base(tensor)
        saved = self._offload(source)
        saved.uses += 1
        return saved if place is None else _View(saved, *place)

    def _offload(self, tensor: torch.Tensor) -> _Saved:
        seen = self._seen.get(id(tensor))
        if seen is not None and seen[0]() is tensor and seen[1] == tensor._version:
            saved = seen[2]()
            if saved is not None:  # saved twice (unchanged), or a base of several: one copy
                return saved
        with torch.no_grad():
            copy = HostCopy(tensor.detach(), self.compress, self.chunk_bytes)
        saved = _Saved(copy, self._run, len(self._run))
        self._run.append(weakref.ref(saved))
        self._seen[id(tensor)] = (weakref.ref(tensor), tensor._version, weakref.ref(saved))
        self._bound_inflight(copy)
        return saved

    def _bound_inflight(self, copy: HostCopy) -> None:
        """Keep at most ``max_inflight_bytes`` of device memory waiting for its copy down: past
        that, wait (the caller's thread) for the oldest copies to land, so the caching allocator
        can reuse their memory."""
        self._inflight.append((weakref.ref(copy), copy.nbytes))
        self._inflight_bytes += copy.nbytes
        while self._inflight:
            oldest = self._inflight[0][0]()
            over = self._inflight_bytes > self.max_inflight_bytes
            if oldest is not None and not over and not oldest.landed():
                return
            if oldest is not None and over:
                oldest.wait()
            self._inflight_bytes -= self._inflight.popleft()[1]

    def _unpack(self, saved: torch.Tensor | _Saved | _View) -> torch.Tensor:
        if isinstance(saved, _View):
            base = self._restore(saved.base)
            return base.as_strided(saved.size, saved.stride, saved.offset)
        if isinstance(saved, _Saved):
            return self._restore(saved)
        return saved

    def _restore(self, saved: _Saved) -> torch.Tensor:
        tensor = saved.restored()  # saved more than once: the tensor the first unpack returned
        if tensor is None:
            saved.copy.prefetch()
            self._prefetch_below(saved.index, saved.run)
            with torch.no_grad():
                tensor = saved.copy.load()
        saved.unpack_done(tensor)
        return tensor

    def _prefetch_below(self, index: int, run: list[weakref.ref[_Saved]]) -> None:
        """Start bringing back the tensors saved before ``index`` (the backward pass needs them
        next), up to ``prefetch_bytes`` of them counted from ``index`` down."""
        budget = self.prefetch_bytes
        for ref in reversed(run[:index]):
            saved = ref()
            if saved is None or saved.restored() is not None:
                continue
            if budget <= 0:
                return
            saved.copy.prefetch()
            budget -= saved.copy.nbytes


def _check_count(name: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return value


def offload_activations(
    *,
    min_bytes: int = 1 << 20,
    compress: bool = True,
    prefetch_bytes: int = 1 << 30,
    max_inflight_bytes: int = 1 << 30,
    chunk_bytes: int = CHUNK_BYTES,
) -> ActivationOffload:
    """A context manager that keeps the activations autograd saves in host memory, compressed.

    Inside ``with zipccl.offload_activations(): loss = model(x)`` every tensor autograd saves for
    backward is offloaded as :func:`offload_tensor` does (compressed on its device, only the
    compressed bytes copied, on side streams, without the caller's thread waiting for the device),
    unless
    the rule below keeps it. The backward pass brings each one back: when it needs a tensor, the
    ones saved just before it are already on their way (``prefetch_bytes`` of them; the tail of
    the forward pass is sent for when the block exits), so the copies overlap compute. Losses
    and gradients are bit-identical to a run without offload.

    The rule, for each saved tensor:

    * kept as it is (no copy): parameters -- ``nn.Parameter`` objects, other leaves that require
      grad, and views of either --, tensor subclasses, non-strided (sparse...) or quantized
      tensors, tensors on devices other than CUDA and CPU, and tensors under ``min_bytes``;
    * compressed: ``bfloat16``, ``float16``, ``float32``, ``float8_e4m3fn``, ``float8_e5m2``
      (chunks that compression would not shrink are stored raw);
    * copied raw: every other dtype (integers, bool, float64, complex...), and every dtype with
      ``compress=False``.

    Saved tensors come back as they were saved, so that backward computes what it would have:
    a view whose base is at most ``VIEW_SPAN`` (4) times its size is offloaded through its base,
    once for all views of that base, and comes back as the same view (sizes, strides, storage
    offset) of the restored base; other tensors without gaps come back with their strides, other
    views with gaps contiguous. A tensor saved twice (unchanged) is offloaded once. Host copies
    are freed when autograd frees what it saved (after backward, or with the graph);
    ``backward(retain_graph=True)`` brings them back again for each backward pass. CPU tensors
    are "offloaded" to a compact CPU copy by the same code.

    Args:
        min_bytes (int, optional): tensors smaller than this stay; default 1 MiB.
        compress (bool, optional): False offloads every tensor raw on the same streams with the
            same prefetch (the uncompressed baseline); default True.
        prefetch_bytes (int, optional): how much of what the backward pass needs next to bring
            back ahead (device memory it holds); default 1 GiB. 0: each tensor only when needed.
        max_inflight_bytes (int, optional): device memory the forward pass may hold in tensors
            whose copy down has not finished; past it, the caller's thread waits for the oldest
            (bounding peak memory); default 1 GiB.
        chunk_bytes (int, optional): as for :func:`offload_tensor`; default 64 MiB.

    Returns:
        ActivationOffload: the context manager; one instance may be entered again after it
        exits (e.g. once per training step), not while it is active.

    Raises:
        TypeError: an argument of the wrong type.
        ValueError: a negative size, ``chunk_bytes`` below 1 MiB.
        RuntimeError: entering an instance that is already active; in backward, a copy that
            failed (its cause chained).

    Example::

        >>> model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(),
        ...                             torch.nn.Linear(1024, 256))
        >>> x = torch.randn(512, 256)
        >>> with zipccl.offload_activations(min_bytes=1 << 16):
        ...     loss = model(x).square().mean()
        >>> loss.backward()
    """
    return ActivationOffload(
        min_bytes=min_bytes,
        compress=compress,
        prefetch_bytes=prefetch_bytes,
        max_inflight_bytes=max_inflight_bytes,
        chunk_bytes=chunk_bytes,
    )
