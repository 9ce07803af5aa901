"""Make a script's own gloo and NCCL groups zipccl groups, with no edit to the script.

Installed in each worker by the ``zipccl-run`` launcher (:mod:`zipccl.run`: ``ZIPCCL_WRAP=1``,
read when torch.distributed is imported, :mod:`zipccl._register`). It wraps torch's one helper
behind ``init_process_group`` and ``new_group`` (and so DeviceMesh, FSDP2, DTensor and every
framework that calls them): a group asked for with ``"gloo"``, ``"nccl"``, a device map of those
(``"cuda:nccl,cpu:gloo"``) or no backend (torch's default for the devices present) is created as
a zipccl group whose inner backends are the ones asked for, per device
(:class:`zipccl.backend.Options`) -- save NCCL for ranks that share a GPU, which NCCL refuses,
or under ``ZIPCCL_CUDA_TRANSPORT=gloo``: zipccl's host-staged gloo transport then moves the CUDA
tensors. Other backends (``mpi``, ``xccl``, ``zipccl`` itself, ...) are left as they are.

Frameworks branch on the backend's name (HF accelerate, Lightning and DeepSpeed check for
``"nccl"`` or ``"gloo"``), so such a group keeps the name it was asked for:
``dist.get_backend(group)`` returns the string the script gave (or torch's default), and
``group.name()`` the inner backend's (``"nccl"`` where NCCL moves CUDA tensors, else ``"gloo"``).
That it is a zipccl group shows in ``isinstance(group, zipccl.ProcessGroupZipccl)`` and in
:func:`zipccl.stats`.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
from typing import Any

import torch.distributed.distributed_c10d as c10d

from zipccl._name import NAME

WRAPPED = ("gloo", "nccl")  # the inner backends zipccl wraps
_DEVICES = ("cpu", "cuda")


def install() -> None:
    """Wrap ``torch.distributed.distributed_c10d._new_process_group_helper`` (once), and end
    the groups a script leaves alive at exit."""
    helper = c10d._new_process_group_helper
    if hasattr(helper, "__wrapped__"):
        return
    atexit.register(_end_groups)

    @functools.wraps(helper)
    def zipccl_group(
        group_size: int,
        group_rank: int,
        global_ranks_in_group: list[int],
        backend: str,
        store: Any,
        group_name: Any,
        backend_options: object = None,
        **kwargs: Any,
    ) -> tuple[Any, Any]:
        inner = inner_backends(backend)
        if inner is None:
            return helper(
                group_size,
                group_rank,
                global_ranks_in_group,
                backend,
                store,
                group_name,
                backend_options,
                **kwargs,
            )
        from zipccl.backend import Options

        options = Options(inner, backend_options, "nccl" if "nccl" in inner.values() else "gloo")
        pg, prefix_store = helper(
            group_size,
            group_rank,
            global_ranks_in_group,
            NAME,
            store,
            group_name,
            options,
            **kwargs,
        )
        if pg is not c10d.GroupMember.NON_GROUP_MEMBER:  # the name the script asked for
            c10d._world.pg_map[pg] = (backend, prefix_store)
            c10d._world.pg_backend_config[pg] = str(c10d.BackendConfig(c10d.Backend(backend)))
        return pg, prefix_store

    # the same parameters, the tail passed on as keywords (which mypy cannot match to the stub)
    c10d._new_process_group_helper = zipccl_group  # type: ignore[assignment]


def _end_groups() -> None:
    """Destroy the default group (and with it every other) if the script did not: torch asks
    scripts to, many do not, and a process whose gloo groups outlive the interpreter may abort in
    their threads' teardown. At exit nothing can be reported to the script: errors are dropped."""
    if c10d.is_initialized():
        with contextlib.suppress(Exception):
            c10d.destroy_process_group()


def inner_backends(backend: str) -> dict[str, str] | None:
    """Device type -> inner backend that a group asked for with ``backend`` gets, or None where
    zipccl leaves it alone (a backend other than gloo/NCCL on cpu/cuda, or zipccl itself)."""
    try:
        mapping = c10d.BackendConfig(c10d.Backend(str(backend))).get_device_backend_map()
    except (ValueError, TypeError):
        return None
    if not mapping or any(d not in _DEVICES or b not in WRAPPED for d, b in mapping.items()):
        return None
    return dict(mapping)


__all__ = ["WRAPPED", "inner_backends", "install"]
