"""Which gloo round carries zipccl's descriptor exchange best: the median latency of one small
round between two CPU processes, for each way gloo offers to swap a row.

``p2p``: a send and a receive to the peer (two ranks only); ``all_gather``: the row gathered;
``all_to_all``: the row's copies swapped (what _exchange._swap_rows does); against gloo's own
``broadcast`` and ``all_reduce`` of a 4 KiB BF16 tensor, the calls the exchange precedes; and
``bare_exchange``, what a 4 KiB all-to-all costs when it rides in the exchange with none of
zipccl's Python -- the input copied into the row, the row's copies, the round, the rows checked
alike in numpy, the output copied out -- against ``torch_all_to_all``, torch's own. A
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


OPS = ("p2p", "all_gather", "all_to_all", "broadcast", "all_reduce", "bare_exchange")
OPS += ("torch_all_to_all",)


HEAD_WORDS = 200  # the descriptor and summary words of a row, before its room for input


def rounds(rank: int, world: int, words: int) -> dict[str, Callable[[], object]]:
    pg = dist.group.WORLD
    assert pg is not None
    row = torch.zeros(words, dtype=torch.int64)
    table = torch.zeros(world * words, dtype=torch.int64)
    copies = row.repeat(world)
    x = torch.randn(2048).to(torch.bfloat16)
    peer = 1 - rank
    out = torch.empty_like(x)
    slots, received = copies.numpy().reshape(world, words), table.numpy().reshape(world, words)
    head = slots[0, :HEAD_WORDS].copy()
    room = copies[words - 512 : words].view(torch.uint8)  # 4 KiB of input at the row's end
    mine = x.numel() * 2 // world  # bytes of each rank's input that go to one rank
    inputs = table.view(torch.uint8).view(world, 8 * words)[:, 8 * (words - 512) :]
    piece = inputs[:, rank * mine : (rank + 1) * mine]

    def bare_exchange() -> None:
        slots[0, :HEAD_WORDS] = head
        room.copy_(x.view(torch.uint8))
        slots[1:] = slots[0]
        pg.alltoall_base(table, copies, [], []).wait()
        if not (received[:, :HEAD_WORDS] == head).all():
            raise RuntimeError("rows differ")
        out.view(torch.uint8).view(world, mine).copy_(piece)

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
        "bare_exchange": bare_exchange,
        "torch_all_to_all": lambda: dist.all_to_all_single(out, x),
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
