#!/usr/bin/env bash
# Build the fairchem EquiformerV2 baseline environment (never a dependency of est).
#
#   bash benchmarks/baseline/setup_fairchem.sh [VENV_DIR]
#
# Creates VENV_DIR (default benchmarks/.venv-fairchem) with:
#   1. torch==2.13.0 first (the CPU build on disk; an unpinned torch, or a
#      package that pulls torch, resolves to a multi-GB CUDA build),
#   2. fairchem-core==1.10.0 --no-deps (the last release with EquiformerV2),
#   3. fairchem's pure-Python needs (no torch-scatter / torch-cluster / pyg-lib:
#      benchmarks/baseline/torch_scatter_stub.py stands in for torch_scatter),
#   4. est itself (editable, --no-deps) so one process imports both.
# Idempotent: rerunning upgrades nothing that is already satisfied.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
VENV="${1:-$ROOT/benchmarks/.venv-fairchem}"
PY="${PYTHON:-python3}"

if [ ! -x "$VENV/bin/python" ]; then
    echo "[setup_fairchem] creating venv $VENV"
    "$PY" -m venv "$VENV"
fi
VPY="$VENV/bin/python"
PIP=("$VPY" -m pip install --disable-pip-version-check -q)

echo "[setup_fairchem] 1/4 torch==2.13.0 (CPU build)"
"${PIP[@]}" "torch==2.13.0"

echo "[setup_fairchem] 2/4 fairchem-core==1.10.0 --no-deps"
"${PIP[@]}" --no-deps "fairchem-core==1.10.0"

echo "[setup_fairchem] 3/4 fairchem's pure-Python needs"
# torch is already there; keeping it in the same resolve pins it.
"${PIP[@]}" "torch==2.13.0" ase e3nn hydra-core lmdb numba "numpy<2" orjson pydantic pyyaml \
    requests submitit "torch-geometric" torchtnt tqdm huggingface-hub
# the real QM9 molecules for the accuracy study (est's [qm9] extra)
"${PIP[@]}" --no-deps qm9pack

echo "[setup_fairchem] 4/4 est (editable, --no-deps)"
"${PIP[@]}" --no-deps -e "$ROOT"

echo "[setup_fairchem] check"
"$VPY" - <<'PYEOF'
import sys, torch
sys.path.insert(0, "benchmarks/baseline")
import torch_scatter_stub  # noqa: F401  (installs itself as torch_scatter)
from fairchem.core.models.equiformer_v2.equiformer_v2 import EquiformerV2Backbone  # noqa: F401
import fairchem.core, est
print("torch", torch.__version__, "| fairchem-core", getattr(fairchem.core, "__version__", "?"), "| est", est.__file__)
PYEOF
echo "[setup_fairchem] done: $VENV"
