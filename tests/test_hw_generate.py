"""Verilog generation, memory images from the golden table constants, and the synthesis script."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest
from zipccl.golden.codebook import Codebook
from zipccl.golden.presets import qlc_e4m3
from zipccl.hw.generate import ROOT, TOPS, generate, main, verilog_text
from zipccl.hw.tables import EncEntry, Mem, RegionEntry, pack_table_write, table_writes


def test_generate_writes_verilog_and_memh(tmp_path) -> None:
    tops = ("qlc_encoder", "qlc_decoder_x2", "qlc_decoder_axis")
    heard: list[str] = []
    paths = generate(tmp_path, tops=tops, progress=heard.append)
    names = {p.name for p in paths}
    assert {f"{t}.v" for t in tops} <= names and len(heard) == len(tops) + 1
    book = qlc_e4m3()
    for kind, words in (("enc", book.encoder_words()), ("rank", book.rank_words())):
        text = (tmp_path / f"{book.name}_{kind}.hex").read_text().split()
        assert [int(w, 16) for w in text] == words
    enc = (tmp_path / "qlc_encoder.v").read_text()
    assert "module qlc_encoder" in enc and "i__payload" in enc and "tw__ready" in enc


def test_generate_honours_a_table_file(tmp_path) -> None:
    book = Codebook((8, 0, 0, 0, 0, 0, 0, 0), 0, (1, 2, 3, 4, 5, 6, 7), name="tiny")
    path = tmp_path / "t.json"
    book.save(path)
    assert main(["--out", str(tmp_path / "o"), "--table", str(path), "--tops", "qlc_decoder"]) == 0
    assert (tmp_path / "o" / "tiny_count.hex").read_text().strip() == "007"
    assert {p.name for p in (tmp_path / "o").glob("*.v")} == {"qlc_decoder.v"}


def test_every_top_is_a_choice_and_unknown_ones_are_refused() -> None:
    assert {"qlc_encoder", "qlc_decoder_x8", "qlc_encoder_x32", "qlc_decoder_axis_x4"} <= set(TOPS)
    with pytest.raises(ValueError, match="unknown top 'qlc_fast'"):
        verilog_text("qlc_fast")
    with pytest.raises(SystemExit):
        main(["--tops", "qlc_fast"])


def test_verilog_is_byte_identical_from_any_checkout(tmp_path) -> None:
    """Source locations are relative to the folder that holds the zipccl package (a checkout's
    sw/, or site-packages): the same sources elsewhere write the same bytes, and no absolute path
    is left."""
    copy = tmp_path / "elsewhere" / "site"
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(ROOT / "zipccl", copy / "zipccl", ignore=ignore)  # golden/, hw/ as folders
    top = "qlc_decoder_axis"
    env = {**os.environ, "PYTHONPATH": str(copy)}
    run = subprocess.run(
        [
            sys.executable,
            "-c",
            "import zipccl.hw.generate as g, sys; "
            "assert g.ROOT == __import__('pathlib').Path(sys.argv[1]), g.ROOT; "
            "sys.stdout.write(g.verilog_text(sys.argv[2]))",
            str(copy),
            top,
        ],
        cwd=copy,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    here = verilog_text(top)
    assert run.stdout == here
    sources = re.findall(r'src = "([^"]*)"', here)
    assert sources and not [s for s in sources if s.startswith("/") or ":\\" in s]
    assert any(s.startswith("zipccl/hw/") for s in sources)


def test_table_write_beats_follow_the_layouts() -> None:
    book = qlc_e4m3()
    beats = table_writes(book)
    assert len(beats) == 256 + 8 + 256 + 1
    mem, addr, word = beats[300]
    assert (mem, addr) == (Mem.RANK, 300 - 264) and word == book.rank_words()[36]
    assert pack_table_write(Mem.COUNT, 0, 120) == 3 | 120 << 10
    entry = book.encoder_words()[0]
    assert entry >> EncEntry["width"].offset == book.code_lengths()[0] - 3
    assert RegionEntry.size == 14


@pytest.mark.slow
@pytest.mark.skipif(
    not (shutil.which("yosys") and shutil.which("nextpnr-ice40")), reason="needs yosys, nextpnr"
)
def test_synth_reports_figures(tmp_path) -> None:
    from zipccl.hw.synth import synth_block

    fig = synth_block("qlc_encoder", tmp_path, seeds=(1, 2, 3))
    assert fig.rams == 1 and 0 < fig.luts < 5280
    assert set(fig.seeds_mhz) == {1, 2, 3} and fig.fmax_mhz == sorted(fig.seeds_mhz.values())[1]


@pytest.mark.slow
@pytest.mark.skipif(
    not (shutil.which("yosys") and shutil.which("nextpnr-ice40")), reason="needs yosys, nextpnr"
)
def test_synth_maps_with_abc9_when_asked(tmp_path) -> None:
    """``--abc9`` adds yosys' ABC9 mapping to the device's synth command, which the figures
    record beside the block's placed result."""
    from zipccl.hw.synth import main as synth_main

    argv = ["--out", str(tmp_path), "--blocks", "qlc_encoder", "--generic", "--abc9"]
    assert synth_main(argv) == 0
    doc = json.loads((tmp_path / "figures.json").read_text())
    assert doc["synth"] == "synth_ice40 -abc9"
    (block,) = doc["blocks"]
    assert block["fmax_mhz"] > 0 and block["rams"] == 1


@pytest.mark.slow
@pytest.mark.skipif(not shutil.which("yosys"), reason="needs yosys")
def test_generic_count_keeps_memories_when_asked(tmp_path) -> None:
    """The generic count maps the encoder's table to logic by default and, kept, counts it as
    one memory cell per copy (both runs must get through yosys)."""
    from zipccl.hw.synth import generic_cells

    as_logic = generic_cells("qlc_encoder", tmp_path)
    kept = generic_cells("qlc_encoder", tmp_path, keep_memories=True)
    assert "$mem_v2" not in as_logic and kept.get("$mem_v2", 0) >= 1
    assert sum(kept.values()) < sum(as_logic.values())
