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


def _loopback_model(tmp_path, claim, writes: bool = False):
    """The loopback harness with one more assertion, ``claim(m, loopback)``, as a model."""
    loopback = QLCLoopback()
    m = formal.loopback_harness(loopback=loopback, writes=writes)
    m.d.comb += Assert(claim(m, loopback), "the claim")
    return formal.write_model(m, tmp_path, free_state=True)


@pytest.mark.parametrize(
    "claim",
    [
        lambda m, lb: lb.dec.tables.num_ranked == lb.dec.tables.num_ranked.init,
        lambda m, lb: lb.o.payload.data == 0,  # the output stage's registers: a stale symbol
    ],
    ids=["tables", "stale data"],
)
def test_loopback_checks_start_from_any_tables_and_stale_data(tmp_path, claim) -> None:
    """With ``free_state`` a run starts with any tables and any stale data in the registers
    outside ``SETTLED``: a claim that they hold their reset values must fail at once (else the
    checks would prove the reset state only, not every state between packets)."""
    passed, why = formal.bmc(_loopback_model(tmp_path, claim), 1, "yices")
    assert not passed and "the claim" in why


def _no_write_after_a_symbol(m, lb):
    seen_out = Signal()
    m.d.sync += seen_out.eq(seen_out | (lb.o.valid & lb.o.ready))
    return ~(seen_out & lb.tw.valid & lb.tw.ready)


def test_a_table_write_after_a_packet_is_within_the_writes_depth(tmp_path) -> None:
    """The chain argument needs the writes check to reach a write after a packet's symbols:
    claiming that none lands after a symbol came out must fail within its depth."""
    model = _loopback_model(tmp_path, _no_write_after_a_symbol, writes=True)
    passed, why = formal.bmc(model, formal.CHECKS["loopback_writes"].depth, "yices")
    assert not passed and "the claim" in why


def test_the_data_check_fails_from_an_unsettled_encoder(tmp_path, monkeypatch) -> None:
    """``SETTLED`` is what the data check stands on: with the packer's pending bits (``acc``)
    free at the start, stale bits join the first code and the check fails."""
    settled = dict(formal.SETTLED, enc=tuple(r for r in formal.SETTLED["enc"] if r != "acc"))
    monkeypatch.setattr(formal, "SETTLED", settled)
    monkeypatch.setitem(formal.CHECKS, "loopback", replace(formal.CHECKS["loopback"], depth=10))
    passed, why, _ = formal.run_check("loopback", tmp_path)
    assert not passed and "each symbol out is the one that went in" in why


def test_settled_names_only_registers_of_the_blocks(monkeypatch) -> None:
    monkeypatch.setattr(formal, "SETTLED", {"dec": ("no_such_register",)})
    with pytest.raises(ValueError, match=r"dec\.no_such_register"):
        formal.loopback_harness()
