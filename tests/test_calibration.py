"""zipccl.Calibrator and the model table file (golden/tablefile.py): per-key tables from warm-up
observations, saved and loaded bit for bit, the same tables in the hardware's memory images and
in the decoder under Icarus (cocotb)."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
import zipccl
from zipccl.golden import builders, tablefile
from zipccl.golden.codebook import Codebook, TableError
from zipccl.golden.formats import BF16, E4M3
from zipccl.golden.streams import encode_serial
from zipccl.golden.tablefile import Entry
from zipccl.hw.generate import main as generate_main
from zipccl.sim.cases import load_data
from zipccl.sim.runner import have_icarus, run_module

STEPS = 4
CHUNK = 4096


def minilm() -> dict[str, torch.Tensor]:
    """The built-in MiniLM tensors (sim/data/minilm.npz): two FP8 e4m3 activations, a BF16
    gradient; each key is observed as STEPS chunks of CHUNK values."""
    d = load_data()
    return {
        "layer2.ffn1.input": torch.from_numpy(d["fp8_ffn1"]).view(torch.float8_e4m3fn),
        "layer2.ffn2.input": torch.from_numpy(d["fp8_ffn2"]).view(torch.float8_e4m3fn),
        "layer2.ffn1.weight.grad": torch.from_numpy(d["bf16_grad"].view(np.int16)).view(
            torch.bfloat16
        ),
    }


def symbols(x: torch.Tensor) -> np.ndarray:
    """The region code's symbols: the FP8 byte, or the BF16 exponent."""
    if x.dtype == torch.bfloat16:
        return BF16.symbols(x.view(torch.int16).numpy().view(np.uint16))
    return x.view(torch.uint8).numpy()


@pytest.fixture(scope="module")
def calibrated() -> zipccl.Calibrator:
    cal = zipccl.Calibrator(steps=STEPS)
    for step in range(STEPS + 2):  # the last two observations are no-ops
        for key, x in minilm().items():
            cal.observe(key, x[step * CHUNK % x.numel() :][:CHUNK])
    return cal


# --------------------------------------------------------------------------- calibration
def test_tables_are_best_table_of_the_first_observations(calibrated) -> None:
    assert list(calibrated.tables()) == list(minilm())
    for key, x in minilm().items():
        first = torch.cat([x[s * CHUNK % x.numel() :][:CHUNK] for s in range(STEPS)])
        hist = np.bincount(symbols(first), minlength=256)
        assert calibrated.table(key) == builders.best_table(hist)
        assert calibrated.table(key).name == key


def test_compress_takes_the_key_table_once_calibrated() -> None:
    x = minilm()["layer2.ffn1.input"]
    cal = zipccl.Calibrator(steps=2)
    cal.observe("a", x[:CHUNK])
    assert not cal.calibrated("a")
    assert cal.compress("a", x).table == zipccl.default_table(x)
    cal.observe("a", x[CHUNK : 2 * CHUNK])
    c = cal.compress("a", x)
    assert cal.calibrated("a") and c.table == cal.table("a")
    assert torch.equal(zipccl.decompress(c.buffer).view(torch.uint8), x.view(torch.uint8))
    assert cal.compress("unseen", x).table == zipccl.default_table(x)
    cal.observe("a", torch.zeros(10, dtype=torch.float8_e4m3fn))  # calibrated: a no-op
    assert cal.compress("a", x).table == c.table


def test_save_and_load_keep_every_table_bit_for_bit(calibrated, tmp_path: Path) -> None:
    path = tmp_path / "model.json"
    calibrated.save(path)
    again = zipccl.Calibrator.load(path)
    assert all(again.calibrated(k) for k in calibrated.tables())
    for key, book in calibrated.tables().items():
        back = again.table(key)
        assert back.to_bytes() == book.to_bytes() and back.sha256 == book.sha256
        assert back.name == key
    doc = json.loads(path.read_text())
    assert doc["tables"]["layer2.ffn1.weight.grad"]["dtype"] == "bfloat16"
    again.save(tmp_path / "again.json")
    assert (tmp_path / "again.json").read_text() == path.read_text()


def test_keys_still_counting_are_not_saved(tmp_path: Path) -> None:
    cal = zipccl.Calibrator(steps=3)
    cal.observe("k", minilm()["layer2.ffn1.input"])
    cal.save(tmp_path / "m.json")
    assert zipccl.Calibrator.load(tmp_path / "m.json").tables() == {}
    with pytest.raises(ValueError, match="1 of 3 observations"):
        cal.table("k")


def test_an_empty_key_still_gets_a_table() -> None:
    cal = zipccl.Calibrator(steps=1)
    cal.observe("empty", torch.empty(0, dtype=torch.float16))
    assert cal.table("empty").expected_bits(np.eye(256)[0]) == 3.0  # symbol 0 ranked first


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda c: zipccl.Calibrator(steps=0), ValueError, "at least 1"),
        (lambda c: zipccl.Calibrator(steps=2.0), TypeError, "steps must be an int"),
        (lambda c: zipccl.Calibrator(steps=True), TypeError, "steps must be an int"),
        (lambda c: c.observe("k", np.zeros(3)), TypeError, "torch.Tensor"),
        (lambda c: c.observe("k", torch.zeros(3, dtype=torch.int32)), TypeError, "unsupported"),
        (lambda c: c.observe(3, torch.zeros(3)), TypeError, "string"),
        (lambda c: c.observe("", torch.zeros(3)), ValueError, "1..256 characters"),
        (lambda c: c.observe("k" * 257, torch.zeros(3)), ValueError, "1..256 characters"),
        (lambda c: c.observe("bf16", torch.zeros(3)), TypeError, "holds bfloat16 tensors"),
        (lambda c: c.compress("bf16", torch.zeros(3)), TypeError, "holds bfloat16 tensors"),
        (lambda c: c.table("nobody"), ValueError, "0 of 5 observations"),
        (lambda c: c.table(None), TypeError, "string"),
    ],
)
def test_bad_input_is_named(call, error: type, match: str) -> None:
    cal = zipccl.Calibrator(steps=5)
    cal.observe("bf16", torch.zeros(3, dtype=torch.bfloat16))
    with pytest.raises(error, match=match):
        call(cal)


# --------------------------------------------------------------------------- the file format
def _doc(calibrated) -> dict:
    return json.loads(tablefile.dumps({k: Entry(E4M3, b) for k, b in calibrated.tables().items()}))


def _broken(doc: dict, case: str) -> str:
    tables = doc["tables"]
    first = next(iter(tables.values()))
    if case == "format":
        doc["format"] = "zipccl-region-code"
    elif case == "version":
        doc["version"] = 2
    elif case == "extra key":
        doc["comment"] = "x"
    elif case == "missing key":
        del doc["tables"]
    elif case == "tables not an object":
        doc["tables"] = list(tables)
    elif case == "entry keys":
        first["lanes"] = 1
    elif case == "dtype":
        first["dtype"] = "int8"
    elif case == "rank changed":
        first["table"]["rank_to_symbol"][0] ^= 1
    elif case == "empty key":
        tables[""] = first
    elif case == "float":
        return json.dumps(doc).replace('"version": 1', '"version": 1.0')
    elif case == "duplicate key":
        text = json.dumps(doc)
        key = next(iter(tables))
        return text.replace(f'"{key}": ', f'"{key}": {json.dumps(first)}, "{key}": ', 1)
    return json.dumps(doc)


@pytest.mark.parametrize(
    "case",
    [
        "format",
        "version",
        "extra key",
        "missing key",
        "tables not an object",
        "entry keys",
        "dtype",
        "rank changed",
        "empty key",
        "float",
        "duplicate key",
    ],
)
def test_malformed_table_sets_are_refused(calibrated, case: str) -> None:
    with pytest.raises(TableError):
        tablefile.loads(_broken(_doc(calibrated), case))


def test_table_sets_are_bounded(calibrated, tmp_path: Path) -> None:
    book = next(iter(calibrated.tables().values()))
    too_many = {f"k{i}": Entry(E4M3, book) for i in range(tablefile.MAX_TABLES + 1)}
    with pytest.raises(TableError, match="at most"):
        tablefile.dumps(too_many)
    big = tmp_path / "big.json"
    big.write_text(" " * (tablefile.MAX_SET_FILE_BYTES + 1))
    with pytest.raises(TableError, match="exceeds"):
        tablefile.load(big)
    with pytest.raises(TableError, match="repeats the keys"):
        Codebook.from_json(book.to_json().replace('"name"', '"sha256": "0", "name"'))


@pytest.mark.parametrize("load", [tablefile.load, Codebook.load], ids=["set", "table"])
def test_a_table_path_that_is_not_a_regular_file_is_a_table_error(load, tmp_path: Path) -> None:
    """Issue 37: a FIFO blocked forever (waiting for a writer), a directory raised
    IsADirectoryError; both are refused by name, at once."""
    (tmp_path / "dir").mkdir()
    os.mkfifo(tmp_path / "fifo")
    for path in (tmp_path / "dir", tmp_path / "fifo"):
        found: list[BaseException] = []
        reader = threading.Thread(target=_raised, args=(load, path, found), daemon=True)
        reader.start()
        reader.join(timeout=10)
        if reader.is_alive():  # unblock the reader before failing
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
            pytest.fail(f"{path.name}: still reading after 10 s")
        assert len(found) == 1 and isinstance(found[0], TableError), found
        assert "not a regular file" in str(found[0])
    with pytest.raises(FileNotFoundError):
        load(tmp_path / "missing")


def _raised(fn, arg, found: list[BaseException]) -> None:
    try:
        fn(arg)
    except BaseException as exc:  # recorded for the test thread to check
        found.append(exc)


# --------------------------------------------------------------------------- the hardware
def test_hw_generate_writes_each_tables_memory_images(calibrated, tmp_path: Path) -> None:
    """Each loaded table, saved as a single table file, is what ``python -m zipccl.hw.generate
    --table`` puts in the decoder's memory images."""
    path = tmp_path / "model.json"
    calibrated.save(path)
    for key, book in zipccl.Calibrator.load(path).tables().items():
        single, out = tmp_path / f"{key}.json", tmp_path / key
        book.save(single)
        assert (
            generate_main(["--out", str(out), "--table", str(single), "--tops", "qlc_decoder"]) == 0
        )
        images = {
            kind: [int(w, 16) for w in (out / f"{key}_{kind}.hex").read_text().split()]
            for kind in ("enc", "region", "rank", "count")
        }
        assert images == {
            "enc": book.encoder_words(),
            "region": book.region_words(),
            "rank": book.rank_words(),
            "count": [book.num_ranked],
        }


@pytest.mark.rtl
@pytest.mark.skipif(not have_icarus(), reason="needs Icarus Verilog: apt-get install iverilog")
def test_rtl_decoder_replays_the_calibrated_tables(calibrated, tmp_path: Path) -> None:
    """sim/calibrated_tb.py: the decoder loads the saved tables one after another through its
    table-write port and decodes, for each, the software's stream of the key's real symbols."""
    tables, streams = tmp_path / "model.json", tmp_path / "streams.npz"
    calibrated.save(tables)
    arrays = {}
    for key, x in minilm().items():
        sym = symbols(x[-CHUNK:])
        arrays[f"symbols:{key}"] = sym
        arrays[f"stream:{key}"] = np.frombuffer(encode_serial(sym, calibrated.table(key)), np.uint8)
    np.savez(streams, **arrays)
    done = tmp_path / "done.json"
    env = {"ZIPCCL_TABLES": str(tables), "ZIPCCL_STREAMS": str(streams), "ZIPCCL_DONE": str(done)}
    run_module("qlc_decoder", "zipccl.sim.calibrated_tb", tmp_path / "work", env)
    assert json.loads(done.read_text()) == list(minilm())
