"""The public API's docstrings (issue 19): every public callable in ``zipccl.__all__`` says what
it takes and returns, and the examples of the codec's docstrings run (doctest, on CPU).

The collectives' examples need a process group and are not run here; Calibrator's and
reference_reduce's need none and are.
"""

from __future__ import annotations

import doctest
import inspect

import pytest
import torch
import torch.distributed as dist
import zipccl
from zipccl import calibration, codec, collectives

SECTIONS = ("Args:", "Returns:")
# classes whose public methods users call (the backend's other methods are torch's interface)
USER_CLASSES = ("Calibrator", "Compressed", "ZipAllGather", "ZipReduceScatter")


def _params(fn: object) -> list[str]:
    """``fn``'s parameters other than self/cls (none where the signature cannot be read)."""
    try:
        sig = inspect.signature(fn)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return []
    return [p for p in sig.parameters if p not in ("self", "cls")]


def _public_callables() -> list[str]:
    return [n for n in zipccl.__all__ if callable(getattr(zipccl, n))]


def _members(cls: type) -> list[tuple[str, object]]:
    """Public methods and properties the class defines itself (and ``__call__``)."""
    return [
        (n, v)
        for n, v in vars(cls).items()
        if (not n.startswith("_") or n == "__call__")
        and (inspect.isfunction(v) or isinstance(v, property | classmethod | staticmethod))
    ]


def test_every_public_callable_is_listed() -> None:
    assert "compress" in _public_callables()
    assert "all_gather_into_tensor" in _public_callables()


@pytest.mark.parametrize("name", _public_callables())
def test_documented(name: str) -> None:
    obj = getattr(zipccl, name)
    doc = inspect.getdoc(obj) or ""
    assert doc.strip(), f"zipccl.{name} has no docstring"
    if inspect.isclass(obj):
        if issubclass(obj, Exception):
            return  # defined in zipccl._errors; a summary and the attributes it adds
        own_init = "__init__" in vars(obj)
        if own_init and _params(obj.__init__):
            assert any(s in doc for s in (*SECTIONS, "Attributes:")), (
                f"zipccl.{name}'s docstring lacks an Args/Attributes section"
            )
        assert "Example::" in doc, f"zipccl.{name} has no example"
        return
    if _params(obj):
        assert any(s in doc for s in SECTIONS), f"zipccl.{name} lacks Args:/Returns:"
    assert "Example::" in doc, f"zipccl.{name} has no example"


@pytest.mark.parametrize("cls_name", USER_CLASSES)
def test_methods_documented(cls_name: str) -> None:
    cls = getattr(zipccl, cls_name)
    for name, member in _members(cls):
        fn = member.fget if isinstance(member, property) else getattr(member, "__func__", member)
        doc = inspect.getdoc(fn) or ""
        assert doc.strip(), f"zipccl.{cls_name}.{name} has no docstring"
        if not isinstance(member, property) and _params(fn):
            assert any(s in doc for s in SECTIONS), f"zipccl.{cls_name}.{name} lacks Args:/Returns:"


def test_backend_methods_documented() -> None:
    for name, member in _members(zipccl.ProcessGroupZipccl):
        assert (inspect.getdoc(member) or "").strip(), f"ProcessGroupZipccl.{name}: no docstring"


EXAMPLES = [
    *(getattr(codec, n) for n in codec.__all__),
    calibration.Calibrator,
    collectives.reference_reduce,
]


@pytest.mark.parametrize("obj", EXAMPLES, ids=lambda o: o.__qualname__)
def test_examples_run(obj: object, tmp_path, monkeypatch) -> None:
    """Each example, as ``python -m doctest`` would run it (CUDA lines are marked +SKIP)."""
    monkeypatch.chdir(tmp_path)  # an example that writes a file writes it here
    finder = doctest.DocTestFinder(recurse=True)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    rng = torch.random.get_rng_state()
    attempted = 0
    try:
        for test in finder.find(
            obj, obj.__qualname__, globs={"torch": torch, "zipccl": zipccl, "dist": dist}
        ):
            result = runner.run(test)
            assert not result.failed, f"{test.name}: {result.failed} example(s) failed"
            attempted += result.attempted
    finally:
        torch.random.set_rng_state(rng)
    assert attempted, f"{obj.__qualname__} has no example that runs"
