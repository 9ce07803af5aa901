"""A training-free script for tests/test_zero_code.py, launched by zipccl-run: what each rank's
groups are and report; writes ``{argv[1]}.{rank}.json``. It imports no zipccl (as a user's
script) until it reports."""

import json
import os
import sys

import torch
import torch.distributed as dist


def main(out: str) -> None:
    dist.init_process_group(os.environ.get("PROBE_BACKEND") or None)
    sub = dist.new_group()  # the default group's backend
    gloo = dist.new_group(backend="gloo")
    t = torch.arange(4096, dtype=torch.float32).to(torch.bfloat16)
    dist.all_reduce(t)
    dist.all_reduce(t, group=sub)
    import zipccl  # only to look: the groups were made without it

    found = {
        "backend": str(dist.get_backend()),
        "name": dist.group.WORLD.name(),
        "sub_backend": str(dist.get_backend(sub)),
        "gloo_backend": str(dist.get_backend(gloo)),
        "zipccl": [isinstance(g, zipccl.ProcessGroupZipccl) for g in (dist.group.WORLD, sub, gloo)],
        "sum_ok": bool(torch.equal(t.float(), torch.arange(4096.0).bfloat16().float() * 4)),
        "report": zipccl.stats().as_dict(),
        "chained": os.environ.get("PROBE_CHAINED", ""),
    }
    with open(f"{out}.{dist.get_rank()}.json", "w") as f:
        json.dump(found, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
