"""``python -m torchtitan_on_cpu ARGS``: ``python -m torchtitan.train ARGS`` on a machine without
a GPU, for a smoke run of the offline torchtitan setup (``torchtitan_h200.py --cpu``) where CI
and the developers' machines have no GPU. torchtitan picks its device once, at import, from
``torch._utils._get_available_device_type`` (``"cuda"`` when none is found) and then calls
``torch.cuda``-style memory functions on it: this makes that answer ``"cpu"`` and gives
``torch.cpu`` no-op stand-ins for the memory functions it lacks (and a device index).
torchtitan's own code runs unchanged. Not used on the GPU machine."""

import runpy
import sys
import types
from typing import Any

import torch
import torch._utils


def _no_memory_stats(*_: Any) -> dict[str, int]:
    return {}


def _patch() -> None:
    torch._utils._get_available_device_type = lambda: "cpu"
    stand_ins = {
        "get_device_name": lambda *_: "cpu",
        "get_device_properties": lambda *_: types.SimpleNamespace(total_memory=1 << 30),
        "memory_stats": _no_memory_stats,
        "reset_peak_memory_stats": lambda *_: None,
        "empty_cache": lambda: None,
    }
    for name, function in stand_ins.items():
        if not hasattr(torch.cpu, name):
            setattr(torch.cpu, name, function)
    torch.cpu.current_device = lambda: 0  # an index, as barrier(device_ids=...) takes (not "cpu")


if __name__ == "__main__":
    _patch()
    sys.argv[0] = "torchtitan.train"
    runpy.run_module("torchtitan.train", run_name="__main__", alter_sys=True)
