"""FSDP2 custom collectives: ``module.set_custom_all_gather(ZipAllGather())`` and
``module.set_custom_reduce_scatter(ZipReduceScatter())`` on a ``fully_shard`` module, where the
installed torch has them (``FSDP2_HOOKS`` says whether it does).

Loaded on first use of these names (``zipccl.ZipAllGather``, ...), not by ``import zipccl``:
torch.distributed.fsdp imports torch.distributed.nn.functional, whose functions take
``group.WORLD`` as a default argument -- imported after ``init_process_group``, they hold the
default group for the life of the process, so that ``destroy_process_group`` cannot free it,
and a gloo group alive into interpreter shutdown can abort the process there (zipccl._groups).
"""

import torch
import torch.distributed as dist

from zipccl.collectives import ReduceOpArg, all_gather_into_tensor, reduce_scatter_tensor

try:
    from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter

    FSDP2_HOOKS = True
except ImportError:  # torch without FSDP2's custom-comm interface
    AllGather = ReduceScatter = object  # type: ignore[assignment,misc]
    FSDP2_HOOKS = False


class _Alloc:
    """FSDP2 asks its comm objects for staging buffers; plain allocations suffice."""

    def allocate(
        self, size: "tuple[int, ...]", *, dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)


class ZipAllGather(_Alloc, AllGather):  # type: ignore[misc]
    """FSDP2 all-gather of parameter shards through :func:`zipccl.all_gather_into_tensor`.

    ``module.set_custom_all_gather(ZipAllGather())`` on a ``fully_shard`` module (where the
    installed torch has the interface: :data:`FSDP2_HOOKS`). FSDP2 allocates its staging
    buffers through :meth:`allocate` (plain ``torch.empty``) and calls the object with
    torch.distributed's all-gather arguments; the call is :func:`zipccl.all_gather_into_tensor`
    with its defaults (``table=None``, ``verify=None``), so its settings apply.

    Example::

        >>> from torch.distributed.fsdp import fully_shard
        >>> block = fully_shard(torch.nn.Linear(1024, 1024, device="cuda"))
        >>> block.set_custom_all_gather(zipccl.ZipAllGather())
    """

    def __call__(
        self,
        output_tensor: torch.Tensor,
        input_tensor: torch.Tensor,
        group: dist.ProcessGroup,
        async_op: bool = False,
    ) -> dist.Work | None:
        """:func:`zipccl.all_gather_into_tensor` ``(output_tensor, input_tensor, group,
        async_op)``.

        Returns:
            A Work if ``async_op``, else None (as :func:`zipccl.all_gather_into_tensor`).
        """
        return all_gather_into_tensor(output_tensor, input_tensor, group, async_op)


class ZipReduceScatter(_Alloc, ReduceScatter):  # type: ignore[misc]
    """FSDP2 gradient reduce-scatter through :func:`zipccl.reduce_scatter_tensor`.

    ``module.set_custom_reduce_scatter(ZipReduceScatter())`` on a ``fully_shard`` module (where
    the installed torch has the interface: :data:`FSDP2_HOOKS`). The call is
    :func:`zipccl.reduce_scatter_tensor` with FSDP2's op and zipccl's defaults, so the
    reduction is the rank-order fp32 one (or the backend's under the rules stated there) and
    its settings apply.

    Example::

        >>> from torch.distributed.fsdp import fully_shard
        >>> block = fully_shard(torch.nn.Linear(1024, 1024, device="cuda"))
        >>> block.set_custom_reduce_scatter(zipccl.ZipReduceScatter())
    """

    def __call__(
        self,
        output_tensor: torch.Tensor,
        input_tensor: torch.Tensor,
        group: dist.ProcessGroup,
        op: ReduceOpArg,
        async_op: bool = False,
    ) -> dist.Work | None:
        """:func:`zipccl.reduce_scatter_tensor` ``(output_tensor, input_tensor, op, group,
        async_op)``.

        Returns:
            A Work if ``async_op``, else None (as :func:`zipccl.reduce_scatter_tensor`).
        """
        return reduce_scatter_tensor(output_tensor, input_tensor, op, group, async_op)


__all__ = ["FSDP2_HOOKS", "ZipAllGather", "ZipReduceScatter"]
