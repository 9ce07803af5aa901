"""The documents' links and the result files they cite exist: a moved or deleted file fails here,
not in a reader's browser."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = sorted(
    p for p in ROOT.rglob("*.md") if not {".git", ".nox", "build", "out", ".venv"} & set(p.parts)
)
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
RESULT_PATH = re.compile(r"benchmarks/results(?:/[\w.-]*\w)*/?")


def test_the_documents_are_found() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in DOCS}
    assert {"README.md", "BENCHMARKS.md", "docs/format.md", "benchmarks/results/README.md"} <= names


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_resolve(doc: Path) -> None:
    links = [
        m for m in LINK.findall(doc.read_text()) if "://" not in m and not m.startswith("mailto:")
    ]
    missing = [m for m in links if not (doc.parent / m).exists()]
    assert not missing, f"{doc.relative_to(ROOT)} links to missing files: {missing}"


@pytest.mark.parametrize("doc", ["README.md", "BENCHMARKS.md"])
def test_cited_results_exist(doc: str) -> None:
    """Every benchmarks/results path the top-level documents name, linked or not, is there now."""
    cited = set(RESULT_PATH.findall((ROOT / doc).read_text()))
    assert cited, f"{doc} cites no results"
    missing = sorted(c for c in cited if not (ROOT / c).exists())
    assert not missing, f"{doc} cites missing results: {missing}"
