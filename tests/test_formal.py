"""sim/formal.py: the bounded model checks pass on the blocks, and a broken rule is caught."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from amaranth import Module, Signal
from amaranth.hdl import Assert
from amaranth.sim import Simulator
from hypothesis import given, settings
from zipccl.golden.codebook import ALPHABET, Codebook
from zipccl.golden.streams import StreamError, encode_codewords, resolve
from zipccl.hw.loopback import QLCLoopback
from zipccl.hw.tables import DecoderTables, encoder_lut
from zipccl.sim import formal

from tests.strategies import QLC, ZIPCCL, codebooks

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not formal.have_tools(), reason=formal.INSTALL_HINT),
]


@pytest.mark.parametrize(
    ("name", "depth", "mutant_says"),
    [
        ("encoder", 10, "a last word only for a packet"),
        ("decoder", 10, "last on a packet's last symbol"),
        ("decoder_x4", 10, "last on a packet's last symbol"),
        ("loopback", 10, "each symbol out is the one that went in"),
        ("loopback_writes", 10, "no symbol in flight where a table write can land"),
        ("loopback_errors", 11, "error never rises"),
        ("loopback_error_bound", 12, "error within the bound of the first fault's start"),
    ],
)
def test_the_checks_hold_and_a_broken_rule_is_caught(
    tmp_path, name: str, depth: int, mutant_says: str
) -> None:
    """A shallow run of each check (the full depths run in ``nox -s formal``): the loopback's
    first symbol leaves at clock 9, so 10 is the shallowest run its mutant fails in, and the
    first error (an illegal first codeword's) rises a clock later; bad padding's bound is first
    reached at clock 11."""
    passed, why, _ = formal.run_check(name, tmp_path, depth=depth)
    assert passed, why
    passed, why, _ = formal.run_check(name, tmp_path, mutant=True, depth=depth)
    assert not passed and mutant_says in why, why


@pytest.mark.parametrize("name", ["decoder", "encoder"])
def test_the_induction_step_needs_the_invariants(tmp_path, monkeypatch, name: str) -> None:
    """Without the invariants on the blocks' registers the induction step fails (from a state
    no run reaches), so they are what makes it go through, not a vacuous model."""
    monkeypatch.setattr(formal, "_decoder_invariants", lambda *args: None)
    monkeypatch.setattr(formal, "_encoder_invariants", lambda *args: None)
    check = formal.CHECKS[name]
    model = formal.write_model(check.make(check.lanes), tmp_path)
    passed, _ = formal.bmc(model, check.induction or 1, "yices", induction=True)
    assert not passed, f"{name}: the induction step passed without the invariants"


@pytest.mark.parametrize("kind", ["illegal", "padding"])
def test_each_error_bound_is_reached_within_the_depth(tmp_path, kind: str) -> None:
    """The bound check's depth reaches both faults' bounds: one clock less for either kind
    alone fails (the check's mutant shortens both at once)."""
    shorter = {kind: getattr(formal.ERROR_BOUNDS, kind) - 1}
    harness = formal.bound_harness(bounds=dataclasses.replace(formal.ERROR_BOUNDS, **shorter))
    model = formal.write_model(harness, tmp_path, free_state=True)
    passed, why = formal.bmc(model, formal.CHECKS["loopback_error_bound"].depth, "yices")
    assert not passed and "error within the bound" in why, why


def test_cli_runs_the_named_checks(tmp_path, capsys) -> None:
    argv = ["--checks", "encoder", "encoder_x4", "--depth", "8", "--out", str(tmp_path)]
    assert formal.main(argv) == 0
    out = capsys.readouterr().out
    proved = "depth 8 and 1-induction (any length), PASS"
    assert f"encoder: {proved}" in out and f"encoder_x4: {proved}" in out
    assert out.count("mutant caught") == 2 and "formal: PASS" in out


@pytest.mark.parametrize("bad", [["--depth", "0"], ["--depth", "17"], ["--jobs", "0"]])
def test_cli_refuses_bad_numbers(bad: list[str], capsys) -> None:
    with pytest.raises(SystemExit):
        formal.main(["--checks", "encoder", *bad])
    assert bad[0] in capsys.readouterr().err


def _coding(enc_book: Codebook, dec_book: Codebook) -> list[tuple[bool, bool]]:
    """``formal.coding`` (back, illegal) for every symbol, on the encoder table of ``enc_book``
    and the decoder tables of ``dec_book`` (Amaranth simulation)."""
    m = Module()
    enc_lut, tables = encoder_lut(enc_book), DecoderTables(dec_book)
    m.submodules.enc_lut, m.submodules.rank_lut = enc_lut, tables.lut
    symbol, back, illegal = Signal(8), Signal(), Signal()
    coding = formal.coding(m, enc_lut, tables, symbol)
    m.d.comb += [back.eq(coding.back), illegal.eq(coding.illegal)]
    results: list[tuple[bool, bool]] = []

    async def bench(ctx) -> None:
        for s in range(ALPHABET):
            ctx.set(symbol, s)
            results.append((bool(ctx.get(back)), bool(ctx.get(illegal))))

    sim = Simulator(m)
    sim.add_testbench(bench)
    sim.run()
    return results


@pytest.mark.parametrize("book", [QLC, ZIPCCL], ids=["qlc", "zipccl"])
def test_every_complete_table_meets_the_loopback_premise(book: Codebook) -> None:
    """The loopback checks assume that every symbol offered codes back (``coding``'s ``back``);
    a complete table (a Codebook's images) must do so for all 256, or the checks would skip
    real tables."""
    assert all(back and not illegal for back, illegal in _coding(book, book))


@settings(max_examples=10, deadline=None)
@given(book=codebooks())
def test_random_complete_tables_meet_the_loopback_premise(book: Codebook) -> None:
    assert all(back and not illegal for back, illegal in _coding(book, book))


# QLC's regions with the last one literal: all 104 ranks used, and the same regions ranking 90
RANKS_104 = Codebook((3, 3, 3, 4, 4, 4, 5, 8), 7, tuple(range(104)), name="ranks-104")
RANKS_90 = Codebook((3, 3, 3, 4, 4, 4, 5, 8), 7, tuple(range(90)), name="ranks-90")


@pytest.mark.parametrize(
    ("enc_book", "dec_book"),
    [(QLC, ZIPCCL), (ZIPCCL, QLC), (RANKS_104, RANKS_90)],
    ids=["qlc-zipccl", "zipccl-qlc", "ranks-104-90"],
)
def test_the_premises_match_golden_on_mismatched_tables(
    enc_book: Codebook, dec_book: Codebook
) -> None:
    """``coding`` says what golden/ does with a symbol coded by one table and decoded by
    another: ``back`` where it decodes to the symbol, ``illegal`` where it is rejected as an
    illegal codeword (the error check's faults), neither where the widths disagree."""
    expected = []
    for symbol in range(ALPHABET):
        codeword = encode_codewords(np.array([symbol]), enc_book)
        if dec_book.widths[int(codeword.prefix[0])] != int(codeword.width[0]):
            expected.append((False, False))
            continue
        try:
            expected.append((int(resolve(codeword, dec_book)[0]) == symbol, False))
        except StreamError:
            expected.append((False, True))
    assert _coding(enc_book, dec_book) == expected
    assert not all(back for back, _ in expected)
    if enc_book is RANKS_104:  # ranks 90..103 are illegal there, the rest codes back
        assert expected == [(not 90 <= s < 104, 90 <= s < 104) for s in range(ALPHABET)]


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
    passed, why, _ = formal.run_check("loopback", tmp_path, depth=10)
    assert not passed and "each symbol out is the one that went in" in why


def test_settled_names_only_registers_of_the_blocks(monkeypatch) -> None:
    monkeypatch.setattr(formal, "SETTLED", {"dec": ("no_such_register",)})
    with pytest.raises(ValueError, match=r"dec\.no_such_register"):
        formal.loopback_harness()
