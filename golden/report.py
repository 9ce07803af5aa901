"""Compression report on real tensors: ``python -m zipccl.golden.report [--json] [--plot DIR]``.

Tensor classes (from :mod:`golden.data`, all-MiniLM-L6-v2, offline): ``bf16_weights``,
``bf16_activations``, ``bf16_gradients`` and ``fp8_activations`` (e4m3, per-tensor absmax scaled).
Every table and every baseline is built **per tensor** (ZipCCL derives its table from each
tensor's RMS, the QLC paper keeps per-layer tables), and the class figure is the element-weighted
mean. Methods:

* BF16 -- the region code sees the 8-bit exponent; sign + mantissa are 8 raw bits per element.
  ``zipccl_theory`` / ``zipccl_histogram`` are the **real encoded size**: the bytes of
  :func:`golden.container.encode` (header with the table, raw planes, prefix planes, block offsets,
  escape stream, alignment, raw fallback); ``table_bits_per_element`` beside it is the same code's
  ideal size (8 + expected code length), so the difference is the container overhead. All other
  BF16 methods are ideal sizes: 8 raw bits + the exponent's code.
* FP8 -- the region code sees the whole byte; ideal code lengths, plus the container size for the
  best table and the checked-in preset.

``ratio`` is compressed / original (16 or 8 bits). Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from zipccl.golden import baselines as bl
from zipccl.golden import builders, container, data, presets, theory
from zipccl.golden.codebook import ALPHABET, Codebook
from zipccl.golden.formats import BF16, E4M3, FloatFormat

CLASSES = ("bf16_weights", "bf16_activations", "bf16_gradients", "fp8_activations")

RAW_PLUS = "8 raw sign+mantissa bits + "
CONTAINER = "container.encode bytes (header+table, raw planes, prefix planes, offsets, escapes): "
COVERS = {
    "zipccl_theory": "ZipCCL table from the tensor's RMS (theory)",
    "zipccl_histogram": "ZipCCL layout with the top-7 measured symbols",
    "qlc_heuristic": "optimize_zones heuristic table (widths 3/4/5 + 8-bit escape)",
    "qlc_best": "exhaustive-search table (widths 0..8, escape optional)",
    "qlc_best_6_7_8_11": "exhaustive search over the QLC paper's widths 3/4/5 + 8-bit escape",
    "qlc_dynamic": "dynamic table (w=1 head for the top 2, six w=5 middles, 8-bit escape)",
    "qlc_dynamic_searched": "w=1 head for the top 2, best 3/4/5 middles, 8-bit escape",
    "qlc_preset": "the checked-in golden/tables/qlc_e4m3.json, same table for every tensor",
    "huffman": "Huffman code built on the tensor's own histogram",
    "exp_golomb": "best-order Exp-Golomb of the frequency rank",
    "exp_golomb_sign_magnitude": "best-order Exp-Golomb of 2*|byte|+sign (no table)",
    "entropy": "Shannon entropy of the tensor's histogram",
    "raw": "uncompressed",
}


@dataclass
class Tally:
    """Total bits of one method over a class: ideal code size, container size, table layouts."""

    ideal: float = 0.0
    container: float = 0.0
    layouts: Counter = field(default_factory=Counter)


def _layout(book: Codebook) -> str:
    return "".join("L" if p == book.literal else str(w) for p, w in enumerate(book.widths))


def bf16_values(bits: np.ndarray) -> np.ndarray:
    """BF16 bit patterns -> float32 values (exact)."""
    return (np.asarray(bits, np.uint32) << 16).view(np.float32)


def theory_table(bits: np.ndarray) -> Codebook:
    """The ZipCCL theory table of BF16 bit patterns, from the statistics of the strided sample
    every backend draws (as the GPU codec's default table does)."""
    flat = bits.ravel()
    sample = bf16_values(flat[theory.sample_indices(flat.size)])
    return theory.zipccl_table(BF16, theory.tensor_stats(sample))


def _code_methods(hist: np.ndarray, fp8: bool) -> dict[str, Codebook]:
    books = {
        "zipccl_histogram": builders.zipccl_histogram_table(hist),
        "qlc_heuristic": builders.qlc_heuristic(hist),
        "qlc_best": builders.best_table(hist),
        "qlc_best_6_7_8_11": builders.best_table(
            hist, widths=builders.QLC_MIDDLE_WIDTHS, literal=True, name="qlc-best-6-7-8-11"
        ),
        "qlc_dynamic": builders.qlc_dynamic(hist),
        "qlc_dynamic_searched": builders.qlc_dynamic(
            hist, middle=None, name="qlc-dynamic-searched"
        ),
    }
    if fp8:
        books["qlc_preset"] = presets.qlc_e4m3()
    return books


def _baselines(hist: np.ndarray, fp8: bool) -> dict[str, float]:
    out = {
        "huffman": bl.huffman_bits(hist),
        "exp_golomb": bl.exp_golomb_bits(hist)[0],
        "entropy": bl.entropy_bits(hist),
    }
    if fp8:
        out["exp_golomb_sign_magnitude"] = bl.exp_golomb_bits(hist, bl.sign_magnitude_mapping())[0]
    out["raw"] = bl.raw_bits(hist)
    return out


def _container_methods(fmt: FloatFormat) -> tuple[str, ...]:
    """Methods whose real container.encode size is measured (it is the headline for BF16)."""
    return ("qlc_best", "qlc_preset") if fmt.byte_coded else ("zipccl_theory", "zipccl_histogram")


def measure_tensor(bits: np.ndarray, fmt: FloatFormat, tallies: dict[str, Tally]) -> None:
    """Add one tensor's bits under every method to ``tallies``."""
    n = bits.size
    fp8 = fmt.byte_coded
    hist = bl.histogram(fmt.symbols(bits.ravel()))
    books = _code_methods(hist, fp8)
    if not fp8:
        books = {"zipccl_theory": theory_table(bits), **books}
    for name, book in books.items():
        tally = tallies[name]
        tally.ideal += n * (fmt.raw_bits + book.expected_bits(hist))
        tally.layouts[_layout(book)] += 1
        if name in _container_methods(fmt):
            tally.container += 8 * len(container.encode(bits, fmt, book))
    for name, per_symbol in _baselines(hist, fp8).items():
        tallies[name].ideal += n * (fmt.raw_bits + per_symbol)


def _summary(name: str, tally: Tally, numel: int, fmt: FloatFormat) -> dict:
    real = name in _container_methods(fmt)
    headline = tally.container if real and not fmt.byte_coded else tally.ideal
    covers = COVERS[name]
    if real and not fmt.byte_coded:
        covers = CONTAINER + covers
    elif not fmt.byte_coded and name != "raw":
        covers = RAW_PLUS + covers + " of the exponent"
    row: dict = {
        "bits_per_element": headline / numel,
        "ratio": headline / numel / fmt.bits,
        "covers": covers,
    }
    if real:
        key = "container_bits_per_element" if fmt.byte_coded else "table_bits_per_element"
        row[key] = (tally.container if fmt.byte_coded else tally.ideal) / numel
    if tally.layouts:
        row["layouts"] = dict(tally.layouts.most_common(3))
    return row


def measure_class(name: str, log: Callable[[str], None]) -> dict:
    """The report entry of one tensor class: {method: {bits_per_element, ratio, ...}}."""
    fmt = E4M3 if name.startswith("fp8") else BF16
    tensors = data.tensor_class(name)
    numel = sum(t.size for t in tensors.values())
    log(f"{name}: {len(tensors)} tensors, {numel / 1e6:.2f} M elements")
    tallies: dict[str, Tally] = defaultdict(Tally)  # methods in the order measure_tensor adds
    start = time.monotonic()
    for i, bits in enumerate(tensors.values(), 1):
        measure_tensor(bits, fmt, tallies)
        if i % 20 == 0 or i == len(tensors):
            log(f"  {i}/{len(tensors)} tensors ({time.monotonic() - start:.1f} s)")
    result: dict[str, object] = {k: _summary(k, t, numel, fmt) for k, t in tallies.items()}
    result["numel"] = numel
    result["tensors"] = len(tensors)
    return result


def run(classes: tuple[str, ...] = CLASSES, log: Callable[[str], None] | None = None) -> dict:
    log = log or (lambda msg: print(f"[golden.report] {msg}", file=sys.stderr, flush=True))
    log("capturing all-MiniLM-L6-v2 tensors (weights, linear inputs, contrastive gradients)")
    data.capture()
    return {name: measure_class(name, log) for name in classes}


def _rows(methods: dict) -> list[tuple[str, str, str, str, str]]:
    """(method, bits/elem, ratio, other size, covers) as strings, in report order."""
    rows = []
    for name, row in methods.items():
        if not isinstance(row, dict):
            continue
        other = ""
        for key, label in (
            ("table_bits_per_element", "ideal"),
            ("container_bits_per_element", "container"),
        ):
            if key in row:
                other = f"{label} {row[key]:.3f}"
        rows.append(
            (name, f"{row['bits_per_element']:.3f}", f"{row['ratio']:.3f}", other, row["covers"])
        )
    return rows


def format_text(report: dict, markdown: bool = False) -> str:
    """The report as aligned text tables, or as markdown tables."""
    head = ("method", "bits/elem", "ratio", "other size", "covers")
    out = []
    for cls, methods in report.items():
        title = f"{cls} ({methods['tensors']} tensors, {methods['numel']:,} elements)"
        rows = _rows(methods)
        if markdown:
            out += [f"### {title}", "", "| " + " | ".join(head) + " |", "|---|--:|--:|--:|---|"]
            out += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows]
            out.append("")
        else:
            out += (
                [title]
                + [f"{r[0]:<27}{r[1]:>10}{r[2]:>7}{r[3]:>17}  {r[4]}" for r in [head, *rows]]
                + [""]
            )
    return "\n".join(out)


# --------------------------------------------------------------------------- plots
def fp8_byte_probabilities(sigma: float, fmt: str = "e4m3") -> np.ndarray:
    """P(byte) of N(0, sigma^2) cast to FP8 (round to nearest, saturating at the format max)."""
    import torch

    dtype = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}[fmt]
    vals = torch.arange(ALPHABET, dtype=torch.uint8).view(dtype).float().numpy()
    pos = np.flatnonzero(np.isfinite(vals) & (vals >= 0) & (np.arange(ALPHABET) < 0x80))
    order = pos[np.argsort(vals[pos], kind="stable")]
    edges = np.concatenate([[0.0], (vals[order][1:] + vals[order][:-1]) / 2, [np.inf]])
    cdf = np.array([math.erf(e / (sigma * math.sqrt(2))) if sigma > 0 else 1.0 for e in edges])
    mass = np.diff(cdf) / 2  # per sign
    probs = np.zeros(ALPHABET)
    probs[order] = mass
    probs[order | 0x80] = mass
    return probs


def _class_theory(name: str) -> np.ndarray:
    """The class's predicted symbol distribution: per-tensor theory, element-weighted."""
    floats = data.capture().activations
    pred = np.zeros(ALPHABET)
    for key, bits in data.tensor_class(name).items():
        if name.startswith("fp8"):
            x = floats[key]
            sigma = float(np.sqrt(np.mean(np.square(x, dtype=np.float64)))) * data.fp8_scale(x)
            pred += bits.size * fp8_byte_probabilities(sigma)
        else:
            flat = bits.ravel()
            stats = theory.tensor_stats(bf16_values(flat[theory.sample_indices(flat.size)]))
            pred += bits.size * theory.exponent_probabilities(BF16, stats)
    return pred / pred.sum()


def plot(directory: str | Path, classes: tuple[str, ...] = CLASSES) -> list[Path]:
    """One PNG per class: measured symbol histogram (bars) with the theory prediction (line)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name in classes:
        fp8 = name.startswith("fp8")
        fmt = E4M3 if fp8 else BF16
        hist = bl.histogram(fmt.symbols(data.concat(data.tensor_class(name))))
        measured, pred = hist / hist.sum(), _class_theory(name)
        live = np.flatnonzero((measured > 0) | (pred > 1e-7))
        lo, hi = (0, ALPHABET - 1) if fp8 else (int(live.min()), int(live.max()))
        x = np.arange(lo, hi + 1)
        fig, ax = plt.subplots(figsize=(10, 4))
        ax.bar(x, measured[lo : hi + 1], width=1.0, color="tab:blue", label="measured")
        ax.plot(
            x,
            pred[lo : hi + 1],
            "o-" if not fp8 else "-",
            color="tab:red",
            ms=3,
            label="theory (Gaussian per tensor)",
        )
        ax.set_yscale("log")
        ax.set_ylim(bottom=1e-7)
        ax.set_xlabel("FP8 e4m3 byte" if fp8 else "BF16 biased exponent")
        ax.set_ylabel("probability")
        ax.set_title(f"{name}: {'byte' if fp8 else 'exponent'} histogram, all-MiniLM-L6-v2")
        ax.legend()
        fig.tight_layout()
        path = out / f"{name}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m zipccl.golden.report",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    fmt = parser.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="print one JSON object")
    fmt.add_argument("--markdown", action="store_true", help="print markdown tables")
    parser.add_argument("--plot", metavar="DIR", help="write PNG histograms into DIR")
    args = parser.parse_args(argv)
    report = run()
    print(json.dumps(report, indent=2) if args.json else format_text(report, args.markdown))
    if args.plot:
        for path in plot(args.plot):
            print(f"[golden.report] wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
