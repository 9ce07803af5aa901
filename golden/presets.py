"""Ready-made tables: the ZipCCL exponent table from theory, and default QLC FP8 tables.

The QLC tables are checked-in JSON table files (``golden/tables/*.json``, hash-verified on load)
so that golden/, the RTL and the GPU codec use byte-identical defaults without any of them
needing the model. ``python -m zipccl.golden.presets --rebuild`` regenerates them from
all-MiniLM-L6-v2 activations (every linear layer's input, per-tensor absmax scaled to FP8, one
pooled histogram): the exhaustive search restricted to the QLC paper's payload widths 3/4/5
plus the 8-bit escape, i.e. code lengths 6/7/8/11. ``--check`` rebuilds in memory and reports
any difference.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from zipccl.golden.builders import QLC_MIDDLE_WIDTHS, best_table
from zipccl.golden.codebook import Codebook
from zipccl.golden.formats import BF16, FloatFormat
from zipccl.golden.theory import TensorStats, zipccl_table

TABLES_DIR = Path(__file__).resolve().parent / "tables"
QLC_FILES = {"e4m3": "qlc_e4m3.json", "e5m2": "qlc_e5m2.json"}


def zipccl_exponent(
    fmt: FloatFormat = BF16, rms: float = 1.0, zero_fraction: float = 0.0
) -> Codebook:
    """The ZipCCL exponent table from theory for a tensor of the given RMS and zero fraction."""
    if not rms > 0:
        raise ValueError(f"rms must be positive, got {rms}")
    if not 0.0 <= zero_fraction <= 1.0:
        raise ValueError(f"zero_fraction must be in [0, 1], got {zero_fraction}")
    return zipccl_table(fmt, TensorStats(float(rms), float(zero_fraction)))


def _qlc(fmt: str) -> Codebook:
    return Codebook.load(TABLES_DIR / QLC_FILES[fmt])


def qlc_e4m3() -> Codebook:
    """The default QLC table for FP8 e4m3 bytes (checked-in, built from MiniLM activations)."""
    return _qlc("e4m3")


def qlc_e5m2() -> Codebook:
    """The default QLC table for FP8 e5m2 bytes (checked-in, built from MiniLM activations)."""
    return _qlc("e5m2")


PRESETS = {"zipccl_exponent": zipccl_exponent, "qlc_e4m3": qlc_e4m3, "qlc_e5m2": qlc_e5m2}


def build_qlc(fmt: str) -> Codebook:
    """Build the default QLC table for ``fmt`` ("e4m3" or "e5m2") from the MiniLM activations."""
    from zipccl.golden import data
    from zipccl.golden.baselines import histogram

    if fmt not in QLC_FILES:
        raise ValueError(f"no QLC preset for {fmt!r}; expected one of {sorted(QLC_FILES)}")
    hist = histogram(data.concat(data.fp8_activations(fmt)))
    return best_table(hist, widths=QLC_MIDDLE_WIDTHS, literal=True, name=f"qlc-{fmt}-minilm")


def rebuild(directory: Path = TABLES_DIR) -> list[Path]:
    """Regenerate the QLC table files; returns the paths written."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for fmt, file in QLC_FILES.items():
        book = build_qlc(fmt)
        book.save(directory / file)
        print(f"wrote {directory / file}: {book.describe()}", file=sys.stderr)
        paths.append(directory / file)
    return paths


def check() -> bool:
    """Rebuild in memory and compare with the checked-in files (True when identical)."""
    same = True
    for fmt in QLC_FILES:
        built, stored = build_qlc(fmt), _qlc(fmt)
        ok = built == stored
        same &= ok
        print(
            f"{fmt}: {'same' if ok else 'DIFFERS'}: stored {stored.describe()}, "
            f"built {built.describe()}"
        )
    return same


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m zipccl.golden.presets", description=__doc__)
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--rebuild", action="store_true", help="regenerate golden/tables/*.json")
    group.add_argument("--check", action="store_true", help="compare a rebuild with the files")
    args = parser.parse_args(argv)
    if args.rebuild:
        rebuild()
        return 0
    if args.check:
        return 0 if check() else 1
    for name, make in PRESETS.items():
        print(f"{name}: {make().describe()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
