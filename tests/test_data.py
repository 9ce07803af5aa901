"""golden.data: the MiniLM capture and the BF16 / FP8 casts the codecs are measured on."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from zipccl.golden import data


def _bf16_rne(x: np.ndarray) -> np.ndarray:
    """Independent float32 -> BF16 round-to-nearest-even on the bit patterns (finite inputs)."""
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    rounded = u + 0x7FFF + ((u >> 16) & 1)
    return (rounded >> 16).astype(np.uint16)


def test_bf16_bits_round_to_nearest_even():
    rng = np.random.default_rng(1)
    x = rng.standard_normal(10000).astype(np.float32) * 10.0 ** rng.integers(-20, 20, 10000)
    ties = np.array([0x3F808000, 0x3F818000, 0x3F80FFFF, 0x00008000], np.uint32).view(np.float32)
    x = np.concatenate([x, ties, [0.0, -0.0]]).astype(np.float32)
    assert np.array_equal(data.bf16_bits(x), _bf16_rne(x))


def test_fp8_absmax_maps_to_format_max():
    x = np.array([-3.0, 0.5, 1.5, 0.0], np.float32)
    b = data.fp8_bytes(x, "e4m3")
    back = torch.from_numpy(b).view(torch.float8_e4m3fn).float().numpy()
    assert back[0] == -448.0 and back[3] == 0.0
    assert data.fp8_scale(x, "e4m3") == pytest.approx(448.0 / 3.0)
    b5 = torch.from_numpy(data.fp8_bytes(x, "e5m2")).view(torch.float8_e5m2).float().numpy()
    assert b5[0] == -57344.0


def test_fp8_zero_tensor_and_bad_format():
    assert data.fp8_scale(np.zeros(4, np.float32)) == 1.0
    assert not data.fp8_bytes(np.zeros(4, np.float32)).any()
    with pytest.raises(ValueError, match="FP8 format"):
        data.fp8_bytes(np.ones(2, np.float32), "e3m4")


def test_capture_classes_are_real_and_cached():
    cap = data.capture()
    assert cap is data.capture()
    n_weights = sum(a.size for a in cap.weights.values())
    assert 22_000_000 < n_weights < 23_500_000  # 22.7 M parameters
    assert set(cap.gradients) < set(cap.weights)
    assert all("pooler" in n for n in set(cap.weights) - set(cap.gradients))
    # 6 layers x (q/k/v input once, attention output, FFN1, FFN2) + the pooler
    assert len(cap.activations) == 25
    assert not any(n.endswith((".key", ".value")) for n in cap.activations)
    for name in cap.activations:
        assert name in {n.rsplit(".", 1)[0] for n in cap.weights}
    word = cap.gradients["0.model.embeddings.word_embeddings.weight"]
    assert (word == 0).mean() > 0.99  # only the batch's tokens get gradient
    for cls in (cap.weights, cap.activations, cap.gradients):
        for a in cls.values():
            assert a.dtype == np.float32 and np.isfinite(a).all() and not a.flags.writeable


def test_tensor_classes_have_the_codec_dtypes():
    cap = data.capture()
    for name, expect in [
        ("bf16_weights", cap.weights),
        ("bf16_activations", cap.activations),
        ("bf16_gradients", cap.gradients),
    ]:
        got = data.tensor_class(name)
        assert list(got) == list(expect)
        some = next(iter(got))
        assert got[some].dtype == np.uint16 and got[some].shape == expect[some].shape
        assert np.array_equal(got[some], data.bf16_bits(expect[some]))
    fp8 = data.tensor_class("fp8_activations")
    assert all(a.dtype == np.uint8 for a in fp8.values())
    flat = data.concat(fp8)
    assert flat.size == sum(a.size for a in cap.activations.values())
    # every tensor is absmax-scaled on its own: its largest magnitude byte is 448 (0x7e / 0xfe)
    for a in fp8.values():
        assert int((a & 0x7F).max()) == 0x7E
    with pytest.raises(ValueError, match="unknown tensor class"):
        data.tensor_class("fp16_weights")


def test_histogram_counts_every_symbol():
    h = data.histogram(np.array([0, 0, 255, 7], np.uint8))
    assert h.shape == (256,) and h.sum() == 4 and h[0] == 2 and h[255] == 1 and h[7] == 1


def test_capture_does_not_depend_on_the_thread_count():
    """A fresh capture under another torch thread count is bit-identical, and restores the count."""
    before = torch.get_num_threads()
    torch.set_num_threads(2 if before != 2 else 3)
    try:
        again = data.capture.__wrapped__()
        assert torch.get_num_threads() == (2 if before != 2 else 3)
    finally:
        torch.set_num_threads(before)
    cap = data.capture()
    for cls in ("weights", "activations", "gradients"):
        a, b = getattr(cap, cls), getattr(again, cls)
        assert list(a) == list(b)
        assert all(np.array_equal(a[n], b[n]) for n in a), cls
