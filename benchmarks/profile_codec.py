"""One compress + decompress per case, for a profiler (ncu) to attach to: BF16 and FP8, 256 MiB.

    ncu --clock-control none -k regex:'encode|decode|scan|compact' \
        python benchmarks/profile_codec.py
"""

from __future__ import annotations

import torch
import zipccl

MIB = 1 << 20


def main() -> None:
    for dtype in (torch.bfloat16, torch.float8_e4m3fn):
        n = 256 * MIB // torch.tensor([], dtype=dtype).element_size()
        x = (torch.randn(n, device="cuda") * (1.0 if dtype == torch.bfloat16 else 20.0)).to(dtype)
        table = zipccl.histogram_table(x) if dtype == torch.float8_e4m3fn else None
        c = zipccl.compress(x, table)
        y = zipccl.decompress(c)
        assert torch.equal(y.view(torch.uint8), x.view(torch.uint8))
        torch.cuda.synchronize()
        print(dtype, "ratio", round(c.ratio, 4), flush=True)


if __name__ == "__main__":
    main()
