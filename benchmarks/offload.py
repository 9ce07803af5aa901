"""Compressed offload over PCIe against the uncompressed offload done the same way (issue 40).

    PYTHONPATH=sw python benchmarks/offload.py [--out offload.json] [--smoke]

(a) Round trip: a BF16 N(0, 1) tensor (256 MiB and 64 MiB) through ``zipccl.offload_tensor``
    (down: compressed in chunks on the GPU, the compressed bytes copied into pinned host memory)
    and ``HostCopy.load`` (up: copied back, decompressed), against ``compress=False`` (the
    same streams, worker and pinned pool, raw bytes) and, for reference, one plain
    ``pinned.copy_(x, non_blocking=True)`` each way. Median of REPS, GB/s of the tensor's own
    bytes, and the compressed/uncompressed ratio per direction.
(b) Training step: a BF16 pre-norm transformer (LAYERS blocks of width WIDTH, causal
    flash attention, MLP 4x) on BATCH x SEQ tokens, forward + backward (parameters fixed, so every
    step's loss and gradients can be compared) under ``zipccl.offload_activations`` with
    ``compress=True`` and ``compress=False``, and without offload (the compute-only step time).
    Median step time over STEPS steps after WARMUP, peak GPU memory
    (``torch.cuda.max_memory_allocated``) per mode, and whether the losses and gradients of the
    three are bit-identical (``torch.equal``; deterministic algorithms are on, so the flash
    attention backward is deterministic): for each pair of modes, the loss and the parameters
    whose gradients differ, and for each mode whether its first and last timed steps differ
    (a mode that does not repeat itself is nondeterministic whatever the offload does).

``--smoke`` runs tiny sizes, on CPU when there is no GPU (tests/test_offload.py runs it so).
The table at the end goes to stdout; ``--out`` writes everything as JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS (before torch)

import torch
import torch.nn.functional as F
import zipccl

MiB = 1 << 20


@dataclass(frozen=True)
class Sizes:
    """What one run moves and trains."""

    tensors_mib: tuple[int, ...]
    reps: int
    layers: int
    width: int
    heads: int
    batch: int
    seq: int
    warmup: int
    steps: int
    min_bytes: int  # offload_activations' threshold


FULL = Sizes((256, 64), 7, 8, 2048, 16, batch=8, seq=2048, warmup=3, steps=20, min_bytes=MiB)
SMOKE = Sizes((1,), 1, 2, 64, 4, batch=2, seq=64, warmup=1, steps=2, min_bytes=1024)


# ---------------------------------------------------------------------- (a) round trip
def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(device: torch.device, fn) -> float:
    _sync(device)
    start = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - start


def round_trip(x: torch.Tensor, compress: bool, reps: int) -> dict:
    """Median seconds down (offload_tensor until the host copy is complete) and up (load until
    the tensor is on the device), after one warm-up."""
    downs, ups, ratio = [], [], 1.0
    for rep in range(reps + 1):
        _sync(x.device)
        start = time.perf_counter()
        copy = zipccl.offload_tensor(x, compress=compress)
        copy.wait()
        down = time.perf_counter() - start
        start = time.perf_counter()
        y = copy.load()
        _sync(x.device)
        up = time.perf_counter() - start
        assert torch.equal(y, x), "the round trip changed the tensor"
        ratio = copy.host_bytes / copy.nbytes
        if rep:
            downs.append(down)
            ups.append(up)
    return {"down_s": statistics.median(downs), "up_s": statistics.median(ups), "ratio": ratio}


def plain_copy(x: torch.Tensor, reps: int) -> dict:
    """One torch copy each way between ``x`` and a pinned host tensor (the link's raw speed)."""
    pinned = torch.empty(x.shape, dtype=x.dtype, pin_memory=x.is_cuda)
    downs = [_timed(x.device, lambda: pinned.copy_(x, non_blocking=True)) for _ in range(reps + 1)]
    back = torch.empty_like(x)
    ups = [_timed(x.device, lambda: back.copy_(pinned, non_blocking=True)) for _ in range(reps + 1)]
    return {"down_s": statistics.median(downs[1:]), "up_s": statistics.median(ups[1:])}


def bench_round_trip(device: torch.device, sizes: Sizes) -> list[dict]:
    rows = []
    gen = torch.Generator(device=device).manual_seed(0)
    for mib in sizes.tensors_mib:
        x = torch.randn(mib * MiB // 2, dtype=torch.bfloat16, device=device, generator=gen)
        row = {"mib": mib, "bytes": x.numel() * 2, "plain": plain_copy(x, sizes.reps)}
        for mode, compress in (("raw", False), ("compressed", True)):
            row[mode] = round_trip(x, compress, sizes.reps)
        for way in ("down", "up"):
            row[f"{way}_speedup"] = row["raw"][f"{way}_s"] / row["compressed"][f"{way}_s"]
        rows.append(row)
        del x
    return rows


# ---------------------------------------------------------------------- (b) training step
class Block(torch.nn.Module):
    """A pre-norm transformer block: causal multi-head attention, then a 4x GELU MLP."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = torch.nn.LayerNorm(width), torch.nn.LayerNorm(width)
        self.qkv, self.proj = torch.nn.Linear(width, 3 * width), torch.nn.Linear(width, width)
        self.up, self.down = torch.nn.Linear(width, 4 * width), torch.nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, w = x.shape
        qkv = self.qkv(self.norm1(x)).view(b, s, 3, self.heads, w // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(b, s, w))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


def make_model(sizes: Sizes, device: torch.device) -> torch.nn.Module:
    torch.manual_seed(0)
    blocks = [Block(sizes.width, sizes.heads) for _ in range(sizes.layers)]
    return torch.nn.Sequential(*blocks).to(device=device, dtype=torch.bfloat16)


def _outcome(model: torch.nn.Module, loss: torch.Tensor | None) -> dict:
    """A step's loss and gradients, on the host, the gradients by parameter name."""
    assert loss is not None
    grads = {n: p.grad.detach().cpu() for n, p in model.named_parameters() if p.grad is not None}
    return {"loss": loss.detach().cpu(), "grads": grads}


def _differences(a: dict, b: dict) -> list[str]:
    """What differs, bit for bit, between two steps' outcomes: "loss" and parameter names."""
    names = ["loss"] if not torch.equal(a["loss"], b["loss"]) else []
    if a["grads"].keys() != b["grads"].keys():
        return [*names, "the set of parameters with gradients"]
    return names + [n for n, g in a["grads"].items() if not torch.equal(g, b["grads"][n])]


def train_steps(model: torch.nn.Module, x: torch.Tensor, mode: str, sizes: Sizes) -> dict:
    """Median step time, peak memory, the first and last timed steps' losses and gradients."""
    offload = (
        contextlib.nullcontext()
        if mode == "none"
        else zipccl.offload_activations(min_bytes=sizes.min_bytes, compress=mode == "compressed")
    )
    times, loss = [], None

    def step() -> None:
        nonlocal loss
        model.zero_grad(set_to_none=True)
        with offload:
            loss = model(x).float().square().mean()
        loss.backward()

    for _ in range(sizes.warmup):
        step()
    _sync(x.device)
    if x.is_cuda:
        torch.cuda.reset_peak_memory_stats(x.device)
    first = None
    for _ in range(sizes.steps):
        times.append(_timed(x.device, step))
        if first is None:
            first = _outcome(model, loss)
    peak = torch.cuda.max_memory_allocated(x.device) if x.is_cuda else 0
    return {
        "step_s": statistics.median(times),
        "peak_bytes": peak,
        "first": first,
        "last": _outcome(model, loss),
    }


def bench_training(device: torch.device, sizes: Sizes) -> dict:
    torch.use_deterministic_algorithms(True)
    try:
        model = make_model(sizes, device)
        gen = torch.Generator(device=device).manual_seed(1)
        shape = (sizes.batch, sizes.seq, sizes.width)
        x = torch.randn(shape, dtype=torch.bfloat16, device=device, generator=gen)
        runs = {mode: train_steps(model, x, mode, sizes) for mode in ("none", "raw", "compressed")}
    finally:
        torch.use_deterministic_algorithms(False)
    # which pairs differ, and in what; and whether each mode repeats itself (the first timed step
    # against the last): a mode that does not is nondeterministic, not changed by the offload
    differ = {
        f"{a} vs {b}": _differences(runs[a]["last"], runs[b]["last"])
        for a, b in (("none", "raw"), ("none", "compressed"), ("raw", "compressed"))
    }
    repeats = {mode: _differences(run["first"], run["last"]) for mode, run in runs.items()}
    out = {mode: {k: run[k] for k in ("step_s", "peak_bytes")} for mode, run in runs.items()}
    out["loss"] = float(runs["none"]["last"]["loss"])
    out["parameters"] = len(runs["none"]["last"]["grads"])
    out["differ"] = differ
    out["repeat_differ"] = repeats
    out["identical"] = not any(differ.values())
    out["speedup"] = runs["raw"]["step_s"] / runs["compressed"]["step_s"]
    return out


# ---------------------------------------------------------------------- report
def table(trip: list[dict], train: dict, sizes: Sizes) -> str:
    gbs = lambda row, mode, way: row["bytes"] / row[mode][f"{way}_s"] / 1e9  # noqa: E731
    head = "down: plain    raw    zip  speedup   up: plain    raw    zip  speedup"
    lines = [f"round trip, GB/s of the tensor     {head}"]
    for row in trip:
        cells = []
        for way in ("down", "up"):
            speeds = [gbs(row, mode, way) for mode in ("plain", "raw", "compressed")]
            cells.append(" ".join(f"{v:6.1f}" for v in speeds) + f" {row[f'{way}_speedup']:4.2f}x")
        ratio = row["compressed"]["ratio"]
        lines.append(f"  {row['mib']:4d} MiB BF16 (ratio {ratio:.3f})   " + "   ".join(cells))
    lines.append(
        f"training step: {sizes.layers} layers, width {sizes.width}, {sizes.heads} heads, "
        f"batch {sizes.batch} x seq {sizes.seq}, BF16"
    )
    for mode, label in (
        ("none", "no offload"),
        ("raw", "uncompressed"),
        ("compressed", "compressed"),
    ):
        run = train[mode]
        step_ms, peak_gib = run["step_s"] * 1e3, run["peak_bytes"] / 2**30
        lines.append(f"  {label:13s} {step_ms:9.1f} ms   peak {peak_gib:7.2f} GiB")
    lines.append(
        f"  compressed vs uncompressed: {train['speedup']:.2f}x; "
        f"losses and gradients bit-identical: {train['identical']}"
    )
    lines.append(f"  bit for bit (the loss and {train['parameters']} parameters' gradients):")
    for label, kind in (("", "differ"), ("repeat ", "repeat_differ")):
        for name, what in train[kind].items():
            shown = ", ".join(what[:4]) + (", ..." if len(what) > 4 else "")
            verdict = f"{len(what)} differ: {shown}" if what else "identical"
            lines.append(f"    {label + name:26s} {verdict}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="write the results as JSON to this file")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (CPU when no GPU)")
    args = parser.parse_args(argv)
    if not args.smoke and not torch.cuda.is_available():
        parser.error("needs a CUDA GPU (or --smoke)")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    sizes = SMOKE if args.smoke else FULL
    start = time.perf_counter()
    trip = bench_round_trip(device, sizes)
    train = bench_training(device, sizes)
    result = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "sizes": asdict(sizes),
        "round_trip": trip,
        "training": train,
        "seconds": time.perf_counter() - start,
    }
    print(table(trip, train, sizes))
    print(f"({result['seconds']:.0f} s on {result['device']})")
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
