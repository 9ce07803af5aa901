"""An expert-parallel MoE layer step, forward and backward, through native torch.distributed
all-to-all and through zipccl.all_to_all_single, checked bit for bit against each other.

On the 2-GPU machine (nvidia-h200-x2), one launch per transport (NCCL reads its transport
variables once per process group), each into its own folder::

    export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
    torchrun --nproc-per-node 2 benchmarks/moe.py --out OUT/nvlink
    NCCL_P2P_DISABLE=1 torchrun --nproc-per-node 2 benchmarks/moe.py --out OUT/shm
    NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 torchrun --nproc-per-node 2 benchmarks/moe.py \
        --out OUT/socket

(each line with the ``export`` above in the same shell; ``--mode always`` forces the compressed
protocol, default ``ZIPCCL_MODE`` or ``auto``). A gloo smoke test on CPU::

    OMP_NUM_THREADS=1 torchrun --nproc-per-node 2 benchmarks/moe.py --device cpu --out OUT

The layer, on W ranks with E experts (E / W per rank, contiguous): a router (fp32 logits plus a
fixed per-expert bias ``-skew * log(1 + r)``, r a seeded permutation of 0..E-1, so load is
Zipf-like with a few hot experts) picks the top-k experts per token; the (token, expert) rows,
sorted by expert, are dispatched in FP8 e4m3 with a per-row absmax scale (float32, its 4 bytes
packed at the end of the row: one collective per dispatch, as DeepEP-style code does); each
rank runs its experts (SiLU MLP, BF16) and the outputs return (combine) in BF16, weighted by the
gates. Split sizes go first in a tiny int64 all-to-all of per-expert counts. Backward: the
combine's gradient goes back in BF16, and so does the dispatch's (the quantisation is a
straight-through estimator; BF16 keeps the gradients exact to the layer's own precision, and it
is what zipccl's BF16 coding compresses). Variant (a) calls torch.distributed.all_to_all_single,
(b) zipccl.all_to_all_single, with identical inputs and parameters; every step's output, input
gradient and parameter gradients must be bit-identical on every rank, else the run fails.

Per variant: median step time (forward + backward; CUDA events, wall clock on CPU) after
``--warmup`` steps, interleaved step by step, and the share inside the all-to-alls (events
around each call); for zipccl the bytes each rank put on the wire per collective (WireStats
where it compressed, the raw bytes to other ranks otherwise), and the speed-up native / zipccl;
written to ``OUT/moe.json``. Two dispatch ratios: ``dispatch_ratio``, zipccl.compress's size of
the FP8 pieces for other ranks over their raw bytes (the tokens' own compressibility), and
``dispatch_wire_ratio``, the protocol's wire bytes over raw, which adds the slots' margins and,
between two ranks (one all-gather of both pieces, each as wide as the wider), the padding that
skewed splits cost.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
import zipccl
from timing import recorded
from zipccl import switch
from zipccl.collectives import STATS

E4M3 = torch.float8_e4m3fn
E4M3_MAX = torch.finfo(E4M3).max
ENV = (
    "ZIPCCL_MODE",
    "NCCL_P2P_DISABLE",
    "NCCL_SHM_DISABLE",
    "NCCL_NVLS_ENABLE",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST",
    "NVSHMEM_DISABLE_NVLS",
    "NCCL_ALGO",
    "NCCL_PROTO",
)
TAGS = ("splits", "dispatch", "combine", "combine_grad", "dispatch_grad")


@dataclass
class Comm:
    """The layer's all-to-alls through one library, with their times and wire bytes."""

    lib: object  # torch.distributed or zipccl: the same all_to_all_single signature
    rank: int
    cuda: bool
    spans: list[tuple[object, object]] = field(default_factory=list)
    wire: dict[str, int] = field(default_factory=dict)
    raw: dict[str, int] = field(default_factory=dict)
    strategy: dict[str, str] = field(default_factory=dict)
    dispatched: tuple[torch.Tensor, list[int]] | None = None  # the last packed FP8 rows, splits

    def mark(self) -> object:
        return recorded() if self.cuda else time.perf_counter()

    def a2a(
        self,
        out: torch.Tensor,
        inp: torch.Tensor,
        out_splits: list[int] | None,
        in_splits: list[int] | None,
        tag: str,
        fp8: bool = False,
    ) -> None:
        """One all-to-all; ``fp8``: uint8 rows that zipccl sees as e4m3 (torch moves bytes)."""
        zipped = self.lib is zipccl
        if zipped and fp8:
            out, inp = out.view(E4M3), inp.view(E4M3)
        STATS.reset()
        start = self.mark()
        self.lib.all_to_all_single(out, inp, out_splits, in_splits)
        self.spans.append((start, self.mark()))
        rows = inp.shape[0]
        own = in_splits[self.rank] if in_splits else rows // dist.get_world_size()
        raw = (rows - own) * (inp.numel() // max(rows, 1)) * inp.element_size()
        compressed = zipped and STATS.strategy == switch.COMPRESSED
        self.wire[tag], self.raw[tag] = (STATS.sent if compressed else raw), raw
        self.strategy[tag] = (STATS.strategy or "native") if zipped else "torch"

    def seconds(self) -> float:
        """Seconds inside this step's all-to-alls (after the step's device sync)."""
        if self.cuda:
            return sum(s.elapsed_time(e) for s, e in self.spans) / 1e3
        return sum(e - s for s, e in self.spans)

    def dispatch(self, rows: torch.Tensor, send: list[int], recv: list[int]) -> torch.Tensor:
        """FP8 rows with per-row absmax scales out, dequantised BF16 rows in."""
        scale = rows.abs().amax(1, keepdim=True).float().clamp_min(1e-30) / E4M3_MAX
        q = (rows.float() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)
        packed = torch.cat([q.view(torch.uint8), scale.view(torch.uint8)], 1)
        got = packed.new_empty(sum(recv), packed.shape[1])
        self.a2a(got, packed, recv, send, "dispatch", fp8=True)
        self.dispatched = packed, send
        hidden = rows.shape[1]
        scales = got[:, hidden:].contiguous().view(torch.float32)
        return (got[:, :hidden].view(E4M3).float() * scales).to(rows.dtype)

    def codec_bytes(self) -> tuple[int, int]:
        """(zipccl.compress bytes, raw bytes) of the last dispatch's pieces for other ranks: the
        tokens' own ratio, free of the protocol's slot margins and padding."""
        packed, send = self.dispatched
        pieces = [p for j, p in enumerate(packed.split(send)) if j != self.rank and p.numel()]
        return (
            sum(zipccl.compress(p.view(E4M3)).nbytes for p in pieces),
            sum(p.numel() for p in pieces),
        )

    def rows(self, x: torch.Tensor, send: list[int], recv: list[int], tag: str) -> torch.Tensor:
        got = x.new_empty(sum(recv), *x.shape[1:])
        self.a2a(got, x.contiguous(), recv, send, tag)
        return got


class Exchange(torch.autograd.Function):
    """Rows to their ranks (FP8 dispatch or BF16 combine); the gradient returns in BF16."""

    @staticmethod
    def forward(
        ctx: object, x: torch.Tensor, comm: Comm, send: list[int], recv: list[int], fp8: bool
    ) -> torch.Tensor:
        ctx.comm, ctx.send, ctx.recv, ctx.tag = (
            comm,
            send,
            recv,
            ("dispatch_grad" if fp8 else "combine_grad"),
        )
        return comm.dispatch(x, send, recv) if fp8 else comm.rows(x, send, recv, "combine")

    @staticmethod
    def backward(ctx: object, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        return ctx.comm.rows(grad, ctx.recv, ctx.send, ctx.tag), None, None, None, None


class MoE(torch.nn.Module):
    """Top-k routed experts, E / W of them on each of W ranks; parameters seeded per expert,
    so a rank's shard does not depend on the world size."""

    def __init__(
        self, args: argparse.Namespace, rank: int, world: int, device: torch.device
    ) -> None:
        super().__init__()
        e, h, f = args.experts, args.hidden, args.ffn
        self.k, self.world, self.local = args.topk, world, e // world
        gen = torch.Generator().manual_seed(0)
        self.router = torch.nn.Parameter(
            (torch.randn(h, e, generator=gen) / math.sqrt(h)).to(device)
        )
        hot = torch.randperm(e, generator=gen).float()
        self.register_buffer("bias", (-args.skew * torch.log1p(hot)).to(device))
        mine = range(rank * self.local, (rank + 1) * self.local)
        gens = [torch.Generator().manual_seed(100 + i) for i in mine]
        self.w1 = torch.nn.Parameter(
            torch.stack([torch.randn(h, f, generator=g) / math.sqrt(h) for g in gens]).to(
                device, torch.bfloat16
            )
        )
        self.w2 = torch.nn.Parameter(
            torch.stack([torch.randn(f, h, generator=g) / math.sqrt(f) for g in gens]).to(
                device, torch.bfloat16
            )
        )
        self.comm: Comm | None = None
        self.counts, self.received = torch.zeros(e, dtype=torch.int64), 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        top, expert = (x.float() @ self.router + self.bias).topk(self.k, dim=1)
        gates = top.softmax(1)
        flat = expert.flatten()
        order = flat.argsort(stable=True)  # rows grouped by expert, so by destination rank
        counts = torch.bincount(flat, minlength=self.bias.numel())
        got = torch.empty_like(counts)
        self.comm.a2a(got, counts, None, None, "splits")  # the split sizes, as MoE code does
        got = got.view(self.world, self.local)  # [source rank, local expert]
        send, recv = counts.view(self.world, -1).sum(1).tolist(), got.sum(1).tolist()
        self.counts, self.received = counts.detach().cpu(), sum(recv)
        h = Exchange.apply(x[order // self.k], self.comm, send, recv, True)
        y = Exchange.apply(self.experts(h, got), self.comm, recv, send, False)
        mixed = y[order.argsort()].view(x.shape[0], self.k, -1)
        return (mixed.float() * gates.unsqueeze(-1)).sum(1).to(x.dtype)

    def experts(self, h: torch.Tensor, got: torch.Tensor) -> torch.Tensor:
        """Each local expert's SiLU MLP over its rows (received grouped by source rank)."""
        which = torch.arange(self.local, device=h.device).repeat(self.world)
        perm = which.repeat_interleave(got.flatten(), output_size=h.shape[0]).argsort(stable=True)
        parts = h[perm].split(got.sum(0).tolist())
        y = torch.cat([F.silu(p @ self.w1[e]) @ self.w2[e] for e, p in enumerate(parts)])
        return y[perm.argsort()]

    def step(self, x: torch.Tensor, grad_out: torch.Tensor) -> dict[str, torch.Tensor]:
        """Forward and backward from fresh gradients; what both variants must agree on."""
        x = x.detach().requires_grad_()
        for p in self.parameters():
            p.grad = None
        out = self(x)
        out.backward(grad_out)
        return {
            "output": out.detach(),
            "input_grad": x.grad,
            **{f"{n}_grad": p.grad for n, p in self.named_parameters()},
        }


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        a.dtype == b.dtype
        and a.shape == b.shape
        and torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))
    )


def run(args: argparse.Namespace, rank: int, world: int) -> dict:
    """The benchmark on an initialised process group; rank 0 writes ``args.out/moe.json``.
    Raises on every rank if any step's results differ between the variants."""
    if args.mode:
        os.environ["ZIPCCL_MODE"] = args.mode
    if args.experts % world:
        raise SystemExit(f"--experts {args.experts} is not divisible by {world} ranks")
    cuda = args.device == "cuda"
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    layer = MoE(args, rank, world, device)
    gen = torch.Generator().manual_seed(1000 + rank)
    x = torch.randn(args.tokens, args.hidden, generator=gen).to(device, torch.bfloat16)
    grad_out = torch.randn(args.tokens, args.hidden, generator=gen).to(device, torch.bfloat16)
    comms = {"native": Comm(dist, rank, cuda), "zipccl": Comm(zipccl, rank, cuda)}
    times: dict[str, dict[str, list[float]]] = {n: {"step": [], "a2a": []} for n in comms}
    mismatches: list[str] = []
    for it in range(args.warmup + args.iters):
        found = {}
        for name in comms if it % 2 == 0 else reversed(comms):  # alternate who goes first
            layer.comm = comm = comms[name]
            comm.spans.clear()
            dist.barrier()
            if cuda:
                torch.cuda.synchronize()
            start = comm.mark()
            found[name] = layer.step(x, grad_out)
            end = comm.mark()
            if cuda:
                end.synchronize()
            step = start.elapsed_time(end) / 1e3 if cuda else end - start
            if it >= args.warmup:
                times[name]["step"].append(step)
                times[name]["a2a"].append(comm.seconds())
        mismatches += [
            f"step {it}: {k}"
            for k, v in found["native"].items()
            if not same_bits(v, found["zipccl"][k])
        ]
    bad = torch.tensor([len(mismatches)], device=device)
    dist.all_reduce(bad)
    if bad.item():
        print(
            f"rank {rank}: MoE BIT-EXACTNESS FAILED, zipccl != native: "
            f"{mismatches or 'this rank agrees; a peer does not'}",
            flush=True,
        )
        raise RuntimeError(f"zipccl's MoE step differs from native on some rank: {mismatches}")
    counts = layer.counts.to(device)
    dist.all_reduce(counts)
    mine = {"rank": rank, "rows_sent": args.tokens * args.topk, "rows_received": layer.received}
    for name, comm in comms.items():
        step, a2a = (statistics.median(times[name][k]) for k in ("step", "a2a"))
        mine[name] = {
            "step_ms": 1e3 * step,
            "a2a_ms": 1e3 * a2a,
            "a2a_share": a2a / step,
            "wire": dict(comm.wire),
            "raw": dict(comm.raw),
            "strategy": dict(comm.strategy),
        }
    mine["zipccl"]["codec"], mine["zipccl"]["codec_raw"] = comms["zipccl"].codec_bytes()
    ranks: list[dict] = [{}] * world
    dist.all_gather_object(ranks, mine)
    result = summary(ranks, counts.cpu())
    if rank == 0:
        write(args, world, device, result, ranks)
        print(json.dumps(result), flush=True)
    return result


def summary(ranks: list[dict], counts: torch.Tensor) -> dict:
    """The layer's figures: the slowest rank's step, wire bytes summed over ranks."""

    def total(name: str, key: str, tags: tuple[str, ...] = TAGS) -> int:
        return sum(r[name][key].get(t, 0) for r in ranks for t in tags)

    out: dict = {"exact": True, "load": (counts / counts.sum()).tolist()}
    for name in ("native", "zipccl"):
        out[f"{name}_step_ms"] = max(r[name]["step_ms"] for r in ranks)
        out[f"{name}_a2a_share"] = max(r[name]["a2a_share"] for r in ranks)
    out["speedup"] = out["native_step_ms"] / out["zipccl_step_ms"]
    out["dispatch_ratio"] = sum(r["zipccl"]["codec"] for r in ranks) / max(
        1, sum(r["zipccl"]["codec_raw"] for r in ranks)
    )
    out["dispatch_wire_ratio"] = total("zipccl", "wire", ("dispatch",)) / max(
        1, total("zipccl", "raw", ("dispatch",))
    )
    out["wire_ratio"] = total("zipccl", "wire") / max(1, total("zipccl", "raw"))
    out["wire_bytes"] = {t: total("zipccl", "wire", (t,)) for t in TAGS}
    out["raw_bytes"] = {t: total("zipccl", "raw", (t,)) for t in TAGS}
    out["strategy"] = ranks[0]["zipccl"]["strategy"]
    return out


def write(
    args: argparse.Namespace, world: int, device: torch.device, result: dict, ranks: list[dict]
) -> None:
    p2p, shm = os.environ.get("NCCL_P2P_DISABLE") == "1", os.environ.get("NCCL_SHM_DISABLE") == "1"
    cuda = device.type == "cuda"
    transport = "gloo" if not cuda else "socket" if p2p and shm else "shm" if p2p else "nvlink"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "moe.json").write_text(
        json.dumps(
            {
                "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                "device": torch.cuda.get_device_name(device) if cuda else "cpu",
                "torch": torch.__version__,
                "world": world,
                "transport": transport,
                "zipccl_mode": os.environ.get("ZIPCCL_MODE", "auto"),
                "env": {k: os.environ.get(k) for k in ENV},
                "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
                "results": result,
                "ranks": ranks,
            },
            indent=1,
        )
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="torchrun --nproc-per-node N benchmarks/moe.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--tokens", type=int, help="tokens per rank (default 16384 on cuda, 1024 cpu)")
    ap.add_argument("--hidden", type=int, help="model width (default 4096 on cuda, 256 on cpu)")
    ap.add_argument("--ffn", type=int, help="expert MLP width (default hidden / 2)")
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--topk", type=int, default=2)
    ap.add_argument("--skew", type=float, default=1.0, help="router bias -skew * log(1 + r)")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument(
        "--mode",
        choices=["auto", "always", "never"],
        help="sets ZIPCCL_MODE (default: ZIPCCL_MODE, else auto)",
    )
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    cuda = args.device == "cuda"
    args.tokens = args.tokens or (16384 if cuda else 1024)
    args.hidden = args.hidden or (4096 if cuda else 256)
    args.ffn = args.ffn or args.hidden // 2
    return args


def main() -> None:
    args = parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if args.device == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group("nccl", device_id=torch.device("cuda", torch.cuda.current_device()))
    else:
        dist.init_process_group("gloo")
    try:
        run(args, rank, world)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
