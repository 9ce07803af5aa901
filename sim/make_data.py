"""Regenerate sim/data/minilm.npz, the built-in data set of ``python -m zipccl.sim`` (offline).

Real tensors from all-MiniLM-L6-v2 via golden/data.py: FP8 e4m3 activations at the two FFN inputs
of one layer (FFN1: LayerNorm output, FFN2: GELU output with its spike at zero) and the BF16
gradient of that layer's FFN1 weight. Contiguous runs, as a link would carry them; small
enough to check in (< 100 KB).

    python -m zipccl.sim.make_data
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from zipccl.golden import data

PATH = Path(__file__).parent / "data" / "minilm.npz"
LAYER = 2
FP8_SYMBOLS = 16384
BF16_VALUES = 8192


def build() -> dict[str, np.ndarray]:
    acts = data.fp8_activations("e4m3")
    prefix = f"0.model.encoder.layer.{LAYER}."
    grad = data.bf16_gradients()[prefix + "intermediate.dense.weight"]
    return {
        "fp8_ffn1": acts[prefix + "intermediate.dense"].ravel()[:FP8_SYMBOLS].copy(),
        "fp8_ffn2": acts[prefix + "output.dense"].ravel()[:FP8_SYMBOLS].copy(),
        "bf16_grad": grad.ravel()[:BF16_VALUES].copy(),
    }


def main() -> None:
    PATH.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(PATH, **build())
    print(f"wrote {PATH} ({PATH.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
