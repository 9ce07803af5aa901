"""The codec's backends as two interfaces, told apart by one explicit capability, ``QUEUES``,
instead of probing for attributes. codec._backend picks one per device and ``ZIPCCL_BACKEND``;
every backend writes golden's bytes.

* :class:`HostCodec` (``QUEUES`` False: zipccl._torch, zipccl._triton) codes on the calling
  thread and returns what it found, so a device tensor's payload size or a corrupt block costs a
  host sync.
* :class:`QueuedCodec` (``QUEUES`` True: zipccl._cuda) only queues device work; payload sizes and
  decode errors stay on the device until read.
"""

from __future__ import annotations

from typing import Literal, Protocol

import torch

from zipccl.golden.codebook import Codebook
from zipccl.golden.formats import FloatFormat


class HostCodec(Protocol):
    """Encodes and decodes before returning; errors are raised by the call (ValueError)."""

    @property
    def QUEUES(self) -> Literal[False]: ...

    def encode_into(
        self, x: torch.Tensor, fmt: FloatFormat, table: Codebook, block: int, out: torch.Tensor
    ) -> int:
        """The split sections after the header into ``out``; returns the payload's bytes."""
        ...

    def decode_into(
        self,
        buf: torch.Tensor,
        fmt: FloatFormat,
        table: Codebook,
        block: int,
        payload_bytes: int,
        out: torch.Tensor,
    ) -> None:
        """The split buffer ``buf`` into ``out``, every block checked."""
        ...


class QueuedCodec(Protocol):
    """Queues the kernels and returns; sizes land in device tensors, errors in a device flag."""

    @property
    def QUEUES(self) -> Literal[True]: ...

    @property
    def ROOM_ERROR(self) -> int:
        """The flag bit of a payload larger than its room (resent raw by a collective)."""
        ...

    def launch_encode(
        self,
        x: torch.Tensor,
        fmt: FloatFormat,
        table: Codebook,
        block: int,
        out: torch.Tensor,
        header: bytes | None = None,
        checksum: bool = False,
    ) -> torch.Tensor: ...

    def launch_decode(
        self,
        buf: torch.Tensor,
        fmt: FloatFormat,
        table: Codebook,
        block: int,
        payload_bytes: int | None,
        out: torch.Tensor,
        flag: torch.Tensor,
        clear: bool = False,
        payload: torch.Tensor | None = None,
        checksum: bool = False,
        wait: bool = False,
    ) -> int: ...

    def launch_summary(
        self, x: torch.Tensor, fmt: FloatFormat, stride: int, count: int, out: torch.Tensor
    ) -> None: ...

    def raise_on_flag(self, code: int) -> None:
        """ValueError naming every problem the flag ``code`` records (nothing if zero)."""
        ...


Codec = HostCodec | QueuedCodec
