"""Does one gloo call move its bytes faster split across several gloo groups of the same ranks?

A gloo group moves one collective's bytes over one TCP connection per peer pair, served by one
loop thread; zipccl's backend already runs several *calls* at once on groups of their own (its
lanes, zipccl._lanes). This asks the same of one call: its host buffer cut into ``K`` contiguous
stripes, stripe k moved on group k, all ``K`` in flight at once, against the whole buffer on
one group, against the same ``K`` stripes all in flight on one group (``K on one``), and
against gloo's own handling of the CUDA tensor (``cuda``: what torch does with a
CUDA tensor on a gloo group, its staging included). Pinned host buffers, as the host-staged
transport's; every stripe's result checked against the one-group result (an all-reduce of two
ranks is bit-identical however it is cut: a + b is b + a)::

    torchrun --nproc-per-node 2 -m benchmarks.investigations.gloo_stripes --mib 4 16 64

Each (op, MiB, stripes) prints one JSON line: the median milliseconds over ``--reps`` calls,
interleaved with the other stripe counts' (so a slow moment of the machine hits all alike).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

OPS = ("all_to_all", "all_reduce", "broadcast")


def _issue(op: str, buf: torch.Tensor, out: torch.Tensor, group: dist.ProcessGroup) -> dist.Work:
    if op == "all_to_all":
        return dist.all_to_all_single(out, buf, group=group, async_op=True)
    if op == "all_reduce":
        return dist.all_reduce(buf, group=group, async_op=True)
    return dist.broadcast(buf, 0, group=group, async_op=True)


class Striped:
    """The call with its buffer cut into len(groups) stripes, all in flight at once. An
    all-to-all's stripe k holds slice k of every rank's piece (as a staged transport would lay
    out its host buffer when copying down), in a buffer of its own."""

    def __init__(self, op: str, source: torch.Tensor, groups: list[dist.ProcessGroup]) -> None:
        self.op, self.groups, self.world = op, groups, dist.get_world_size()
        self.source = source
        pinned = torch.cuda.is_available()
        k = len(groups)
        self.ins = [
            torch.empty(source.numel() // k, dtype=source.dtype, pin_memory=pinned)
            for _ in range(k)
        ]
        self.outs = [torch.empty_like(b) for b in self.ins] if op == "all_to_all" else self.ins

    def reset(self) -> None:
        """The input laid out in stripes (untimed: an all-reduce sums in place)."""
        k = len(self.groups)
        for i, part in enumerate(self.source.view(self.world, k, -1).unbind(1)):
            self.ins[i].view(self.world, -1).copy_(part)

    def __call__(self) -> None:
        works = [
            _issue(self.op, b, o, g)
            for b, o, g in zip(self.ins, self.outs, self.groups, strict=True)
        ]
        for w in works:
            w.wait()

    def result(self) -> torch.Tensor:
        """The result in the unstriped layout."""
        parts = [o.view(self.world, -1) for o in self.outs]
        return torch.stack(parts, dim=1).reshape(-1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, nargs="+", default=[4, 16, 64])
    parser.add_argument("--stripes", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--ops", nargs="+", default=list(OPS), choices=OPS)
    parser.add_argument("--reps", type=int, default=15)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(0)
    groups = [dist.new_group(backend="gloo") for _ in range(max(args.stripes))]
    for op in args.ops:
        for mib in args.mib:
            numel = (mib << 20) // 2
            gen = torch.Generator().manual_seed(rank)
            source = torch.randn(numel, generator=gen).to(torch.bfloat16)
            calls: dict[str, Callable[[], object]] = {}
            resets: dict[str, Callable[[], object]] = {}
            results: dict[str, Callable[[], torch.Tensor]] = {}
            for k in args.stripes:
                variants = [(str(k), groups[:k])] + (
                    [(f"{k} on one", groups[:1] * k)] if k > 1 else []
                )
                for name, on in variants:
                    s = Striped(op, source, on)
                    calls[name], resets[name], results[name] = s, s.reset, s.result
            if cuda:
                dev = source.cuda()
                dev_out = torch.empty_like(dev)
                calls["cuda"] = lambda op=op, d=dev, o=dev_out: _issue(op, d, o, groups[0]).wait()
                resets["cuda"] = lambda d=dev, s=source: d.copy_(s)
                results["cuda"] = lambda op=op, d=dev, o=dev_out: (
                    o if op == "all_to_all" else d
                ).cpu()
            times: dict[str, list[float]] = {name: [] for name in calls}
            for _ in range(args.reps):
                for name, call in calls.items():
                    resets[name]()
                    if cuda:
                        torch.cuda.synchronize()
                    dist.barrier(groups[0])
                    start = time.perf_counter()
                    call()
                    if cuda:
                        torch.cuda.synchronize()
                    times[name].append(time.perf_counter() - start)
            reference = results["1"]()
            for name in calls:
                if not torch.equal(results[name]().view(torch.int16), reference.view(torch.int16)):
                    raise SystemExit(f"{op} {mib} MiB, {name}: result differs from one group's")
                if rank == 0:
                    ms = 1e3 * statistics.median(times[name])
                    row = {"op": op, "mib": mib, "stripes": name, "ms": round(ms, 3)}
                    print(json.dumps(row), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
