"""Markdown tables of a results folder (the ``table`` subcommand)."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.collectives.common import MODES
from benchmarks.collectives.phases import phases_table
from benchmarks.timing import MIB


def table(out: Path) -> str:
    lines = []
    for path in sorted(out.glob("phases-*.json")):
        found = json.loads(path.read_text())
        lines += [
            f"\n### phases of one compressed call, transport: {found['transport']}\n",
            phases_table(found["rows"]),
        ]
    for path in sorted(out.glob("sweep-*.json")):
        rows = json.loads(path.read_text())["rows"]
        lines += [
            f"\n### transport: {rows[0]['transport']}\n",
            "| data | op | MiB/rank | native ms | auto ms | auto x | auto path |"
            " auto, no verify x | always ms | always x | wire always / native | exact |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for r in rows:
            n = r["native_s"]
            exact = all(r[f"{m}_ok"] is not False for m in MODES)
            lines.append(
                f"| {r['data']} | {r['op']} | {r['mib']} | {1e3 * n:.2f} | "
                f"{1e3 * r['auto_s']:.2f} | {n / r['auto_s']:.2f} | {r['auto_strategy']} | "
                f"{n / r['auto_nv_s']:.2f} | {1e3 * r['always_s']:.2f} | {n / r['always_s']:.2f} | "
                f"{r['always_wire'] / max(1, r['native_wire']):.3f} | {'yes' if exact else 'NO'} |"
            )
    for path in sorted(out.glob("train-*.json")):
        found = json.loads(path.read_text())
        runs, conf, hook = found["runs"], found.get("config", ""), found.get("hook", "zipccl")
        base = runs[0]
        lines += [
            f"\n### DDP training ({path.stem}, {base['params'] / 1e6:.1f} M params) {conf}\n",
            "| run | median step ms | speedup | final loss | max abs loss diff vs native |",
            "| --- | --- | --- | --- | --- |",
        ]
        for i, r in enumerate(runs):
            diff = max(abs(x - y) for x, y in zip(r["losses"], base["losses"], strict=True))
            name = "native" if not r["hooked"] else f"{hook} hook #{i}"
            lines.append(
                f"| {name} | {1e3 * r['step_s']:.2f} | {base['step_s'] / r['step_s']:.3f}"
                f" | {r['losses'][-1]:.4f} | {diff:.3g} |"
            )
        paths = {n: p for r in runs for n, p in r.get("routes", {}).items()}
        if paths:
            listed = ", ".join(
                f"{int(n) / MIB:.1f} MiB {p}"
                for n, p in sorted(paths.items(), key=lambda kv: int(kv[0]))
            )
            lines.append(f"\nThe hook's buckets: {listed}")
        hooked = [r["losses"] for r in runs if r["hooked"]]
        lines.append(
            f"\n{hook} runs identical to each other: {all(h == hooked[0] for h in hooked)}"
            f"; identical to native: {hooked[0] == base['losses']}"
        )
    return "\n".join(lines)
