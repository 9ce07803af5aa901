"""The ``zipccl`` backend's registration, whatever the import order of zipccl and torch.

The one owner of registration: ``import zipccl`` calls :func:`register_when_torch_loads`, and
nothing else registers. torch.distributed learns a backend's name only when :func:`register`
runs. ``import zipccl`` after torch registers at once; ``import zipccl`` *before* torch (as
import sorters order it) cannot, as importing torch there would make ``import zipccl.golden``
pay for torch. So it leaves a finder on ``sys.meta_path`` that runs :func:`register` the moment
``torch.distributed`` has been executed -- inside ``import torch``, before any
``init_process_group``.

This module imports nothing of torch at import time, and :func:`register` only names the
backend: torch may still be half-imported then. zipccl's collectives load when the first zipccl
group is created (:func:`_create`, which imports :mod:`zipccl.backend`). Under ``ZIPCCL_WRAP=1``
(the ``zipccl-run`` launcher, :mod:`zipccl.run`) it also installs :mod:`zipccl.wrap`'s patch.
Imports go one way: this module loads those two on demand, and neither imports it.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from zipccl._name import NAME

_TARGET = "torch.distributed"


def register() -> None:
    """Register the ``zipccl`` backend with torch.distributed (once; later calls do nothing),
    and, under ``ZIPCCL_WRAP=1``, install the patch that makes gloo/NCCL groups zipccl ones."""
    import torch.distributed as dist

    if NAME not in dist.Backend.backend_list:
        dist.Backend.register_backend(NAME, _create, extended_api=True, devices=["cpu", "cuda"])
    if os.environ.get("ZIPCCL_WRAP", "").strip() == "1":
        from zipccl import wrap

        wrap.install()


def _create(opts: Any, backend_options: object) -> Any:
    """torch's extended backend API: the group, made by :mod:`zipccl.backend` (loaded now)."""
    from zipccl.backend import create

    return create(opts, backend_options)


def register_when_torch_loads() -> None:
    """:func:`register` now if torch.distributed is loaded, else right after it is."""
    if _TARGET in sys.modules:
        register()
    elif not any(isinstance(f, _AfterTorchDistributed) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterTorchDistributed())


class _AfterTorchDistributed(importlib.abc.MetaPathFinder):
    """Finds torch.distributed through the other finders, and wraps its loader so that
    :func:`register` runs once the module has been executed; then leaves ``sys.meta_path``."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != _TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        run = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            register()

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec
