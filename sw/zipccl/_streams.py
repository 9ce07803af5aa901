"""Making a CUDA stream current for a block, cheaply (the collectives and the offload both switch
streams several times per chunk)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

_GET_STREAM = getattr(torch._C, "_cuda_getCurrentStream", None)
_SET_STREAM = getattr(torch._C, "_cuda_setStream", None)


@contextlib.contextmanager
def on(stream: torch.cuda.Stream | None) -> Iterator[None]:
    """Make ``stream`` current inside the block (None: leave the current one, as on CPU).
    ``torch.cuda.stream`` costs ~30 us of host time per switch (device lookups), so this calls
    torch's own setter directly where it exists and the stream is on the current device."""
    if stream is None:
        yield
    elif (
        _SET_STREAM is None
        or _GET_STREAM is None
        or torch.cuda.current_device() != stream.device_index
    ):
        with torch.cuda.stream(stream):
            yield
    else:
        before = _GET_STREAM(stream.device_index)
        _SET_STREAM(
            stream_id=stream.stream_id,
            device_index=stream.device_index,
            device_type=stream.device_type,
        )
        try:
            yield
        finally:
            _SET_STREAM(stream_id=before[0], device_index=before[1], device_type=before[2])
