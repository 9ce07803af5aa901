"""sim/formal.py: the bounded model checks pass on the blocks, and a broken rule is caught."""

from __future__ import annotations

import pytest
from zipccl.sim import formal

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not formal.have_tools(), reason=formal.INSTALL_HINT),
]


@pytest.mark.parametrize(
    ("name", "harness", "lanes", "mutant_says"),
    [
        ("encoder", formal.encoder_harness, 1, "a last word only for a packet"),
        ("decoder", formal.decoder_harness, 1, "last on a packet's last symbol"),
        ("decoder_x4", formal.decoder_harness, 4, "last on a packet's last symbol"),
    ],
)
def test_stream_rules_hold_and_a_broken_rule_is_caught(
    tmp_path, monkeypatch: pytest.MonkeyPatch, name: str, harness, lanes: int, mutant_says: str
) -> None:
    """A shallow run of each check (the full depths run in ``nox -s formal``)."""
    monkeypatch.setitem(formal.CHECKS, name, formal.Check(harness, lanes, 8))
    passed, why, _ = formal.run_check(name, tmp_path)
    assert passed, why
    passed, why, _ = formal.run_check(name, tmp_path, mutant=True)
    assert not passed and mutant_says in why, why


def test_cli_runs_the_named_checks(tmp_path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setitem(formal.CHECKS, "encoder", formal.Check(formal.encoder_harness, 1, 8))
    assert formal.main(["--checks", "encoder", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "encoder: depth 8, PASS" in out and "mutant caught" in out and "formal: PASS" in out
