#!/usr/bin/env bash
# One prepared GPU run (single H200, < 8 minutes): the S2EF-2M shape's training throughput and peak
# memory for est (ffn, est default, est paper) and fairchem's EquiformerV2, fp32 and bf16 autocast,
# then the ESTBlock benchmark. Run from the repository root with the wheels folder .whl/ carried
# (fairchem-core 1.10.0 and the packages the device machine lacks; see the report of issue 9):
#
#   bash benchmarks/gpu_benchmark.sh                 # results in $OUT (default benchmarks/results/gpu)
#   SHORT=1 bash benchmarks/gpu_benchmark.sh         # < 4.5 minutes: fewer steps, ESTBlock --quick
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
set -u
OUT="${OUT:-$PWD/benchmarks/results/gpu}"
mkdir -p "$OUT"
export EST_FAIRCHEM_REEXEC=0   # fairchem comes from /tmp/site, never restart under a venv
if [ "${SHORT:-0}" = "1" ]; then
  S2EF_ARGS="--budget 120 --warmup 2 --steps 5"; S2EF_TIMEOUT=180; BLOCK_ARGS="--quick"; BLOCK_TIMEOUT=60
else
  S2EF_ARGS="--budget 220 --warmup 2 --steps 8"; S2EF_TIMEOUT=300; BLOCK_ARGS=""; BLOCK_TIMEOUT=130
fi
START=$(date +%s)
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import torch, numpy, e3nn, torch_geometric; print('torch', torch.__version__, 'cuda', torch.version.cuda, '| numpy', numpy.__version__, '| e3nn', e3nn.__version__, '| pyg', torch_geometric.__version__)"
} 2>&1 | tee "$OUT/environment.txt"

# 1. S2EF-2M shape, batch of 8 OC20-like slabs (66 atoms each): fairchem / est-ffn / est-default / est-paper,
#    each built once, fp32 then bf16; runs that would start after the budget are skipped, the step is cut by timeout.
timeout $S2EF_TIMEOUT python3 benchmarks/gpu_s2ef.py --out-dir "$OUT" $S2EF_ARGS 2>&1 | tee "$OUT/gpu_s2ef.log"
echo "[gpu_benchmark] s2ef done after $(( $(date +%s) - START )) s" | tee -a "$OUT/gpu_s2ef.log"

# 2. ESTBlock configurations at L=6 and L=4, 1000 atoms (benchmarks/bench_est_block.py; --quick: L=4, 200 atoms).
timeout $BLOCK_TIMEOUT python3 benchmarks/bench_est_block.py --device cuda $BLOCK_ARGS 2>&1 | tee "$OUT/est_block.log"
cp benchmarks/results/est_block*cuda.json "$OUT/" 2>/dev/null || echo "est_block json not written (timeout?)" | tee -a "$OUT/est_block.log"
echo "[gpu_benchmark] all done after $(( $(date +%s) - START )) s" | tee -a "$OUT/est_block.log"
