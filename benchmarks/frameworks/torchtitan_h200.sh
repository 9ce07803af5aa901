#!/usr/bin/env bash
# torchtitan's debug model under zipccl-run and plain torchrun, offline, losses compared bit for
# bit: PYTHONPATH=sw:. bash benchmarks/frameworks/torchtitan_h200.sh OUT [--cpu] [--steps N]
# (benchmarks/frameworks/torchtitan_h200.py says what it runs; OUT/torchtitan.json the result)
set -euo pipefail
out=${1:?usage: bash benchmarks/frameworks/torchtitan_h200.sh OUT [options]}
exec "${PYTHON:-python}" benchmarks/frameworks/torchtitan_h200.py --out "$out" "${@:2}"
