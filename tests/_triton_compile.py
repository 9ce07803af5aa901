"""Compile zipccl._triton's kernels for sm_90 (H100/H200) on a machine without a GPU.

The interpreter checks what the kernels compute, not that the compiler accepts them (types,
shapes, constexpr branches); ``triton.compile`` runs the whole pipeline down to ptxas without a
device. Run with TRITON_INTERPRET unset: ``python -m tests._triton_compile [BLOCK ...]``.
"""

from __future__ import annotations

import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.interpreter import InterpretedFunction
from zipccl import _triton
from zipccl.golden.formats import FORMATS, FloatFormat

TARGET = GPUTarget("cuda", 90, 32)
BITS = {8: "*u8", 16: "*i16", 32: "*i32"}
NON_CONSTEXPR = {
    "out_ptr": "*u8",
    "buf_ptr": "*u8",
    "sec_ptr": "*i64",
    "table_ptr": "*i32",
    "bits_ptr": "*i64",
    "scratch_ptr": "*i32",
    "stray_ptr": "*i32",
    "offsets_ptr": "*i64",
    "nbytes_ptr": "*i64",
    "flags_ptr": "*i32",
    "n": "i64",
    "plane_len": "i64",
    "payload_at": "i64",
    "payload_bytes": "i64",
    "num_ranked": "i32",
}


def compile_all(fmt: FloatFormat, block: int) -> None:
    """Every kernel as encode_into/decode_into launch it for this format and block."""
    args = {**_triton._format_args(fmt), "BLOCK": block}
    data = {"x_ptr": BITS[fmt.bits]}
    launches = [
        (_triton._encode_blocks, data, args),
        (_triton._compact, {}, {"BLOCK": block}),
        (
            _triton._decode_counts,
            {},
            {"FIRST": args["RAW_BYTES"] + args["RAW_PLANES"], "BLOCK": block},
        ),
        (_triton._decode_blocks, {"out_ptr": BITS[fmt.bits]}, args),
    ]
    for kernel, types, constants in launches:
        kinds = {**NON_CONSTEXPR, **types}
        signature = {a: kinds.get(a, "constexpr") for a in kernel.arg_names}
        source = ASTSource(
            kernel, signature, {k: constants[k] for k in signature if signature[k] == "constexpr"}
        )
        triton.compile(source, target=TARGET, options={"num_warps": _triton._warps(block)})


def main(blocks: list[int]) -> None:
    if isinstance(_triton._encode_blocks, InterpretedFunction):
        sys.exit("unset TRITON_INTERPRET: the interpreter does not compile")
    for block in blocks:
        for fmt in FORMATS.values():
            compile_all(fmt, block)
            print(f"compiled {fmt.name} block {block} for sm_{TARGET.arch}")


if __name__ == "__main__":
    main([int(b) for b in sys.argv[1:]] or [4096])
