"""The installed layout (issue 19): one top-level import name, ``zipccl``, whose ``golden``,
``hw`` and ``sim`` subpackages need no torch, and which a folder named zipccl (a clone) beside a
script does not shadow."""

from __future__ import annotations

import ast
import graphlib
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Collection
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("pyproject.toml", "README.md", "sw", "golden", "hw", "sim")


def _python(code: str, cwd: Path, path: Path | None = None) -> str:
    """stdout of ``code`` in a fresh interpreter (``path`` first on its PYTHONPATH)."""
    env = {"PATH": "/usr/bin:/bin", **({"PYTHONPATH": str(path)} if path else {})}
    run = subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    return run.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel setuptools builds from a copy of the sources (the checkout stays untouched)."""
    pytest.importorskip("setuptools")
    src, out = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("wheel")
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, symlinks=True, ignore=ignore)
        else:
            shutil.copy(ROOT / name, src / name)
    code = f"from setuptools import build_meta; print(build_meta.build_wheel({str(out)!r}))"
    run = subprocess.run(
        [sys.executable, "-c", code], cwd=src, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    return out / run.stdout.split()[-1]


def test_the_wheel_installs_one_top_level_name(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"zipccl"}
    for part in (
        "zipccl/golden/codebook.py",
        "zipccl/golden/tables/qlc_e4m3.json",
        "zipccl/hw/generate.py",
        "zipccl/sim/cocotb_suite.py",
        "zipccl/sim/data/minilm.npz",
        "zipccl/csrc/codec.cu",
    ):
        assert part in names


def test_a_folder_named_zipccl_beside_a_script_does_not_shadow_it(
    wheel: Path, tmp_path: Path
) -> None:
    """A clone named zipccl has no __init__.py at its top: at most a namespace portion, which
    the installed regular package outranks wherever it lies on sys.path."""
    site, app = tmp_path / "site", tmp_path / "app"
    zipfile.ZipFile(wheel).extractall(site)
    for part in ("golden", "hw", "sim", "sw/zipccl"):  # a clone's folders, as packages
        (app / "zipccl" / part).mkdir(parents=True)
        (app / "zipccl" / part / "__init__.py").touch()
    code = "import zipccl.golden.codebook as c, zipccl; print(zipccl.__file__, c.__file__)"
    for found in _python(code, app, site).split():
        assert Path(found).is_relative_to(site), found


def test_zipccl_golden_imports_without_torch(tmp_path: Path) -> None:
    code = (
        "import sys, zipccl.golden.container, zipccl.golden.theory, zipccl.golden.builders, zipccl;"
        "print(len(zipccl.__all__), sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))"
    )
    count, torch_modules = _python(code, tmp_path, ROOT / "sw").split(" ", 1)
    assert int(count) > 0 and torch_modules.strip() == "[]"


def test_public_names_load_on_first_use(tmp_path: Path) -> None:
    code = (
        "import sys, zipccl; assert 'torch' not in sys.modules;"
        "import zipccl.codec as codec; assert zipccl.compress is codec.compress;"
        "import torch.distributed as dist; assert 'zipccl' in dist.Backend.backend_list;"
        "eager = set(zipccl.__all__) - set(zipccl._FSDP2);"  # FSDP's names: when asked for
        "print(set(dir(zipccl)) & set(zipccl.__all__) == eager)"
    )
    assert _python(code, tmp_path, ROOT / "sw").strip() == "True"


def test_the_codec_without_torch_says_what_to_install(tmp_path: Path) -> None:
    """Where torch is missing (hidden here by an import hook), the first use of a public name
    names the install, instead of a bare ModuleNotFoundError from deep inside the package."""
    code = (
        "import sys, importlib.abc\n"
        "class NoTorch(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'torch':\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, NoTorch())\n"
        "import zipccl, zipccl.golden.container\n"
        "try:\n"
        "    zipccl.compress\n"
        "except ModuleNotFoundError as exc:\n"
        "    print(exc.name, '|', exc)\n"
    )
    name, message = _python(code, tmp_path, ROOT / "sw").split(" | ", 1)
    assert name == "torch"
    assert "zipccl.compress needs PyTorch" in message and "pip install torch==" in message


def test_all_is_what_the_public_modules_hold() -> None:
    """__init__'s __all__ is _public's imports and _fsdp2's names, written twice: they must
    agree."""
    import zipccl
    from zipccl import _fsdp2, _public

    public = [n for n in vars(_public) if not n.startswith("_")]
    assert sorted([*public, *_fsdp2.__all__]) == sorted(zipccl.__all__)
    assert all(getattr(zipccl, n) is getattr(_public, n) for n in public)
    assert all(getattr(zipccl, n) is getattr(_fsdp2, n) for n in _fsdp2.__all__)


def test_import_zipccl_leaves_fsdp_unloaded(tmp_path: Path) -> None:
    """FSDP loads with its names only (zipccl._fsdp2): imported after init_process_group it
    pins the default group for the life of the process."""
    code = (
        "import sys, torch, zipccl; zipccl.compress; zipccl.ddp_hook;"
        "before = 'torch.distributed.fsdp' in sys.modules; zipccl.ZipAllGather;"
        "print(before, 'torch.distributed.fsdp' in sys.modules)"
    )
    assert _python(code, tmp_path, ROOT / "sw").split() == ["False", "True"]


def _zipccl_imports(path: Path, package: str, modules: Collection[str]) -> set[str]:
    """The modules of ``modules`` that ``path`` imports anywhere in it (at the top or inside a
    function); ``from p import m`` counts as importing ``p.m`` where that is a module, else p."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
    return found & set(modules)


def test_zipccl_modules_import_one_way() -> None:
    """No import cycle among zipccl's own modules, counting imports inside functions: each
    module calls only downward (the registration, the launcher's wrapping and the backend once
    imported each other)."""
    sw = ROOT / "sw"
    modules = {}
    for path in (sw / "zipccl").rglob("*.py"):
        parts = path.relative_to(sw).with_suffix("").parts
        if parts[1] not in ("golden", "hw", "sim", "_boot"):  # their own packages, no zipccl
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        graph[name] = _zipccl_imports(path, package, modules) - {name}
    graphlib.TopologicalSorter(graph).prepare()  # CycleError names the cycle
