#!/usr/bin/env bash
# One call on the H200 (device tool), from the repo root with jax preinstalled:
#   bash scripts/h200.sh check   # GPU correctness: verify --impl mosaic, kernel scripts, decode parity, demo
#   bash scripts/h200.sh bench   # every bench suite
# Everything lands in $OUT (logs, JSON; bench results as one tarball: the
# device returns at most 8 files).
set -uo pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
python3 -c 'import jax, flax; print("jax", jax.__version__, "flax", flax.__version__, jax.devices())' | tee -a "$OUT/gpu.txt"

stage() {  # name, seconds, command...: a stage that overruns is stopped, the rest still run
  local name=$1 limit=$2; shift 2
  echo "=== $name (limit ${limit}s) ==="
  local start=$SECONDS
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "=== $name: rc=$rc in $((SECONDS - start))s ==="
  tail -n 40 "$OUT/$name.log"
}

case "${1:-check}" in
  check)
    stage verify_mosaic 200 python3 -m verify --impl mosaic --examples 6 --max-k 2048 --no-identities
    [ -f tests/gpu/run_dense_gpu.py ] && stage dense_gpu 150 python3 tests/gpu/run_dense_gpu.py
    [ -f tests/gpu_norms/run_norms_gpu.py ] && stage norms_gpu 120 python3 tests/gpu_norms/run_norms_gpu.py
    [ -f examples/decode_parity.py ] && stage decode_parity 90 python3 examples/decode_parity.py --steps 256
    ;;
  bench)
    mkdir -p /tmp/bench_out
    stage bench_norm_gemm 300 python3 -m bench --suite norm-gemm --out /tmp/bench_out
    stage bench_rest 240 python3 -m bench --suite norms,post-norm,decode-step,train-step --out /tmp/bench_out
    tar czf "$OUT/bench_results.tgz" -C /tmp/bench_out .
    ;;
esac
