"""The DDP training comparison (``--train``): a small GPT trained without and with a comm hook."""

from __future__ import annotations

import argparse
import math
import statistics
import time

import torch
import torch.nn.functional as F
import zipccl
from torch import nn
from zipccl import switch

from benchmarks.collectives import common
from benchmarks.collectives.common import sync


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        att = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        att = att.masked_fill(mask, float("-inf")).softmax(-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    """A small decoder-only transformer (explicit attention: deterministic kernels)."""

    def __init__(self, vocab: int, d: int, layers: int, heads: int, ctx: int) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(ctx, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def train(args: argparse.Namespace, rank: int, hooked: bool) -> dict:
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True, warn_only=True)
    vocab, ctx = 8192, args.ctx
    model = GPT(vocab, args.d_model, args.layers, 8, ctx).to(common.DEV, torch.bfloat16)
    ddp = DDP(model, bucket_cap_mb=args.bucket_mb)
    if hooked:
        ddp.register_comm_hook(None, zipccl.ddp_hook if args.hook == "zipccl" else allreduce_hook)
    opt = torch.optim.AdamW(ddp.parameters(), lr=3e-4)
    gen = torch.Generator(device=common.DEV).manual_seed(100 + rank)
    # a learnable stream: token t = start + a * t (mod vocab), one of 8 fixed strides a
    a = torch.randint(1, vocab, (8,), device=common.DEV, generator=gen)
    losses, times = [], []
    switch.ROUTES.clear()  # a cache: what remains after the steps is what the hook decided
    for _ in range(args.steps):
        start = torch.randint(0, vocab, (args.batch, 1), device=common.DEV, generator=gen)
        which = torch.randint(0, 8, (args.batch, 1), device=common.DEV, generator=gen)
        seq = (start + a[which] * torch.arange(ctx + 1, device=common.DEV)) % vocab
        sync()
        t0 = time.perf_counter()
        logits = ddp(seq[:, :-1])
        loss = F.cross_entropy(logits.float().view(-1, vocab), seq[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sync()
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
    params = sum(p.numel() for p in model.parameters())
    routes = {int(k[3]): v for k, v in switch.ROUTES.items() if k[1] == "all_reduce"}
    return {
        "hooked": hooked,
        "losses": losses,
        "step_s": statistics.median(times[20:]),
        "params": params,
        "routes": routes,
    }
