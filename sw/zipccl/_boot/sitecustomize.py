"""zipccl's start-up hook for the workers of ``zipccl-run`` (zipccl.run puts this folder first on
PYTHONPATH): ``import zipccl`` registers the backend and, under ``ZIPCCL_WRAP=1``, the patch
(zipccl.wrap) as soon as the script imports torch. Then the ``sitecustomize`` module this one
hides, if the environment has one, runs as it would have."""

import importlib
import os
import sys
import warnings


def _boot() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        import zipccl  # noqa: F401  (installs the registration hook)
    except ImportError as error:
        warnings.warn(f"zipccl-run: zipccl cannot be imported here ({error})", stacklevel=1)
    me = sys.modules.pop(__name__)  # so that the import below finds the next one
    saved = sys.path[:]
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    try:
        importlib.import_module("sitecustomize")
    except ModuleNotFoundError as error:
        if error.name != "sitecustomize":
            raise
    finally:
        sys.path[:] = saved
        sys.modules.setdefault(__name__, me)  # none found: import machinery expects this one


_boot()
