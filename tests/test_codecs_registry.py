"""The codec's backends declare what they can do (zipccl._codecs): the right interface for each
module, chosen by device and ZIPCCL_BACKEND, with no attribute probing."""

from __future__ import annotations

import inspect

import pytest
import torch
from zipccl import _codecs, _cuda, _torch, _triton, codec


def _members(protocol: type) -> set[str]:
    return {n for n in vars(protocol) if not n.startswith("_")}


@pytest.mark.parametrize(
    ("module", "protocol"),
    [(_torch, _codecs.HostCodec), (_triton, _codecs.HostCodec), (_cuda, _codecs.QueuedCodec)],
    ids=["torch", "triton", "cuda"],
)
def test_each_backend_provides_its_interface(module, protocol) -> None:
    assert module.QUEUES is (protocol is _codecs.QueuedCodec)
    for name in _members(protocol) - {"QUEUES"}:
        assert hasattr(module, name), f"{module.__name__} lacks {name}"
        want = getattr(protocol, name)
        if inspect.isfunction(want):  # same parameters, self aside
            got = list(inspect.signature(getattr(module, name)).parameters)
            assert got == list(inspect.signature(want).parameters)[1:], name


def test_the_choice_follows_device_and_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu = torch.device("cpu")
    assert codec._backend(cpu, 4096) is _torch and not codec._backend(cpu, 4096).QUEUES
    monkeypatch.setenv("ZIPCCL_BACKEND", "triton")
    assert codec._backend(cpu, 4096) is _triton
