"""End-to-end training over a host-staged transport: a ~300 M-parameter BF16 GPT, several ranks
sharing one GPU, gradients (DDP) or parameters and gradients (FSDP2) moved by gloo -- plain, or
through ``init_process_group("zipccl")``, whose CUDA tensors then take zipccl's staged transport.

One launch per (strategy, backend), from the repository root on a GPU machine::

    torchrun --nproc-per-node 2 -m benchmarks.collectives.train_staged --strategy ddp \\
        --backend gloo --out OUT
    torchrun --nproc-per-node 2 -m benchmarks.collectives.train_staged --strategy ddp \\
        --backend zipccl --out OUT
    ZIPCCL_LANES=8 torchrun --nproc-per-node 2 -m benchmarks.collectives.train_staged \\
        --strategy ddp --backend zipccl --label lanes8 --out OUT
    python -m benchmarks.collectives.train_staged --report OUT

Every run trains the same seeded model on the same seeded batches: ``--warmup`` steps, then
``--steps`` timed ones (wall time between device syncs, median), and ``--compute-steps`` steps
without gradient communication (DDP ``no_sync``: forward, backward and the optimizer on the
shared GPU; for FSDP2 the DDP run's figure is the compute share, the rest of a step is exposed
communication). It records every step's loss and a digest of the final weights; ``--report``
prints each strategy's zipccl runs (one row per ``--label``ed launch) beside its unlabelled gloo
run, checks losses and weights bit for bit, and lists every gloo launch's step time.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from benchmarks.collectives.model import GPT

VOCAB = 8192


def batches(rank: int, steps: int, batch: int, ctx: int) -> list[torch.Tensor]:
    """A learnable token stream per rank (start + a * t mod vocab, one of 8 strides)."""
    gen = torch.Generator(device="cuda").manual_seed(100 + rank)
    a = torch.randint(1, VOCAB, (8,), device="cuda", generator=gen)
    out = []
    for _ in range(steps):
        start = torch.randint(0, VOCAB, (batch, 1), device="cuda", generator=gen)
        which = torch.randint(0, 8, (batch, 1), device="cuda", generator=gen)
        out.append((start + a[which] * torch.arange(ctx + 1, device="cuda")) % VOCAB)
    return out


def wrapped(args: argparse.Namespace) -> torch.nn.Module:
    """The seeded model under DDP (BF16 parameters and gradients) or FSDP2 (BF16 parameters
    and reductions, fp32 shards)."""
    torch.manual_seed(0)
    model = GPT(VOCAB, args.d_model, args.layers, args.heads, args.ctx).cuda()
    if args.strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        return DDP(model.to(torch.bfloat16), bucket_cap_mb=args.bucket_mb)
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)
    for block in model.blocks:
        fully_shard(block, mp_policy=policy)
    return fully_shard(model, mp_policy=policy)


def step(model: torch.nn.Module, opt: torch.optim.Optimizer, seq: torch.Tensor) -> torch.Tensor:
    logits = model(seq[:, :-1])
    loss = F.cross_entropy(logits.float().view(-1, VOCAB), seq[:, 1:].reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss


def timed(fn) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def digest(model: torch.nn.Module) -> str:
    """sha256 of every parameter's bytes (FSDP2: this rank's shards), in module order."""
    h = hashlib.sha256()
    for p in model.parameters():
        local = p.to_local() if hasattr(p, "to_local") else p
        h.update(local.detach().contiguous().view(torch.uint8).cpu().numpy().tobytes())
    return h.hexdigest()


def lanes_setting() -> int:
    """The backend's lane count in effect (ZIPCCL_LANES, or its default)."""
    from zipccl import settings

    return settings.value("ZIPCCL_LANES")


def train(args: argparse.Namespace) -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    model = wrapped(args)
    params = sum(p.numel() for p in model.parameters())  # FSDP2's DTensors: the global numel
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, foreach=True)
    losses: list[torch.Tensor] = []
    times = []
    for i, seq in enumerate(batches(rank, args.warmup + args.steps, args.batch, args.ctx)):
        t = timed(lambda seq=seq: losses.append(step(model, opt, seq)))
        if i >= args.warmup:
            times.append(t)
    weights = digest(model)
    compute = []
    if args.strategy == "ddp":  # the same steps without gradient communication
        with model.no_sync():
            for seq in batches(rank + 1000, args.compute_steps, args.batch, args.ctx):
                compute.append(timed(lambda seq=seq: step(model, opt, seq)))
    return {
        "strategy": args.strategy,
        "backend": args.backend,
        "world": world,
        "params": params,
        "step_s": statistics.median(times),
        "steps_s": times,
        "compute_s": statistics.median(compute[2:]) if len(compute) > 2 else None,
        "losses": [float(loss) for loss in losses],
        "loss_bits": [int(loss.float().view(torch.int32)) for loss in losses],
        "digest": weights,
        "torch": torch.__version__,
        "label": args.label,
        "zipccl_env": {k: v for k, v in os.environ.items() if k.startswith("ZIPCCL_")},
        "zipccl_lanes": lanes_setting() if args.backend == "zipccl" else None,
    }


def settings_cell(run: dict) -> str:
    """A zipccl run's lanes and the ZIPCCL_* settings it set, as one cell (less the kernel
    cache's place, which changes nothing on the wire)."""
    env = {k: v for k, v in (run.get("zipccl_env") or {}).items() if k != "ZIPCCL_CACHE_DIR"}
    env.setdefault("ZIPCCL_LANES", f"{run['zipccl_lanes']} (default)")
    return ", ".join(f"{k}={v}" for k, v in sorted(env.items()))


def report(out: Path) -> str:
    """Each strategy's zipccl runs (one row per launch, by its settings) against its gloo run."""
    runs: dict[tuple[str, str], list[dict]] = {}
    for path in sorted(out.glob("train-*.json")):
        doc = json.loads(path.read_text())
        runs.setdefault((doc["strategy"], doc["backend"]), []).append(doc)
    lines = [
        "| strategy | zipccl settings | params | gloo step ms | zipccl step ms | speed-up | "
        "compute ms | exposed comm gloo / zipccl ms | losses, weights |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    compute = runs.get(("ddp", "gloo"), [{}])[0].get("compute_s") or 0.0
    gloo_steps = []
    for strategy in ("ddp", "fsdp2"):
        glooes = sorted(runs.get((strategy, "gloo"), []), key=lambda run: run.get("label", ""))
        if not glooes:
            continue
        ms = ", ".join(f"{1e3 * run['step_s']:.1f}" for run in glooes)
        gloo_steps.append(f"{strategy} gloo launches: {ms} ms")
        base = glooes[0]  # the unlabelled launch
        for zc in runs.get((strategy, "zipccl"), []):
            same = base["loss_bits"] == zc["loss_bits"] and base["digests"] == zc["digests"]
            exposed = [1e3 * (run["step_s"] - compute) for run in (base, zc)]
            lines.append(
                f"| {strategy} | {settings_cell(zc)} | {base['params'] / 1e6:.0f} M | "
                f"{1e3 * base['step_s']:.0f} | {1e3 * zc['step_s']:.0f} | "
                f"{base['step_s'] / zc['step_s']:.2f}x | {1e3 * compute:.0f} | "
                f"{exposed[0]:.0f} / {exposed[1]:.0f} | "
                f"{'bit-identical' if same else 'DIFFER'} |"
            )
    return "\n".join([*lines, "", *gloo_steps])


def main() -> None:
    ap = argparse.ArgumentParser(
        prog="torchrun --nproc-per-node W -m benchmarks.collectives.train_staged",
        description=__doc__.split("\n\n")[0],
    )
    ap.add_argument("--strategy", choices=["ddp", "fsdp2"], default="ddp")
    ap.add_argument("--backend", choices=["gloo", "zipccl"], default="gloo")
    ap.add_argument("--out", type=Path, help="folder for train-STRATEGY-BACKEND[-LABEL].json")
    ap.add_argument("--label", default="", help="names this launch's file (e.g. lanes8)")
    ap.add_argument("--report", type=Path, help="print the comparison of the runs in a folder")
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--d-model", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--bucket-mb", type=float, default=25.0)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--compute-steps", type=int, default=10)
    args = ap.parse_args()
    if args.report:
        print(report(args.report))
        return
    torch.cuda.set_device(0)  # every rank on the one GPU
    if args.backend == "zipccl":
        import zipccl  # noqa: F401  (registers the backend)
    dist.init_process_group(args.backend)
    torch.use_deterministic_algorithms(True, warn_only=True)
    result = train(args)
    digests = [None] * dist.get_world_size()
    dist.all_gather_object(digests, result.pop("digest"))
    result["digests"] = digests
    if dist.get_rank() == 0 and args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        label = f"-{args.label}" if args.label else ""
        name = f"train-{args.strategy}-{args.backend}{label}.json"
        (args.out / name).write_text(json.dumps(result, indent=1))
        brief = {k: v for k, v in result.items() if k not in ("losses", "loss_bits", "steps_s")}
        print(json.dumps(brief), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
