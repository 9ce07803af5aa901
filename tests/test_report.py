"""golden.report on the real MiniLM tensors: the JSON object's keys, and figures that make sense."""

from __future__ import annotations

import contextlib
import io
import json

import numpy as np
import pytest
from zipccl.golden import report
from zipccl.golden.theory import tensor_stats

slow = pytest.mark.slow  # ~40 s: the model, four classes, container encodes of 50 M values


@pytest.fixture(scope="module")
def run_once(tmp_path_factory):
    """One full ``--json --plot`` run: (JSON object, stderr text, plot folder)."""
    pytest.importorskip("matplotlib")
    plots = tmp_path_factory.mktemp("plots")
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        assert report.main(["--json", "--plot", str(plots)]) == 0
    return json.loads(stdout.getvalue()), stderr.getvalue(), plots


@slow
def test_json_has_every_class_and_method(run_once):
    doc, _, _ = run_once
    assert list(doc) == list(report.CLASSES)
    for cls, methods in doc.items():
        names = [k for k, v in methods.items() if isinstance(v, dict)]
        for family in ("zipccl", "qlc", "huffman", "exp_golomb", "entropy"):
            assert any(family in n for n in names), (cls, family)
        original = 8 if cls.startswith("fp8") else 16
        for name in names:
            row = methods[name]
            assert 0 < row["bits_per_element"] <= original * 1.2, (cls, name)
            assert row["ratio"] == pytest.approx(row["bits_per_element"] / original)
            assert row["covers"]


@slow
@pytest.mark.parametrize("cls", ["bf16_weights", "bf16_activations", "bf16_gradients"])
def test_bf16_figures(run_once, cls):
    m = run_once[0][cls]
    for name in ("zipccl_theory", "zipccl_histogram"):
        real, ideal = m[name]["bits_per_element"], m[name]["table_bits_per_element"]
        assert 8 + 3 <= ideal <= real < 12  # 8 raw + >= 3 code bits; the container adds a little
        assert real - ideal < 0.1
    # the histogram table is the measured top 7: never worse than the theory table's code
    assert m["zipccl_histogram"]["table_bits_per_element"] <= (
        m["zipccl_theory"]["table_bits_per_element"] + 1e-9
    )
    bits = {k: v["bits_per_element"] for k, v in m.items() if isinstance(v, dict)}
    assert bits["entropy"] <= bits["huffman"] <= bits["qlc_best"] + 1e-9
    assert bits["qlc_best"] <= min(bits["qlc_heuristic"], bits["qlc_dynamic"]) + 1e-9
    assert bits["qlc_best"] <= m["zipccl_histogram"]["table_bits_per_element"] + 1e-9
    assert bits["raw"] == 16


@slow
def test_fp8_figures(run_once):
    m = run_once[0]["fp8_activations"]
    bits = {k: v["bits_per_element"] for k, v in m.items() if isinstance(v, dict)}
    assert bits["entropy"] <= bits["huffman"] <= bits["qlc_best"] <= bits["qlc_best_6_7_8_11"]
    assert bits["qlc_best_6_7_8_11"] <= min(bits["qlc_heuristic"], bits["qlc_preset"]) + 1e-9
    assert bits["qlc_best"] <= bits["qlc_dynamic_searched"] <= bits["qlc_dynamic"] + 1e-9
    assert 5.5 < bits["qlc_best"] < 7.5  # real activations compress, but not wildly
    for name in ("qlc_best", "qlc_preset"):
        assert 0 < m[name]["container_bits_per_element"] - bits[name] < 0.2
    assert m["numel"] == sum(a.size for a in report.data.fp8_activations().values())


@slow
def test_progress_and_plots(run_once):
    _, log, plots = run_once
    assert "fp8_activations" in log and "tensors" in log
    for cls in report.CLASSES:
        png = plots / f"{cls}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_fp8_theory_is_a_distribution_matching_gaussian_samples():
    rng = np.random.default_rng(11)
    x = rng.standard_normal(400_000).astype(np.float32) * 30
    probs = report.fp8_byte_probabilities(30.0 * report.data.fp8_scale(x))
    assert probs.sum() == pytest.approx(1.0)
    assert probs[0x7F] == probs[0xFF] == 0  # NaN bytes
    counts = np.bincount(report.data.fp8_bytes(x), minlength=256)
    measured = counts / counts.sum()
    assert np.abs(measured - probs).sum() < 0.02  # total variation, 400 k samples


def test_theory_table_uses_the_bf16_values():
    bits = report.data.bf16_bits(np.linspace(-4, 4, 1001, dtype=np.float32))
    assert np.array_equal(report.bf16_values(bits)[[0, 500, 1000]], [-4.0, 0.0, 4.0])
    book = report.theory_table(bits)
    stats = tensor_stats(report.bf16_values(bits))
    assert book.name.endswith(f"rms{stats.rms:.3g}-z{stats.zero_fraction:.3g}")


def test_text_and_markdown_tables():
    doc = {
        "bf16_x": {
            "zipccl_theory": {
                "bits_per_element": 11.25,
                "ratio": 11.25 / 16,
                "covers": "container bytes |x|",
                "table_bits_per_element": 11.2,
            },
            "raw": {"bits_per_element": 16.0, "ratio": 1.0, "covers": "uncompressed"},
            "numel": 10,
            "tensors": 2,
        }
    }
    text = report.format_text(doc)
    assert "bf16_x (2 tensors, 10 elements)" in text
    assert "zipccl_theory" in text and "11.250" in text and "ideal 11.200" in text
    md = report.format_text(doc, markdown=True).splitlines()
    assert md[0] == "### bf16_x (2 tensors, 10 elements)"
    assert "| zipccl_theory | 11.250 | 0.703 | ideal 11.200 | container bytes \\|x\\| |" in md
    assert "| raw | 16.000 | 1.000 |  | uncompressed |" in md
