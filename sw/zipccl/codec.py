"""zipccl.compress / decompress: golden/container.py buffers from torch tensors, on CPU or CUDA.

The bytes are exactly ``golden.container.encode(bits, fmt, table, block)`` for the same input,
table and block, whichever backend makes them: CUDA C++ kernels (``_cuda``, built with nvcc at first
use) on CUDA tensors, vectorised torch (``_torch``) elsewhere and as the fallback
(``ZIPCCL_BACKEND=torch`` forces it).

Public API::

    c = compress(t)                  # Compressed: c.buffer (uint8, t's device), c.nbytes, c.ratio
    t2 = decompress(c)               # bit-exact copy of t (same dtype, shape, device)
    c = Compressed.from_buffer(buf)  # parse + validate a received uint8 buffer (ValueError)

On CUDA, ``compress``/``compress_into`` only queue work: the default table is built, the header
written and the layout (split or raw) chosen by the kernels, so nothing waits for the device and
the call can be captured in a CUDA graph. The buffer's size stays on the device until
``Compressed.nbytes`` (or ``buffer``, ``ratio``, ``layout``, ``table``) is first read.
``decompress(c, sync=False)`` queues the decode too; its errors are raised by
:func:`check_errors`. ``sync=True`` (the default) raises before returning.

Allocation-free entry points for collectives:

* ``max_compressed_bytes(dtype, numel, block)`` -- the largest buffer a tensor can need (raw layout:
  header + input bytes; the split layout is chosen only when it is smaller).
* ``fixed_part_bytes(dtype, numel, block)`` -- header + the sections whose size is known before any
  data moves (raw planes, prefix planes, block offsets); the payload stream follows.
* ``compress_into(t, out, table=None, block=4096) -> Compressed`` -- writes into ``out`` (uint8,
  >= max_compressed_bytes); the result's buffer is a view ``out[:nbytes]``.
* ``decompress(buf_or_c, out=t)`` -- decodes into an existing tensor; a bare uint8 buffer is parsed.

Tables: ``table=None`` (or ``"theory"``) takes :func:`default_table` -- golden.theory's ZipCCL table
from the statistics of the deterministic sample (exponent formats), and for FP8
golden.builders.staircase_table of the sample's byte histogram; on CUDA the kernels build either
one from the sample, with golden's bytes.
``table="histogram"`` builds it from the full symbol histogram instead (golden.builders), an
opt-in mode that costs an extra pass over the tensor and a host sync (and for FP8 an exhaustive
table search). Corrupt or truncated buffers raise ValueError: a bare buffer's header is checked on
the host, every block's consistency on the device (an error flag).
"""

from __future__ import annotations

import functools
import math
import struct
import zlib

import numpy as np
import torch

from zipccl import _torch, settings
from zipccl._codecs import Codec
from zipccl.golden import builders, theory
from zipccl.golden.codebook import ALPHABET, PREFIX_BITS, Codebook
from zipccl.golden.container import (
    CHECKSUM_AT,
    CHECKSUM_MISMATCH,
    CRC_AT,
    DEFAULT_BLOCK,
    HEADER_BYTES,
    LAYOUT_RAW,
    LAYOUT_SPLIT,
    MAX_BLOCK,
    MAX_DIMS,
    MIN_BLOCK,
    PAYLOAD_BYTES_AT,
    Header,
    Sections,
    raw_size,
    split_size,
    values_checksum,
)
from zipccl.golden.formats import FloatFormat, get_format

__all__ = [
    "Compressed",
    "compress",
    "compress_into",
    "decompress",
    "default_table",
    "fixed_part_bytes",
    "histogram_table",
    "max_compressed_bytes",
]

TableSpec = Codebook | str | None


_FORMATS: dict[torch.dtype, FloatFormat] = {}


def _fmt(dtype: torch.dtype) -> FloatFormat:
    fmt = _FORMATS.get(dtype)
    if fmt is None:
        if not isinstance(dtype, torch.dtype):
            raise TypeError(f"expected a torch.dtype, got {type(dtype).__name__}")
        fmt = _FORMATS[dtype] = get_format(str(dtype).removeprefix("torch."))
    return fmt


def _dtype(fmt: FloatFormat) -> torch.dtype:
    return getattr(torch, fmt.name)


def _check_block(block: int) -> None:
    if not (MIN_BLOCK <= block <= MAX_BLOCK and block & (block - 1) == 0):
        raise ValueError(f"block must be a power of two in [{MIN_BLOCK}, {MAX_BLOCK}], got {block}")


@functools.lru_cache(maxsize=1024)
def _fixed(fmt: FloatFormat, numel: int, block: int) -> int:
    return Sections.of(fmt, numel, block).payload


def fixed_part_bytes(dtype: torch.dtype, numel: int, block: int = DEFAULT_BLOCK) -> int:
    """Bytes of a split-layout buffer before its payload stream, known before any data moves.

    The header, the raw planes, the prefix planes and the block offsets: everything but the
    payload, whose length only the encoder learns (``== golden.container.Sections.of(fmt, numel,
    block).payload``). A split buffer is ``fixed_part_bytes(...) + c.payload_bytes`` bytes; the
    collectives size their slots from the same number. Pure arithmetic: no tensor, no device, no
    sync.

    Args:
        dtype (torch.dtype): ``torch.bfloat16``, ``torch.float16``, ``torch.float32``,
            ``torch.float8_e4m3fn`` or ``torch.float8_e5m2``.
        numel (int): number of elements.
        block (int, optional): elements per block, a power of two in
            [``MIN_BLOCK``, ``MAX_BLOCK``] = [64, 1 << 20] (golden.container); default 4096.

    Returns:
        int: the byte count.

    Raises:
        TypeError: ``dtype`` is not a ``torch.dtype`` or not one of the five above.
        ValueError: ``block`` is not a power of two in [64, 1 << 20].

    Example::

        >>> zipccl.fixed_part_bytes(torch.bfloat16, 1 << 16)
        90752
        >>> zipccl.fixed_part_bytes(torch.float8_e4m3fn, 1 << 16)
        25216
    """
    _check_block(block)
    return _fixed(_fmt(dtype), int(numel), block)


def max_compressed_bytes(dtype: torch.dtype, numel: int, block: int = DEFAULT_BLOCK) -> int:
    """The most bytes a compressed tensor of this dtype and size can take (for preallocation).

    That is the raw layout's size, the 512-byte header (``HEADER_BYTES``) plus the values'
    bytes: the encoder takes the split layout only where it is smaller, so ``c.nbytes <=
    max_compressed_bytes(t.dtype, t.numel())`` for every tensor, table and block. The size of
    the ``out`` that :func:`compress_into` needs. ``block`` is validated but does not change
    the result. Pure arithmetic: no tensor, no device, no sync.

    Args:
        dtype (torch.dtype): ``torch.bfloat16``, ``torch.float16``, ``torch.float32``,
            ``torch.float8_e4m3fn`` or ``torch.float8_e5m2``.
        numel (int): number of elements.
        block (int, optional): a power of two in [64, 1 << 20]; default 4096.

    Returns:
        int: ``512 + numel * dtype.itemsize``.

    Raises:
        TypeError: ``dtype`` is not a ``torch.dtype`` or not one of the five above.
        ValueError: ``block`` is not a power of two in [64, 1 << 20].

    Example::

        >>> zipccl.max_compressed_bytes(torch.bfloat16, 1 << 16)
        131584
        >>> out = torch.empty(zipccl.max_compressed_bytes(torch.float32, 1000), dtype=torch.uint8)
    """
    _check_block(block)
    return raw_size(_fmt(dtype), int(numel))


# ---------------------------------------------------------------------- tables
@functools.lru_cache(maxsize=256)
def _theory_table(fmt: FloatFormat, stats: theory.TensorStats) -> Codebook:
    """golden.theory.zipccl_table; statistics change with every new tensor, so a miss is the
    rule, and golden's 256 erfc calls and sort (~90 us of Python) shrink to ~20 bins."""
    ranks = _top_exponents(fmt, stats)
    if ranks is None:
        return theory.zipccl_table(fmt, stats)
    name = f"zipccl-theory-{fmt.name}-rms{stats.rms:.3g}-z{stats.zero_fraction:.3g}"
    return theory.zipccl_layout(ranks, name)


_WINDOW = (10, 4)  # bins below / above sigma's exponent worth computing


def _top_exponents(fmt: FloatFormat, stats: theory.TensorStats) -> list[int] | None:
    """golden.theory's top exponents from the bins around sigma's exponent (and bin 0) only.

    Each bin's probability is computed with golden's operations on golden's values, so it is the
    same float. A Gaussian's bin probabilities fall monotonically away from the mode, so where
    the two bins just outside the window are below half the 7th best (which exceeds 1e-10, far
    above the cdf's rounding) every bin outside is less likely too and the ranking is golden's.
    None (take golden's full computation) where that cannot be shown or sigma is degenerate.
    """
    sigma, z = stats.rms, stats.zero_fraction
    if not (sigma > 0 and math.isfinite(sigma)):
        return None
    top, bias = (1 << fmt.exp_bits) - 1, fmt.exp_bias

    def cdf(j: int) -> float:  # at golden's edges: 0, 2^(j - bias) for 1 <= j <= top, inf
        edge = 0.0 if j == 0 else math.inf if j > top else 2.0 ** (j - bias)
        return 2.0 * theory._phi(edge / sigma) - 1.0

    def prob(i: int) -> float:
        p = (cdf(i + 1) - cdf(i)) * (1.0 - z)
        return p + z if i == 0 else p

    mode = min(max(bias + math.floor(math.log2(sigma)), 0), top)
    lo, hi = max(1, mode - _WINDOW[0]), min(top, mode + _WINDOW[1])
    probs = {i: prob(i) for i in (0, *range(lo, hi + 1))}
    ranked = sorted(probs, key=lambda s: (-probs[s], s))[: theory.ZIPCCL_TOP]
    worst = probs[ranked[-1]]
    outside = [prob(i) for i in (lo - 1, hi + 1) if 1 <= i <= top]
    if len(ranked) < theory.ZIPCCL_TOP or worst <= 1e-10 or any(p >= worst / 2 for p in outside):
        return None
    return ranked


def _sample_stride(numel: int) -> int:
    """golden.theory.sample_indices' step."""
    return max(1, numel // theory.SAMPLE_SIZE)


def _sample(x: torch.Tensor) -> torch.Tensor:
    """golden.theory.sample_indices as a strided slice (no index tensor)."""
    flat = x.detach().reshape(-1)  # statistics never need the autograd graph
    return flat[:: _sample_stride(flat.numel())][: theory.SAMPLE_SIZE]


def _histogram(symbols: torch.Tensor) -> np.ndarray:
    return torch.bincount(symbols, minlength=256).cpu().numpy()


def _symbols(x: torch.Tensor, fmt: FloatFormat) -> torch.Tensor:
    return _torch.symbols_raw(_torch.bits_of(x.detach().contiguous(), fmt), fmt)[0]


def sample_stats(tensor: torch.Tensor) -> theory.TensorStats:
    """golden.theory.tensor_stats of the deterministic sample, computed where the tensor lives.

    On CPU that is golden's own numpy code on the float64 sample (no copy: it is on the host
    already), so the statistics -- and the table -- are golden's bit for bit. Elsewhere
    :func:`_device_stats`: only three scalars reach the host instead of the whole sample.
    """
    v = _sample(tensor).to(torch.float64)
    if v.device.type == "cpu":
        return theory.tensor_stats(v.numpy())
    return _device_stats(v)


def _device_stats(v: torch.Tensor) -> theory.TensorStats:
    """golden's statistics of the float64 values ``v`` from three sums on v's device (one small
    copy, one sync; no boolean indexing, which would sync too).

    Squares of BF16/FP16/FP32 values are exact in float64, so only the summation order differs
    from golden's numpy pairwise sum: the RMS may differ from golden's in the last ulp (and,
    rarely, give another table). The table travels in the buffer's header, so decoding never
    depends on how it was chosen.
    """
    if v.numel() == 0:
        return theory.TensorStats(0.0, 0.0)
    return _stats_of(_sums(v).tolist(), v.numel())


def _sums(v: torch.Tensor) -> torch.Tensor:
    """float64 [sum of squares of the finite non-zero values, their count, the zero count]."""
    zero = v == 0
    live = v.isfinite() & ~zero
    return torch.stack(
        [
            torch.where(live, v * v, 0.0).sum(),
            live.sum(dtype=torch.float64),
            zero.sum(dtype=torch.float64),
        ]
    )


def _stats_of(sums: list[float], count: int) -> theory.TensorStats:
    total, live, zeros = sums
    return theory.TensorStats(math.sqrt(total / live) if live else 0.0, zeros / count)


SUMMARY_WORDS = 3 + ALPHABET  # sample_summary's length


def sample_summary(tensor: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """The deterministic sample's statistics and symbol histogram as int64[SUMMARY_WORDS] on the
    tensor's device, queued without a host sync: words 0-2 the float64 bits of :func:`_sums`
    (zero for FP8), then the count of each of the 256 symbols (biased exponent, or the FP8
    byte). On CUDA one kernel (``_cuda.launch_summary``); the sums may differ from these torch
    ops' in the last ulp (summation order), the histogram not at all.

    What a collective exchanges so that every rank can build every rank's table
    (:func:`summary_table`) and predict its payload (:func:`payload_bits`) before any data moves.
    ``out``: a contiguous int64[SUMMARY_WORDS] on the tensor's device to write it into (a
    collective's descriptor row), returned.
    """
    fmt = _fmt(tensor.dtype)
    if out is None:
        out = torch.empty(SUMMARY_WORDS, dtype=torch.int64, device=tensor.device)
    elif out.shape != (SUMMARY_WORDS,) or out.dtype != torch.int64 or not out.is_contiguous():
        raise ValueError(
            f"out must be a contiguous int64[{SUMMARY_WORDS}], got {out.dtype} {tuple(out.shape)}"
        )
    backend = _backend(tensor.device, DEFAULT_BLOCK)
    numel = tensor.numel()
    if numel and tensor.is_contiguous() and backend.QUEUES:
        stride = _sample_stride(numel)  # _sample's length without its view (host time)
        count = min(theory.SAMPLE_SIZE, -(-numel // stride))
        backend.launch_summary(tensor, fmt, stride, count, out)
        return out  # the kernel writes every word
    s = _sample(tensor)
    out.zero_()
    if not s.numel():
        return out
    if not fmt.byte_coded:  # FP8's tables need the histogram alone: no statistics
        out[:3] = _sums(s.to(torch.float64)).view(torch.int64)
    ones = torch.ones(s.numel(), dtype=torch.int64, device=s.device)
    out[3:].index_add_(0, _symbols(s, fmt), ones)  # bincount would sync on CUDA
    return out


def summary_table(dtype: torch.dtype, summary: np.ndarray) -> Codebook:
    """:func:`default_table` of the CPU tensor whose :func:`sample_summary` this is (host int64).

    FP8: the staircase table of the summary's histogram.
    """
    fmt = _fmt(dtype)
    if fmt.byte_coded:
        return _staircase(fmt, summary[3:])
    sums = summary[:3].astype(np.int64).view(np.float64).tolist()
    return _theory_table(fmt, _stats_of(sums, max(1, int(summary[3:].sum()))))


def payload_bits(table: Codebook, summary: np.ndarray) -> float:
    """Payload bits per value that ``table`` spends on the sample of a :func:`sample_summary`."""
    hist = summary[3:].astype(np.float64)
    return float(hist @ _widths(table)) / max(1.0, float(hist.sum()))


@functools.lru_cache(maxsize=256)
def _widths(table: Codebook) -> np.ndarray:
    """Payload bits of each symbol under ``table`` (its code length less the prefix)."""
    return table.encoder_lut()[2].astype(np.float64) - PREFIX_BITS


def default_table(tensor: torch.Tensor) -> Codebook:
    """The table :func:`compress` uses when given none (``table=None`` or ``"theory"``).

    Built from a deterministic sample of the tensor (golden.theory.sample_indices: at most
    65,536 values at a fixed stride), never from a full histogram:

    * ``bfloat16``, ``float16``, ``float32`` (the exponent field is coded):
      golden.theory.zipccl_table from :func:`sample_stats` -- the sample's RMS over its finite
      non-zero values and its zero fraction -- cached per statistics;
    * ``float8_e4m3fn``, ``float8_e5m2`` (the whole byte is coded):
      golden.builders.staircase_table of the sample's byte histogram, fitted to the tensor's
      scale (== :func:`summary_table` of its :func:`sample_summary`).

    On CUDA this function reads the sample's statistics or histogram back (a host sync);
    ``compress`` builds the table on the device instead, without one: for FP8 the same table,
    for the exponent formats from sums whose order may differ from this function's in the last
    ulp, which rarely gives another table (decoding never depends on it: the table travels in
    the header).

    Args:
        tensor (Tensor): one of the five dtypes, on any device.

    Returns:
        golden.codebook.Codebook: the table; pass it as ``table=`` to code other tensors alike.

    Raises:
        TypeError: the tensor's dtype is not one of the five.

    Example::

        >>> _ = torch.manual_seed(0)
        >>> x = torch.randn(1 << 14, dtype=torch.bfloat16)
        >>> book = zipccl.default_table(x)
        >>> book.name
        'zipccl-theory-bfloat16-rms1-z0'
        >>> zipccl.compress(x).table == book
        True
    """
    fmt = _fmt(tensor.dtype)
    if not fmt.byte_coded:
        return _theory_table(fmt, sample_stats(tensor))
    return _staircase(fmt, _histogram(_symbols(_sample(tensor), fmt)))


def _staircase(fmt: FloatFormat, hist: np.ndarray) -> Codebook:
    """The FP8 table of a sample's byte histogram."""
    return builders.staircase_table(_nonempty(hist), name=f"staircase-{fmt.name}")


def _nonempty(hist: np.ndarray) -> np.ndarray:
    """A histogram the golden builders accept (a copy): an empty one counts as one 0 symbol."""
    hist = np.array(hist, np.int64)
    if not hist.any():
        hist[0] = 1
    return hist


def histogram_table(tensor: torch.Tensor) -> Codebook:
    """Opt-in: a table from the tensor's full symbol histogram (``table="histogram"``).

    One extra pass over the whole tensor (the histogram of every value's symbol: the exponent
    field, or the FP8 byte), then on the host:

    * exponent formats: golden.builders.zipccl_histogram_table, the ZipCCL layout with the
      measured 7 most frequent exponents;
    * FP8: golden.builders.best_table, the exhaustive search over width vectors -- the most
      compact table for this tensor (slower to build than the default staircase table).

    On CUDA the histogram is copied to the host (a host sync), also inside :func:`compress`.
    An empty tensor's histogram counts one zero symbol.

    Args:
        tensor (Tensor): one of the five dtypes, on any device.

    Returns:
        golden.codebook.Codebook: the table.

    Raises:
        TypeError: the tensor's dtype is not ``bfloat16``, ``float16``, ``float32``,
            ``float8_e4m3fn`` or ``float8_e5m2``.

    Example::

        >>> x = torch.randn(4096).to(torch.float8_e4m3fn)
        >>> zipccl.histogram_table(x).name
        'best-float8_e4m3fn'
        >>> c = zipccl.compress(x, table="histogram")  # the same table, built inside
    """
    fmt = _fmt(tensor.dtype)
    hist = _nonempty(_histogram(_symbols(tensor, fmt)))
    if fmt.byte_coded:
        return builders.best_table(hist, name=f"best-{fmt.name}")
    return builders.zipccl_histogram_table(hist)


def _resolve_table(tensor: torch.Tensor, table: TableSpec) -> Codebook:
    if table is None or table == "theory":
        return default_table(tensor)
    if table == "histogram":
        return histogram_table(tensor)
    if not isinstance(table, Codebook):
        raise TypeError(f"table must be a Codebook, 'theory' or 'histogram', got {table!r}")
    return table


# ---------------------------------------------------------------------- the buffer
_FROM_HEADER = object()  # a table the device chose: read from the buffer's header when asked


class Compressed:
    """One compressed tensor: ``buffer`` is the whole golden/container buffer, sendable as is.

    Made by :func:`compress`, :func:`compress_into` and :meth:`from_buffer` (not constructed
    directly); :func:`decompress` turns it back into the tensor. A CUDA compress returns before
    the device knows the buffer's size: ``nbytes``, ``ratio``, ``layout``, ``payload_bytes``,
    ``buffer``, ``table`` and ``table_hash`` read it on first use (one host sync, once).
    :func:`decompress` needs none of them.

    Storing: ``torch.save(c)`` and ``pickle`` keep the ``nbytes`` bytes alone and re-check the
    header when loaded (``torch.load(..., weights_only=True)`` inside
    ``torch.serialization.safe_globals([zipccl.Compressed])``); :meth:`to_bytes` /
    :meth:`from_bytes` give and take the bare bytes; a plain uint8 tensor of them
    (``c.buffer`` from a CPU :func:`compress`) loads with ``weights_only=True`` as is.

    Attributes:
        dtype (torch.dtype): the tensor's dtype.
        shape (torch.Size): the tensor's shape.
        numel (int): its number of elements.
        block (int): elements per block (a power of two in [64, 1 << 20]).

    Example::

        >>> x = torch.randn(16, 1024, dtype=torch.bfloat16)
        >>> c = zipccl.compress(x)
        >>> c.dtype, c.shape, c.block
        (torch.bfloat16, torch.Size([16, 1024]), 4096)
        >>> c.layout, c.nbytes == c.buffer.numel(), c.ratio < 0.75
        ('split', True, True)
        >>> r = zipccl.Compressed.from_buffer(c.buffer.clone())  # e.g. after a recv
        >>> torch.equal(zipccl.decompress(r), x)
        True
    """

    __slots__ = (
        "_checksum",
        "_meta",
        "_plan",
        "_sizes",
        "_storage",
        "_table",
        "block",
        "dtype",
        "numel",
        "shape",
    )

    def __init__(
        self,
        storage: torch.Tensor,
        dtype: torch.dtype,
        shape: torch.Size,
        block: int,
        sizes: tuple[int, int] | None,
        table: object,
        meta: tuple[torch.Tensor, int] | None = None,
        plan: object = None,
        checksum: int | bool | None = None,
    ) -> None:
        self._storage, self._sizes, self._table = storage, sizes, table
        self._meta, self._plan = meta, plan  # the device's size record; _cuda.Plan
        self._checksum = checksum  # the header's values checksum; True: on the device; None: none
        self.dtype, self.block = dtype, block
        self.shape = shape if type(shape) is torch.Size else torch.Size(shape)
        self.numel = self.shape.numel()

    def _read_sizes(self) -> tuple[int, int]:
        if self._sizes is None:
            assert self._meta is not None
            meta, at = self._meta
            nbytes, payload = meta[at : at + 16].view(torch.int64).tolist()
            self._sizes = (nbytes, payload)
        return self._sizes

    @property
    def nbytes(self) -> int:
        """The buffer's length in bytes (header included); on CUDA the first read syncs."""
        return self._read_sizes()[0]

    @property
    def payload_bytes(self) -> int:
        """Bytes of the split layout's payload stream (0 for the raw layout): ``nbytes`` less
        :func:`fixed_part_bytes`. On CUDA the first read syncs."""
        return self._read_sizes()[1]

    @property
    def layout(self) -> str:
        """``"split"``, or ``"raw"`` (header + the values' bytes) where the split layout would
        not be smaller; so a split buffer is always smaller than a raw one. On CUDA the first
        read syncs."""
        return "raw" if self.nbytes == raw_size(_fmt(self.dtype), self.numel) else "split"

    @property
    def ratio(self) -> float:
        """``nbytes`` / the tensor's own bytes (``numel * itemsize``, at least 1): lower is
        better. The 512-byte header counts, so small or incompressible tensors exceed 1."""
        return self.nbytes / max(1, self.numel * _fmt(self.dtype).bits // 8)

    @property
    def buffer(self) -> torch.Tensor:
        """The compressed bytes: a 1-D ``torch.uint8`` tensor of ``nbytes`` bytes on the tensor's
        device, to send, save or :func:`decompress`. From :func:`compress` on CPU it owns exactly
        those bytes, so ``torch.save(c.buffer)`` stores ``nbytes``; on CUDA, and from
        :func:`compress_into` (a view of ``out``), it is a view of a larger allocation, which
        ``torch.save`` would store whole: save :meth:`to_bytes`, ``c.buffer.clone()`` or ``c``
        itself."""
        return self._storage[: self.nbytes]

    def to_bytes(self) -> bytes:
        """Exactly the ``nbytes`` compressed bytes, copied to the host (a sync on CUDA): what to
        write to a file or a store. :meth:`from_bytes` turns them back into a Compressed.

        Returns:
            bytes: ``nbytes`` of them, header included.

        Example::

            >>> c = zipccl.compress(torch.randn(1000, dtype=torch.bfloat16))
            >>> data = c.to_bytes()
            >>> len(data) == c.nbytes
            True
            >>> back = zipccl.Compressed.from_bytes(data)
            >>> torch.equal(zipccl.decompress(back), zipccl.decompress(c))
            True
        """
        return self.buffer.cpu().numpy().tobytes()

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview) -> Compressed:
        """:meth:`from_buffer` of a CPU copy of ``data`` (e.g. :meth:`to_bytes`' result read back
        from a file): the header checked, the length the header's; ``.to(device)`` of its
        ``buffer`` then :meth:`from_buffer` moves it.

        Args:
            data (bytes, bytearray or memoryview): exactly one compressed buffer.

        Returns:
            Compressed: on CPU, owning a copy of ``data``.

        Raises:
            TypeError: ``data`` is not bytes-like.
            ValueError: as :meth:`from_buffer`: a corrupt header, a truncated or padded buffer.
        """
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"expected bytes, got {type(data).__name__}")
        array = np.frombuffer(data, dtype=np.uint8).copy()  # (a memoryview of other items too)
        return cls.from_buffer(torch.from_numpy(array))

    def __getstate__(self) -> dict[str, torch.Tensor]:
        """What ``pickle`` and ``torch.save`` keep: the ``nbytes`` bytes alone (a compact copy on
        the buffer's device; a sync on CUDA), however large the allocation they sit in."""
        return {"buffer": self.buffer.clone()}

    def __setstate__(self, state: dict[str, torch.Tensor]) -> None:
        """Rebuilt by :meth:`from_buffer`, so a loaded Compressed is checked as a received one.
        ``torch.load(path, weights_only=True)`` takes it once the class is allowed:
        ``with torch.serialization.safe_globals([zipccl.Compressed]): torch.load(path)``."""
        if not isinstance(state, dict) or set(state) != {"buffer"}:
            raise ValueError("not a pickled zipccl.Compressed")
        parsed = Compressed.from_buffer(state["buffer"])
        for name in Compressed.__slots__:
            setattr(self, name, getattr(parsed, name))

    @property
    def table(self) -> Codebook | None:
        """The table the buffer was coded with (None for the raw layout).

        Where the CUDA kernels built it (the default table on CUDA) the first read copies the
        header to the host and parses it, checking its CRC and table hash (ValueError if the
        buffer was corrupted since)."""
        if self.layout == "raw":
            return None
        if self._table is _FROM_HEADER:  # validates the device's header (CRC, table hash)
            self._table = Header.unpack(self.header_bytes()).table
        return self._table  # type: ignore[return-value]

    @property
    def table_hash(self) -> int:
        """The table's 64-bit hash as the header stores it (``Codebook.hash64``); 0 for the
        raw layout."""
        table = self.table
        return _hash64(table) if table is not None else 0

    def header_bytes(self) -> bytes:
        """The buffer's 512-byte header (golden.container.Header), copied to the host (a sync on
        CUDA); ``golden.container.Header.unpack`` parses it."""
        return bytes(self._storage[:HEADER_BYTES].cpu().numpy())

    @property
    def checksummed(self) -> bool:
        """Whether the buffer carries a values checksum (``compress(..., checksum=True)``), which
        :func:`decompress` checks."""
        return self._checksum is not None

    @classmethod
    def _of(cls, buffer: torch.Tensor, head: Header) -> Compressed:
        sizes = (buffer.numel(), head.payload_bytes)
        shape = torch.Size(head.shape)
        dtype = _dtype(head.fmt)
        return cls(buffer, dtype, shape, head.block, sizes, head.table, checksum=head.checksum)

    @classmethod
    def from_buffer(cls, buf: torch.Tensor) -> Compressed:
        """A received buffer as a :class:`Compressed`: its header parsed and checked on the host.

        The header (magic, version, CRC-32, dtype, shape, block, table and its hash, payload
        size) is copied to the host (a sync on CUDA) and validated, and the buffer's length must
        be the one the header implies. The blocks themselves are checked when decoded
        (:func:`decompress`). The result's ``buffer`` is ``buf`` itself, not a copy.

        Args:
            buf (Tensor): a 1-D ``torch.uint8`` tensor holding exactly one compressed buffer,
                on any device.

        Returns:
            Compressed: with every property known (no further sync).

        Raises:
            TypeError: ``buf`` is not a 1-D ``torch.uint8`` tensor.
            ValueError: ``buf`` is shorter than the header, its header is corrupt
                (golden.streams.StreamError, a ValueError), or its length is not the header's
                (truncated or padded).

        Example::

            >>> c = zipccl.compress(torch.randn(1000))
            >>> zipccl.Compressed.from_buffer(c.buffer).shape
            torch.Size([1000])
            >>> zipccl.Compressed.from_buffer(torch.zeros(10, dtype=torch.uint8))
            Traceback (most recent call last):
                ...
            ValueError: buffer of 10 bytes is shorter than the header
        """
        if not isinstance(buf, torch.Tensor) or buf.dtype != torch.uint8 or buf.dim() != 1:
            raise TypeError("a compressed buffer is a 1-D torch.uint8 tensor")
        if buf.numel() < HEADER_BYTES:
            raise ValueError(f"buffer of {buf.numel()} bytes is shorter than the header")
        head = Header.unpack(bytes(buf[:HEADER_BYTES].cpu().numpy()))
        want = _expected_size(head)
        if buf.numel() != want:
            raise ValueError(
                f"buffer is {buf.numel()} bytes, header says {want} (truncated or padded)"
            )
        return cls._of(buf, head)


def _expected_size(head: Header) -> int:
    if head.layout == LAYOUT_RAW:
        return raw_size(head.fmt, head.numel)
    return split_size(head.fmt, head.numel, head.block, head.payload_bytes)


# ---------------------------------------------------------------------- backends
def _backend(device: torch.device, block: int) -> Codec:
    """CUDA tensors: the CUDA C++ kernels (the fast path); ``ZIPCCL_BACKEND=triton`` selects the
    Triton kernels (also on CPU tensors under TRITON_INTERPRET=1), ``=torch`` the torch ops.
    What each can do: zipccl._codecs."""
    return _backend_of(device.type, block)


def _backend_of(device_type: str, block: int) -> Codec:
    """:func:`_backend` by the device's type (the hot path has it without a device object)."""
    return _backend_for(device_type, block, settings.value("ZIPCCL_BACKEND"))


@functools.lru_cache(maxsize=32)
def _backend_for(device_type: str, block: int, choice: str) -> Codec:  # asked several times a call
    if choice == "triton":
        from zipccl import _triton

        return _triton
    if device_type == "cuda" and choice != "torch":
        from zipccl import _cuda

        if _cuda.supports(block) and _cuda.available():
            return _cuda
    return _torch


@functools.lru_cache(maxsize=64)
def _hash64(table: Codebook) -> int:
    return table.hash64


@functools.lru_cache(maxsize=256)
def _header_template(
    layout: int,
    fmt: FloatFormat,
    shape: tuple,
    block: int,
    table: Codebook | None,
    checksum: bool = False,
) -> bytes:
    """golden's header with payload_bytes = 0 (and, with ``checksum``, the checksum flag and a
    zero checksum); per call only those fields and the CRC change."""
    return Header(layout, fmt, shape, block, 0, table, 0 if checksum else None).pack()


def _pack_header(head: Header) -> bytes:
    """Header.pack() without re-hashing the table on every call (hot path)."""
    checked = head.checksum is not None
    data = bytearray(
        _header_template(head.layout, head.fmt, head.shape, head.block, head.table, checked)
    )
    struct.pack_into("<Q", data, PAYLOAD_BYTES_AT, head.payload_bytes)
    struct.pack_into("<Q", data, CHECKSUM_AT, head.checksum or 0)
    struct.pack_into("<I", data, CRC_AT, zlib.crc32(data[:CRC_AT]))
    return bytes(data)


def _values_checksum(x: torch.Tensor) -> int:
    """golden.container.values_checksum of a contiguous tensor's bytes, on the host (the host
    paths: a CUDA tensor's bytes are copied there)."""
    return values_checksum(x.reshape(-1).view(torch.uint8).cpu().numpy())


def _check_values(values: torch.Tensor, expected: int) -> None:
    """The host paths' check of decoded values against a header's checksum (ValueError, worded
    as the CUDA decoder's flag is)."""
    if _values_checksum(values) != expected:
        raise ValueError(f"corrupt compressed buffer: {CHECKSUM_MISMATCH}")


_STAGING: dict[torch.device, tuple[torch.Tensor, np.ndarray, torch.cuda.Event]] = {}


def _write_header(out: torch.Tensor, head: Header) -> None:
    """Copy the header in; on CUDA through one pinned staging buffer per device, reused once the
    previous copy out of it has run (an event guards it), so the copy itself is asynchronous."""
    data = np.frombuffer(_pack_header(head), dtype=np.uint8)
    if not out.is_cuda:
        out[:HEADER_BYTES].numpy()[:] = data
        return
    if out.device not in _STAGING:
        pinned = torch.empty(HEADER_BYTES, dtype=torch.uint8).pin_memory()
        _STAGING[out.device] = (pinned, pinned.numpy(), torch.cuda.Event())
    stage, host, done = _STAGING[out.device]
    done.synchronize()
    host[:] = data
    out[:HEADER_BYTES].copy_(stage, non_blocking=True)
    done.record(torch.cuda.current_stream(out.device))


def _check_input(tensor: torch.Tensor) -> FloatFormat:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"expected a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dim() > MAX_DIMS:
        raise ValueError(f"tensors of more than {MAX_DIMS} dimensions are not supported")
    return _fmt(tensor.dtype)


def _check_out(tensor: torch.Tensor, out: torch.Tensor, cap: int) -> None:
    if not isinstance(out, torch.Tensor) or out.dtype != torch.uint8 or out.dim() != 1:
        raise ValueError(f"out must be a 1-D uint8 tensor of at least {cap} bytes")
    if out.numel() < cap:
        raise ValueError(f"out must be a 1-D uint8 tensor of at least {cap} bytes")
    if out.device != tensor.device:
        raise ValueError(f"out is on {out.device}, the tensor on {tensor.device}")


_cuda = None  # zipccl._cuda once a CUDA tensor has been seen (its import needs torch.cuda)


def _device_codec(tensor: torch.Tensor, block: int):
    """zipccl._cuda where it codes ``tensor`` entirely on its device, else None. (On the hot
    path: ``is_cuda`` costs a fraction of ``tensor.device.type``.)"""
    global _cuda
    if not tensor.is_cuda:
        return None
    backend = _backend_of("cuda", block)
    if _cuda is None:
        from zipccl import _cuda as module

        _cuda = module
    return backend if backend is _cuda else None


def _compress_on_device(
    x: torch.Tensor,
    fmt: FloatFormat,
    table: TableSpec,
    block: int,
    out: torch.Tensor | None,
    cuda,
    checksum: bool,
) -> Compressed:
    """compress/compress_into with no host sync: the CUDA kernels build the default table (or
    take the given one), write the header (with the values checksum, summed while encoding), and
    choose the layout; the sizes stay on the device."""
    if not x.is_contiguous():
        x = x.contiguous()
    device, shape = x.device, x.shape  # (each read builds a new object: host time matters)
    plan = cuda.plan(fmt, shape, block, device, checksum)
    check = True if checksum else None
    if out is None:
        out = torch.empty(plan.meta_at + cuda.META_BYTES, dtype=torch.uint8, device=device)
        meta = (out, plan.meta_at)
    else:
        _check_out(x, out, plan.cap)
        meta = (torch.empty(cuda.META_BYTES, dtype=torch.uint8, device=device), 0)
    if not plan.split_possible:
        if checksum:
            cuda.seal_raw(x, plan, out)
        else:
            out[:HEADER_BYTES].copy_(plan.raw_head)
            out[HEADER_BYTES : plan.cap].copy_(x.reshape(-1).view(torch.uint8))
        return Compressed(out, x.dtype, x.shape, block, (plan.cap, 0), None, checksum=check)
    built_on_device = table is None or table == "theory"
    book = None if built_on_device else _resolve_table(x, table)
    header = (
        None
        if book is None
        else _header_template(LAYOUT_SPLIT, fmt, x.shape, block, book, checksum)
    )
    cuda.compress(x, plan, book, header, out, meta[0].data_ptr() + meta[1], device)
    table_of = _FROM_HEADER if book is None else book
    return Compressed(out, x.dtype, shape, block, None, table_of, meta, plan, check)


def compress_into(
    tensor: torch.Tensor,
    out: torch.Tensor,
    table: TableSpec = None,
    *,
    block: int = DEFAULT_BLOCK,
    checksum: bool = False,
) -> Compressed:
    """:func:`compress` into preallocated memory: no allocation for the buffer.

    The bytes, the layout choice and the CUDA behaviour are :func:`compress`'s; the result's
    ``buffer`` is the view ``out[:nbytes]``, so ``out`` must stay alive (and unmodified) while
    the result is used. On CUDA (the CUDA kernels, ``block`` <= 16384) nothing waits for the
    device: the size stays there until first read, in a small separate device allocation.

    Settings: ``ZIPCCL_BACKEND`` -- ``auto`` (default: the CUDA kernels on CUDA tensors, the
    torch ops elsewhere), ``torch`` (the torch ops everywhere) or ``triton`` (the Triton kernels;
    on CPU under ``TRITON_INTERPRET=1``); ``ZIPCCL_FAST=0`` turns off the CUDA kernels'
    byte-escape fast path. Neither changes the bytes; a value they do not accept raises
    ValueError naming it.

    Args:
        tensor (Tensor): as for :func:`compress`: ``bfloat16``, ``float16``, ``float32``,
            ``float8_e4m3fn`` or ``float8_e5m2``, at most 8 dimensions, any strides.
        out (Tensor): a 1-D ``torch.uint8`` tensor on the tensor's device of at least
            ``max_compressed_bytes(tensor.dtype, tensor.numel())`` bytes.
        table (Codebook or str, optional): None or ``"theory"`` (default), ``"histogram"``,
            or a golden.codebook.Codebook; see :func:`compress`.
        block (int, optional): elements per block, a power of two in [64, 1 << 20]
            (golden.container's ``MIN_BLOCK``, ``MAX_BLOCK``); default 4096.
        checksum (bool, optional): store the values checksum in the header, as for
            :func:`compress`; default False.

    Returns:
        Compressed: whose ``buffer`` is a view of ``out``.

    Raises:
        TypeError: as for :func:`compress` (not a tensor, dtype, ``table``).
        ValueError: ``out`` is not a 1-D uint8 tensor, is too small, or is on another device;
            more than 8 dimensions; a ``block`` out of range.

    Example::

        >>> x = torch.randn(1 << 14, dtype=torch.bfloat16)
        >>> out = torch.empty(zipccl.max_compressed_bytes(x.dtype, x.numel()), dtype=torch.uint8)
        >>> c = zipccl.compress_into(x, out)
        >>> c.buffer.data_ptr() == out.data_ptr(), c.nbytes < out.numel()
        (True, True)
        >>> torch.equal(zipccl.decompress(c), x)
        True
    """
    fmt = _check_input(tensor)
    _check_block(block)
    cuda = _device_codec(tensor, block)
    if cuda is not None:
        return _compress_on_device(tensor, fmt, table, block, out, cuda, checksum)
    numel = tensor.numel()
    cap = raw_size(fmt, numel)
    _check_out(tensor, out, cap)
    x = tensor.detach().contiguous()
    book = _resolve_table(x, table)
    shape = tuple(tensor.shape)
    check = _values_checksum(x) if checksum else None
    payload = None
    if _fixed(fmt, numel, block) < cap:
        backend = _backend(x.device, block)
        assert not backend.QUEUES  # (a queued codec took the device path above)
        payload = backend.encode_into(x, fmt, book, block, out)
    if payload is None or _fixed(fmt, numel, block) + payload >= cap:
        head = Header(LAYOUT_RAW, fmt, shape, block, 0, None, check)
        out[HEADER_BYTES:cap].copy_(x.reshape(-1).view(torch.uint8))
        size = cap
    else:
        head = Header(LAYOUT_SPLIT, fmt, shape, block, payload, book, check)
        size = _fixed(fmt, numel, block) + payload
    _write_header(out, head)
    return Compressed._of(out[:size], head)


def compress(
    tensor: torch.Tensor,
    table: TableSpec = None,
    *,
    block: int = DEFAULT_BLOCK,
    checksum: bool = False,
) -> Compressed:
    """Compress ``tensor`` losslessly into one golden/container.py buffer on its device.

    The buffer is self-describing: its 512-byte header holds the dtype, shape, block, table,
    payload size and a CRC-32, so :func:`decompress` (or golden.container.decode) needs nothing
    else and restores the tensor bit for bit. The values travel in the split layout -- the
    uncoded bits (sign and mantissa of BF16/FP16/FP32; none for FP8) and each symbol's 3-bit
    prefix as bit planes, the blocks' offsets, then the payload stream of the rest of each
    symbol's code (the symbol: the exponent field, or the FP8 byte) -- or, where that would not
    be smaller, in the raw layout (header + the values' bytes). The bytes are exactly
    ``golden.container.encode(bits, fmt, table, block)``'s, whichever backend writes them.

    On a CUDA tensor (with the CUDA kernels, the default there, and ``block`` <= 16384) the call
    only queues work on the current stream and returns: the kernels build the default table
    from the sample, encode, write the header and choose the layout, so nothing waits for the
    device and the call can be captured in a CUDA graph. The size stays on the device until
    ``nbytes`` (or ``buffer``, ``ratio``, ``layout``, ``payload_bytes``, ``table``,
    ``table_hash``) is first read: one host sync, once. ``table="histogram"`` syncs, and
    ``ZIPCCL_BACKEND=torch`` or ``triton``, or a larger block, take the host path, which syncs
    too. On CPU the call returns with everything known; it codes chunk by chunk of whole blocks
    (zipccl._torch), so it needs about the buffer's size in memory plus a few MiB
    (``block`` >= 65536: about 50 bytes per element of one block more).

    Settings: ``ZIPCCL_BACKEND`` -- ``auto`` (default: the CUDA kernels on CUDA tensors, the
    torch ops elsewhere), ``torch`` (the torch ops everywhere) or ``triton`` (the Triton kernels;
    on CPU under ``TRITON_INTERPRET=1``); ``ZIPCCL_FAST=0`` turns off the CUDA kernels'
    byte-escape fast path. Neither changes the bytes; a value they do not accept raises
    ValueError naming it.

    Args:
        tensor (Tensor): ``torch.bfloat16``, ``torch.float16``, ``torch.float32``,
            ``torch.float8_e4m3fn`` or ``torch.float8_e5m2``; at most 8 dimensions
            (golden.container's ``MAX_DIMS``), any number of elements (0 too), any strides (a
            non-contiguous tensor is coded from a contiguous copy), on CPU or CUDA. Only the
            values are read: autograd does not see the call.
        table (Codebook or str, optional): the code table.

            * None or ``"theory"`` (default): :func:`default_table` -- for BF16/FP16/FP32
              golden.theory's ZipCCL table from the statistics of a deterministic 65,536-value
              sample, for FP8 golden.builders.staircase_table of the sample's byte histogram;
              on CUDA built on the device, with golden's bytes;
            * ``"histogram"``: :func:`histogram_table` of the whole tensor (an extra pass and,
              on CUDA, a host sync; for FP8 an exhaustive table search);
            * a golden.codebook.Codebook: used as given (e.g. :func:`default_table` of another
              tensor, or a :class:`~zipccl.Calibrator`'s). Every table codes every value; a
              poor fit only costs ratio, down to the raw layout.
        block (int, optional): elements per block, a power of two in [64, 1 << 20]
            (golden.container's ``MIN_BLOCK``, ``MAX_BLOCK``); default ``DEFAULT_BLOCK`` = 4096.
            Blocks are coded independently; smaller ones add block offsets to the fixed part.
        checksum (bool, optional): store golden.container.values_checksum of the tensor's
            bytes in the header (its flag set), so that :func:`decompress` detects corruption
            the code alone cannot see -- a flipped sign, mantissa or in-region payload bit,
            which otherwise decodes silently to another value. On CUDA the encode kernel sums it
            from the values it reads (at 256 MiB 94-99 % of the throughput without it); on the
            host it is one more pass. Default False: the bytes are golden's plain buffer.

    Returns:
        Compressed: ``buffer`` (1-D ``torch.uint8`` on the tensor's device: on CPU exactly
        ``nbytes`` bytes of its own, on CUDA a view of one allocation of at least
        :func:`max_compressed_bytes`), ``nbytes``, ``ratio``, ``layout``, ``table``, ``dtype``,
        ``shape``, ``block``, ``checksummed``. To store it: ``torch.save(c)`` (keeps ``nbytes``
        bytes), :meth:`Compressed.to_bytes`, or ``torch.save(c.buffer)`` on CPU.

    Raises:
        TypeError: ``tensor`` is not a torch.Tensor; its dtype is not one of the five above;
            ``table`` is not None, ``"theory"``, ``"histogram"`` or a Codebook.
        ValueError: the tensor has more than 8 dimensions; ``block`` is not a power of two in
            [64, 1 << 20]; a malformed ``ZIPCCL_BACKEND`` or ``ZIPCCL_FAST``.

    Example::

        >>> x = torch.randn(1 << 14, dtype=torch.bfloat16)
        >>> c = zipccl.compress(x)
        >>> c.layout, c.ratio < 0.75  # about 0.72 here; 0.70 for 1M N(0, 1) BF16 values
        ('split', True)
        >>> c.buffer.dtype, c.nbytes <= zipccl.max_compressed_bytes(x.dtype, x.numel())
        (torch.uint8, True)
        >>> torch.equal(zipccl.decompress(c), x)
        True
        >>> c8 = zipccl.compress(x.to(torch.float8_e5m2), table="histogram", block=1024)
        >>> safe = zipccl.compress(x, checksum=True)  # decompress then checks the values too
        >>> safe.checksummed, safe.nbytes == c.nbytes
        (True, True)

    On CUDA the same call only queues work; the first read of a size waits for the device::

        >>> x = torch.randn(1 << 20, dtype=torch.bfloat16, device="cuda")  # doctest: +SKIP
        >>> c = zipccl.compress(x)  # doctest: +SKIP
        >>> n = c.nbytes  # doctest: +SKIP
    """
    fmt = _check_input(tensor)
    _check_block(block)
    cuda = _device_codec(tensor, block)
    if cuda is not None:
        return _compress_on_device(tensor, fmt, table, block, None, cuda, checksum)
    out = torch.empty(raw_size(fmt, tensor.numel()), dtype=torch.uint8, device=tensor.device)
    c = compress_into(tensor, out, table, block=block, checksum=checksum)
    if c.nbytes < out.numel():  # own exactly the compressed bytes (torch.save stores a storage)
        c._storage = c._storage.clone()
    return c


_PENDING: dict[torch.device, torch.Tensor] = {}  # per device: decode errors of sync=False calls


def _pending_flag(device: torch.device) -> torch.Tensor:
    flag = _PENDING.get(device)
    if flag is None:
        flag = _PENDING[device] = torch.zeros(1, dtype=torch.int32, device=device)
    return flag


def _indexed(device: torch.device) -> torch.device:
    """``"cuda"`` as the device it means now ("cuda:0", ...), the key tensors' devices have."""
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def check_errors(device: torch.device | str | None = None) -> None:
    """Raise what ``decompress(..., sync=False)`` calls found wrong since the last check.

    ``decompress(c, sync=False)`` on CUDA records a corrupt buffer's problems in one int32 flag
    per device instead of raising; this reads the flag (a host sync: it waits for the decodes
    queued so far), clears it and raises once for all of them. A device on which no decode was
    ever queued that way (CPU tensors, other backends) is not read: it returns at once.

    Args:
        device (torch.device or str, optional): the device whose decodes to check (``"cuda"``
            means the current CUDA device); None (default): every device that has had one.

    Returns:
        None

    Raises:
        ValueError: ``"corrupt compressed buffer: "`` and what the decoders found (block
            offsets out of order, a payload size that disagrees with the prefix planes, an
            illegal codeword, non-zero padding); the flag is cleared first.

    Example::

        >>> c = zipccl.compress(torch.randn(4096))
        >>> y = zipccl.decompress(c, sync=False)  # on CUDA: queued, unchecked
        >>> zipccl.check_errors()  # raises here if that buffer was corrupt
    """
    devices = list(_PENDING) if device is None else [_indexed(torch.device(device))]
    for dev in devices:
        flag = _PENDING.get(dev)
        code = int(flag.item()) if flag is not None else 0
        if code and flag is not None:  # (code is 0 without a flag)
            flag.zero_()
            from zipccl._cuda import raise_on_flag

            raise_on_flag(code)


def decompress(
    c: Compressed | torch.Tensor, out: torch.Tensor | None = None, *, sync: bool = True
) -> torch.Tensor:
    """Decompress to a new tensor, or into ``out``: a bit-exact copy of the compressed one.

    Every block's structure is checked (offsets, payload size, illegal codewords, padding,
    alignment gaps; on the host also the exact canonical form the encoder writes), so corruption
    that breaks the code raises. A flipped bit that leaves the code legal -- in the sign or mantissa
    planes, say -- decodes to another value unless the buffer carries the values checksum
    (``compress(..., checksum=True)``), which is then checked against the decoded values (on CUDA
    by the decode kernel itself), so that every corruption raises. ``sync=True``
    (default) raises before returning (on CUDA one host sync). ``sync=False`` on CUDA (the CUDA
    kernels) only queues the decode, on the current stream: problems are recorded on the device and
    raised by the next :func:`check_errors`, and the output of a corrupt buffer is undefined until
    then; together with :func:`compress` the pair can be captured in a CUDA graph. Elsewhere
    ``sync=False`` decodes and checks as ``sync=True`` does. A bare uint8 buffer is first parsed by
    :meth:`Compressed.from_buffer` (its header copied to the host and checked: a sync on CUDA); a
    :class:`Compressed` from :func:`compress` needs no host read of its size. On the host the
    decode, and its canonical-form check (one more encode), run chunk by chunk of whole blocks:
    besides the output, about the buffer's size in memory plus a few MiB; a corrupt buffer may
    leave ``out`` partly written before the ValueError.

    Settings: ``ZIPCCL_BACKEND`` and ``ZIPCCL_FAST`` choose the decoder as for :func:`compress`
    (same results), except that a Compressed the CUDA kernels made is decoded by them.

    Args:
        c (Compressed or Tensor): what :func:`compress`, :func:`compress_into` or
            :meth:`Compressed.from_buffer` returned, or a 1-D ``torch.uint8`` tensor holding
            exactly one compressed buffer (e.g. ``c.buffer`` after a send), on CPU or CUDA.
        out (Tensor, optional): where to decode: the buffer's dtype and number of elements
            (any shape; strided is fine: decoded contiguous, then copied), on the buffer's
            device. Default: a new contiguous tensor of the buffer's shape.
        sync (bool, optional): True (default) to raise on a corrupt buffer before returning;
            False to leave that to :func:`check_errors` (CUDA).

    Returns:
        Tensor: ``out``, or the new tensor (the original dtype and shape, on the buffer's
        device).

    Raises:
        TypeError: ``c`` is neither a Compressed nor a tensor, or a tensor that is not 1-D
            ``torch.uint8``.
        ValueError: a corrupt or truncated buffer (a bad header is golden.streams.StreamError,
            a ValueError; a values checksum mismatch says so); ``out`` of another dtype, element
            count or device; ``sync=True`` on CUDA inside a CUDA graph capture.

    Example::

        >>> x = torch.randn(128, 128).to(torch.float8_e4m3fn)
        >>> c = zipccl.compress(x)
        >>> y = zipccl.decompress(c)
        >>> y.dtype, y.shape, torch.equal(y.view(torch.uint8), x.view(torch.uint8))
        (torch.float8_e4m3fn, torch.Size([128, 128]), True)
        >>> out = torch.empty_like(x)
        >>> zipccl.decompress(c.buffer, out=out) is out  # a received buffer, decoded in place
        True
        >>> bad = c.buffer.clone()
        >>> bad[8] ^= 1  # a flipped header bit
        >>> zipccl.decompress(bad)
        Traceback (most recent call last):
            ...
        zipccl.golden.streams.StreamError: header checksum mismatch: the buffer is corrupt

    On CUDA, the queued form (nothing waits for the device until :func:`check_errors`)::

        >>> zipccl.decompress(c, out=y, sync=False)  # doctest: +SKIP
        >>> zipccl.check_errors()  # ValueError if c was corrupt  # doctest: +SKIP
    """
    if isinstance(c, torch.Tensor):
        c = Compressed.from_buffer(c)
    if not isinstance(c, Compressed):
        raise TypeError(f"expected a Compressed or a uint8 tensor, got {type(c).__name__}")
    device = c._storage.device
    if out is None:
        out = torch.empty(c.shape, dtype=c.dtype, device=device)
    elif out.dtype != c.dtype or out.numel() != c.numel or out.device != device:
        raise ValueError(
            f"out must be {c.dtype} with {c.numel} elements on {device}, got "
            f"{out.dtype} with {out.numel()} on {out.device}"
        )
    contiguous = out.is_contiguous()
    target = out if contiguous else torch.empty_like(out, memory_format=torch.contiguous_format)
    if c._plan is not None:
        _decompress_on_device(c, target, sync)
    else:
        _decompress_known(c, target, sync)
    if target is not out:
        out.copy_(target)
    return out


def _decompress_on_device(c: Compressed, target: torch.Tensor, sync: bool) -> None:
    """A buffer the device compressed: its layout and payload size are read there."""
    book = None if c._table is _FROM_HEADER else c._table
    meta, at = c._meta  # type: ignore[misc]
    assert _cuda is not None  # loaded: the device compressed c with it
    flag = _decode_flag(_cuda, target.device, sync)
    code = _cuda.decompress(
        c._storage, c._plan, book, meta.data_ptr() + at, target, flag, False, sync
    )
    _cuda.raise_on_flag(code)


def _decode_flag(cuda, device: torch.device, sync: bool) -> torch.Tensor:
    """Where a CUDA decode records problems: a validating one (``sync``, which waits and reads
    it in the same call) in its thread's flag, a queued one in the device's pending flag
    (:func:`check_errors`); both are zero between calls."""
    return cuda.wait_flag(device) if sync else _pending_flag(device)


def _decompress_known(c: Compressed, target: torch.Tensor, sync: bool) -> None:
    """A buffer whose header the host has read. The CUDA kernels check a values checksum as they
    decode (also a raw buffer's, as they copy it); the host paths check it after decoding."""
    buf, fmt = c.buffer, _fmt(c.dtype)
    cuda = _device_codec(buf, c.block)
    if cuda is not None and (c.layout == "split" or c.checksummed):
        flag = _decode_flag(cuda, buf.device, sync)
        if c.layout == "raw":
            code = cuda.launch_raw_decode(buf, fmt, target, flag, wait=sync)
        else:
            assert c.table is not None
            table, checked = c.table, c.checksummed
            code = cuda.launch_decode(
                buf, fmt, table, c.block, c.payload_bytes, target, flag, checksum=checked, wait=sync
            )
        cuda.raise_on_flag(code)
        return
    if c.layout == "raw":
        target.view(-1).view(torch.uint8).copy_(buf[HEADER_BYTES:])
    else:
        assert c.table is not None
        backend = _backend(buf.device, c.block)
        assert not backend.QUEUES  # (a queued codec took the branch above)
        backend.decode_into(buf, fmt, c.table, c.block, c.payload_bytes, target)
        if not buf.is_cuda:  # one more encode: the host path checks canonical form this way
            _torch.check_canonical(buf, fmt, c.table, c.block, c.payload_bytes, target)
    expected = c._checksum
    if expected is not None:
        assert expected is not True  # (its value is on the device: the kernels above check it)
        _check_values(target, expected)
