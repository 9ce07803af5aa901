"""``zipccl-run``: torchrun, whose workers' gloo and NCCL groups are zipccl groups.

``zipccl-run [torchrun's arguments] train.py [its arguments]`` (or ``python -m zipccl.run ...``)
runs ``torch.distributed.run`` with two additions to the workers' environment: ``ZIPCCL_WRAP=1``
and a folder first on ``PYTHONPATH`` whose ``sitecustomize.py`` imports zipccl at interpreter
start (then runs any ``sitecustomize`` it hides). So the script's own
``init_process_group("nccl" | "gloo" | "cuda:nccl,cpu:gloo" | default)`` and ``new_group(...)``
make zipccl groups over the same inner backends (:mod:`zipccl.wrap`), with no edit to it.

``python -m zipccl.run --env`` prints those two variables as shell assignments instead, for
launchers other than torchrun (``deepspeed``, ``srun``, ``mpirun``): export them first. Workers
started with ``python -S`` or ``-I`` skip ``sitecustomize`` and stay unwrapped.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

BOOT = Path(__file__).with_name("_boot")  # holds sitecustomize.py
_SOURCE = str(Path(__file__).resolve().parent.parent)  # where ``import zipccl`` finds this copy


def worker_env(env: Mapping[str, str]) -> dict[str, str]:
    """The variables the launcher adds to ``env``: ``ZIPCCL_WRAP=1``; ``PYTHONPATH`` with the
    boot folder first and this zipccl's folder last (where ``env`` does not reach it)."""
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    paths = [str(BOOT), *(p for p in paths if p != str(BOOT))]
    if _SOURCE not in paths:
        paths.append(_SOURCE)
    return {"ZIPCCL_WRAP": "1", "PYTHONPATH": os.pathsep.join(paths)}


def main(argv: Sequence[str] | None = None) -> None:
    """torchrun's ``main`` with :func:`worker_env` in the environment (``--env``: print it)."""
    args = list(sys.argv[1:] if argv is None else argv)
    added = worker_env(os.environ)
    if args == ["--env"]:
        for key, value in added.items():
            print(f"export {key}={shlex.quote(value)}")
        return
    os.environ.update(added)
    from torch.distributed.run import main as torchrun

    torchrun(args)


if __name__ == "__main__":
    main()
