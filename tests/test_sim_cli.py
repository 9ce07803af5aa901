"""The simulation's command line: one set of block names across sim, generate and synth, the
levels a whole run gives each block, and a complete --help."""

from __future__ import annotations

import pytest
from zipccl.hw import generate, synth
from zipccl.sim import __main__ as sim_main
from zipccl.sim.suite import LEVELS, TOPS, capped


def test_block_names_are_the_verilog_modules() -> None:
    assert set(TOPS) <= set(generate.TOPS)
    assert set(synth.BLOCKS + synth.POOL_BLOCKS + synth.GENERIC_BLOCKS) <= set(generate.TOPS)


@pytest.mark.parametrize("level", list(LEVELS))
def test_a_whole_run_holds_slow_blocks_at_their_cap(level: str) -> None:
    order = list(LEVELS)
    for top, t in TOPS.items():
        got = capped(level, top)
        assert order.index(got) == min(order.index(level), order.index(t.cap)), top
    assert capped("full", "qlc_encoder") == "full"
    assert capped("full", "qlc_decoder_x8") == "smoke"
    assert capped("full", "qlc_decoder_pool_x4") == "quick"


def test_help_is_complete(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        sim_main.main(["--help"])
    assert stop.value.code == 0
    out = capsys.readouterr().out
    assert "checked bit for bit against golden/." in out  # the description's first sentence ends
    assert "Exits 1 on any mismatch" in out
    for option in ("--level", "--seed", "--tops", "--build", "--jobs"):
        block = out[out.index(f"  {option}") :].split("\n  -", 1)[0]
        assert len(block.split()) > 3, f"{option} has no help: {block!r}"
