"""The floating-point formats the codecs accept, and how each splits into symbol and raw bits.

Exponent-coded formats (BF16, FP16, FP32) region-code the biased exponent field and store the
sign and mantissa raw as ``raw = sign << mant_bits | mantissa``. Byte-coded formats (FP8) region-
code the whole byte and have no raw part.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class FloatFormat:
    name: str
    code: int  # the dtype code carried in compressed-buffer headers
    bits: int
    exp_bits: int
    mant_bits: int
    byte_coded: bool

    @property
    def uint(self) -> type[np.unsignedinteger]:
        uints: dict[int, type[np.unsignedinteger]] = {8: np.uint8, 16: np.uint16, 32: np.uint32}
        return uints[self.bits]

    @property
    def raw_bits(self) -> int:
        """Bits per element stored outside the region code (sign + mantissa)."""
        return 0 if self.byte_coded else 1 + self.mant_bits

    @property
    def exp_bias(self) -> int:
        return (1 << (self.exp_bits - 1)) - 1

    def symbols(self, bits: np.ndarray) -> np.ndarray:
        """The 8-bit symbols the region code sees: the biased exponent, or the whole byte."""
        bits = bits.astype(np.uint32)
        if self.byte_coded:
            return bits.astype(np.uint8)
        return ((bits >> self.mant_bits) & ((1 << self.exp_bits) - 1)).astype(np.uint8)

    def raw(self, bits: np.ndarray) -> np.ndarray:
        bits = bits.astype(np.uint32)
        sign = bits >> (self.bits - 1)
        return (sign << self.mant_bits) | (bits & ((1 << self.mant_bits) - 1))

    def join(self, symbols: np.ndarray, raw: np.ndarray) -> np.ndarray:
        """Inverse of (symbols, raw): the original bit patterns."""
        if self.byte_coded:
            return symbols.astype(self.uint)
        raw = raw.astype(np.uint32)
        sign = raw >> self.mant_bits
        mant = raw & ((1 << self.mant_bits) - 1)
        exp = symbols.astype(np.uint32)
        return ((sign << (self.bits - 1)) | (exp << self.mant_bits) | mant).astype(self.uint)


BF16 = FloatFormat("bfloat16", 1, 16, 8, 7, False)
FP16 = FloatFormat("float16", 2, 16, 5, 10, False)
FP32 = FloatFormat("float32", 3, 32, 8, 23, False)
E4M3 = FloatFormat("float8_e4m3fn", 4, 8, 4, 3, True)
E5M2 = FloatFormat("float8_e5m2", 5, 8, 5, 2, True)

FORMATS: dict[str, FloatFormat] = {f.name: f for f in (BF16, FP16, FP32, E4M3, E5M2)}
BY_CODE: dict[int, FloatFormat] = {f.code: f for f in FORMATS.values()}


def get_format(name: str) -> FloatFormat:
    try:
        return FORMATS[name]
    except KeyError:
        raise TypeError(f"unsupported dtype {name!r}; expected one of {sorted(FORMATS)}") from None
