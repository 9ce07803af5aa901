"""Which gloo round carries zipccl's descriptor exchange best: the median latency of one small
round between two CPU processes, for each way gloo offers to swap a row.

``p2p``: a send and a receive to the peer (two ranks only); ``all_gather``: the row gathered;
``all_to_all``: the row's copies swapped (what _exchange._swap_rows does); against gloo's own
``broadcast`` and ``all_reduce`` of a 4 KiB BF16 tensor, the calls the exchange precedes. A
round's latency can differ between process groups (gloo's point-to-point sends stalled ~4 ms a
call in some), so run it several times, one op per launch::

    for run in 1 2 3 4 5; do for op in p2p all_gather all_to_all broadcast all_reduce; do
      OMP_NUM_THREADS=1 torchrun --nproc-per-node 2 \\
        -m benchmarks.investigations.gloo_rounds --op $op; done; done

Each launch prints one JSON line: the op and its median microseconds over ``--calls`` calls.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

ROW_WORDS = 784  # int64 words of a 2-rank descriptor row with its summary and 4 KiB of input


OPS = ("p2p", "all_gather", "all_to_all", "broadcast", "all_reduce")


def rounds(rank: int, world: int, words: int) -> dict[str, Callable[[], object]]:
    pg = dist.group.WORLD
    assert pg is not None
    row = torch.zeros(words, dtype=torch.int64)
    table = torch.zeros(world * words, dtype=torch.int64)
    copies = row.repeat(world)
    x = torch.randn(2048).to(torch.bfloat16)
    peer = 1 - rank

    def p2p() -> None:
        sent = pg.send([row], peer, 7)
        received = pg.recv([table.view(world, -1)[peer]], peer, 7)
        sent.wait()
        received.wait()

    return {
        "p2p": p2p,
        "all_gather": lambda: dist.all_gather_into_tensor(table, row),
        "all_to_all": lambda: pg.alltoall_base(table, copies, [], []).wait(),
        "broadcast": lambda: dist.broadcast(x, 0),
        "all_reduce": lambda: dist.all_reduce(x),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--op", required=True, choices=OPS)
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--words", type=int, default=ROW_WORDS, help="int64 words in a row")
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if world != 2:
        raise SystemExit("gloo_rounds: run it on two processes (--nproc-per-node 2)")
    fn = rounds(rank, world, args.words)[args.op]
    times = []
    for _ in range(args.calls + 30):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    if rank == 0:
        median_us = 1e6 * statistics.median(times[30:])
        result = {"op": args.op, "words": args.words, "median_us": round(median_us, 1)}
        print(json.dumps(result), flush=True)
    dist.barrier()  # leave together: gloo can abort a rank whose peer tears down first
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
