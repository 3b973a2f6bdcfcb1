#!/usr/bin/env bash
# Build the MACE baseline environment (never a dependency of est).
#
#   bash benchmarks/baseline/setup_mace.sh [VENV_DIR]
#
# Creates VENV_DIR (default benchmarks/.venv-mace) with:
#   1. torch==2.13.0 first (the CPU build on disk; an unpinned torch, or a
#      package that pulls torch, resolves to a multi-GB CUDA build),
#   2. mace-torch (MACE_VERSION, default 0.3.16) with its own dependencies in
#      the same resolve as the pinned torch, so pip keeps 2.13.0. mace-torch
#      pins e3nn==0.4.4; est needs a newer e3nn, which is why MACE lives here
#      and never in est's environment,
#   3. ase and numpy (the extxyz files and MACECalculator's MD), and
#      cuequivariance (pure Python here): MACE's generalised Clebsch-Gordan
#      tables for L = 4 at correlation 3 (the expressivity study's
#      counterexamples), which e3nn 0.4.4 does not reach. MACE's training
#      default (use_reduced_cg=False) still takes e3nn's tables wherever e3nn
#      has them, so the force study's MACE is unchanged by it.
# est is NOT installed here: benchmarks/baseline/mace_baseline.py exports the
# LMDB to extxyz in est's environment and runs MACE in this one.
# Idempotent: rerunning upgrades nothing that is already satisfied.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
VENV="${1:-$ROOT/benchmarks/.venv-mace}"
PY="${PYTHON:-python3}"
MACE_VERSION="${MACE_VERSION:-0.3.16}"

if [ ! -x "$VENV/bin/python" ]; then
    echo "[setup_mace] creating venv $VENV"
    "$PY" -m venv "$VENV"
fi
VPY="$VENV/bin/python"
PIP=("$VPY" -m pip install --disable-pip-version-check -q)

echo "[setup_mace] 1/3 torch==2.13.0 (CPU build)"
"${PIP[@]}" "torch==2.13.0"

echo "[setup_mace] 2/3 mace-torch==$MACE_VERSION (+ its dependencies, torch kept at 2.13.0)"
"${PIP[@]}" "torch==2.13.0" "mace-torch==$MACE_VERSION"

echo "[setup_mace] 3/3 ase, numpy, cuequivariance"
"${PIP[@]}" "torch==2.13.0" ase numpy cuequivariance

echo "[setup_mace] check"
"$VPY" - <<'PYEOF'
from importlib.metadata import version
import mace  # noqa: F401  (first: it lets e3nn 0.4.4 load its tables on this torch)
import torch, e3nn, ase, numpy, cuequivariance
from mace.calculators import MACECalculator  # noqa: F401
from mace.cli.run_train import main  # noqa: F401
print("torch", torch.__version__, "| mace-torch", version("mace-torch"), "| e3nn", e3nn.__version__,
      "| ase", ase.__version__, "| numpy", numpy.__version__, "| cuequivariance", cuequivariance.__version__)
PYEOF
echo "[setup_mace] done: $VENV"
