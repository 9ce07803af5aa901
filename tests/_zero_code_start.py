"""One rank of tests/test_zero_code.py's start-failure test: ``rank store fault`` on argv;
``fault`` on rank 1 makes its zipccl group fail while it starts (``plan``: before any inner group
connects; ``inner``: after). Prints what init_process_group raised and how long it took."""

import sys
import time
from datetime import timedelta

import torch.distributed as dist
import zipccl.backend


def _boom(*_: object) -> None:
    raise RuntimeError("injected start failure")


def main(rank: int, store: str, fault: str) -> None:
    if rank == 1 and fault == "plan":
        zipccl.backend._plan = _boom  # type: ignore[assignment]
    if rank == 1 and fault == "inner":
        zipccl.backend.ProcessGroupZipccl._register_backend = _boom  # type: ignore[method-assign]
    start = time.monotonic()
    try:
        dist.init_process_group(
            "zipccl",
            store=dist.FileStore(store, 2),
            rank=rank,
            world_size=2,
            timeout=timedelta(seconds=120),  # far longer than the test waits
        )
        outcome = "started"
    except Exception as error:
        outcome = f"{type(error).__name__}: {error}"
    print(f"{time.monotonic() - start:.1f}|{outcome}", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2], sys.argv[3])
