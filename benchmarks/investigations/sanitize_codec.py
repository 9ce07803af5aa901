"""Every dtype through the CUDA codec's public calls -- small, odd and block-multiple sizes, with
and without the values checksum -- for compute-sanitizer to watch:

    compute-sanitizer --tool memcheck --error-exitcode 9 \
        python3 benchmarks/investigations/sanitize_codec.py
    compute-sanitizer --tool racecheck --error-exitcode 9 \
        python3 benchmarks/investigations/sanitize_codec.py

Each round trip must be bit-exact; prints ``ok``.
"""

from __future__ import annotations

import argparse

import torch
import zipccl

DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn, torch.float8_e5m2)
SIZES = (1, 4095, 4096 * 3 + 17, 1 << 18)


def main() -> None:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    for dtype in DTYPES:
        for n in SIZES:
            x = torch.randn(n, device="cuda", generator=gen)
            x = (x / x.abs().max() * 200).to(dtype) if dtype.itemsize == 1 else x.to(dtype)
            for checksum in (False, True):
                y = zipccl.decompress(zipccl.compress(x, checksum=checksum))
                assert torch.equal(y.view(torch.uint8), x.view(torch.uint8)), (dtype, n, checksum)
    print("ok")


if __name__ == "__main__":
    main()
