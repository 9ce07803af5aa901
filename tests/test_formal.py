"""sim/formal.py: the bounded model checks pass on the blocks, and a broken rule is caught."""

from __future__ import annotations

from dataclasses import replace

import pytest
from amaranth import Module, Signal
from amaranth.hdl import Assert
from amaranth.sim import Simulator
from hypothesis import given, settings
from zipccl.golden.codebook import ALPHABET, Codebook
from zipccl.hw.loopback import QLCLoopback
from zipccl.hw.tables import DecoderTables, encoder_lut
from zipccl.sim import formal

from tests.strategies import QLC, ZIPCCL, codebooks

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not formal.have_tools(), reason=formal.INSTALL_HINT),
]


@pytest.mark.parametrize(
    ("name", "mutant_says"),
    [
        ("encoder", "a last word only for a packet"),
        ("decoder", "last on a packet's last symbol"),
        ("decoder_x4", "last on a packet's last symbol"),
        ("loopback", "each symbol out is the one that went in"),
        ("loopback_writes", "no table write lands while symbols are in flight"),
    ],
)
def test_stream_rules_hold_and_a_broken_rule_is_caught(
    tmp_path, monkeypatch: pytest.MonkeyPatch, name: str, mutant_says: str
) -> None:
    """A shallow run of each check (the full depths run in ``nox -s formal``; the loopback's
    first symbol leaves at clock 9, so 10 is the shallowest run its mutant fails in)."""
    monkeypatch.setitem(formal.CHECKS, name, replace(formal.CHECKS[name], depth=10))
    passed, why, _ = formal.run_check(name, tmp_path)
    assert passed, why
    passed, why, _ = formal.run_check(name, tmp_path, mutant=True)
    assert not passed and mutant_says in why, why


def test_cli_runs_the_named_checks(tmp_path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setitem(formal.CHECKS, "encoder", formal.Check(formal.encoder_harness, 1, 8))
    assert formal.main(["--checks", "encoder", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "encoder: depth 8, PASS" in out and "mutant caught" in out and "formal: PASS" in out


def _coded_back(enc_book: Codebook, dec_book: Codebook) -> list[bool]:
    """The loopback check's premise, ``formal.coded_back``, for every symbol, on the encoder
    table of ``enc_book`` and the decoder tables of ``dec_book`` (Amaranth simulation)."""
    m = Module()
    enc_lut, tables = encoder_lut(enc_book), DecoderTables(dec_book)
    m.submodules.enc_lut, m.submodules.rank_lut = enc_lut, tables.lut
    symbol, holds = Signal(8), Signal()
    m.d.comb += holds.eq(formal.coded_back(m, enc_lut, tables, symbol))
    results: list[bool] = []

    async def bench(ctx) -> None:
        for s in range(ALPHABET):
            ctx.set(symbol, s)
            results.append(bool(ctx.get(holds)))

    sim = Simulator(m)
    sim.add_testbench(bench)
    sim.run()
    return results


@pytest.mark.parametrize("book", [QLC, ZIPCCL], ids=["qlc", "zipccl"])
def test_every_complete_table_meets_the_loopback_premise(book: Codebook) -> None:
    """The loopback check assumes ``coded_back`` of every symbol offered; a complete table (a
    Codebook's images) must meet it for all 256, or the check would skip real tables."""
    assert all(_coded_back(book, book))


@settings(max_examples=10, deadline=None)
@given(book=codebooks())
def test_random_complete_tables_meet_the_loopback_premise(book: Codebook) -> None:
    assert all(_coded_back(book, book))


def test_mismatched_tables_break_the_loopback_premise() -> None:
    """Encoder and decoder holding different tables: the premise fails, so it says something."""
    assert not all(_coded_back(QLC, ZIPCCL))
    assert not all(_coded_back(ZIPCCL, QLC))


def test_loopback_check_starts_from_any_table(tmp_path) -> None:
    """With ``free_tables`` the tables are not their default: a check that they are must fail
    at once (else the loopback check would prove the default table only)."""
    loopback = QLCLoopback()
    m = formal.loopback_harness(loopback=loopback)
    tables = loopback.dec.tables
    m.d.comb += Assert(tables.num_ranked == tables.num_ranked.init, "the default table")
    passed, why = formal.bmc(formal.write_model(m, tmp_path, free_tables=True), 2, "yices")
    assert not passed and "the default table" in why
