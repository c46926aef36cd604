#!/usr/bin/env bash
# The H200 session, in named stages (device tool, repo root, jax preinstalled):
#   bash scripts/h200.sh check gemm-a gemm-b          # first call
#   bash scripts/h200.sh gemm-c gemm-d others         # second call
#   bash scripts/h200.sh post-norm                    # the post-norm kernel alone
#   bash scripts/h200.sh kernels doctor hf-parity     # kernel checks, the doctor, checkpoints
#   ONLY=gated,residual KERNELS_LIMIT=120 bash scripts/h200.sh kernels decode-box post-after parity
#   GROUPS_LIMIT=100 bash scripts/h200.sh decode-groups      # the decode MLP-input group vs XLA
#   GROUPS_ARGS="--shapes 1152x6912" GATED_PRIOR=bench/results/2026-12-01-decode/decode-groups.json \
#     RUN_COMMIT=abc1234 bash scripts/h200.sh decode-groups gated-table   # one shape, merged
#   DECODE_ARGS="--launches gemma --rows 1,8" DECODE_PRIOR="a.json b.json" bash scripts/h200.sh \
#     decode-launches decode-table     # decode GEMM launches measured, merged into its table
#   DECODE_ARGS="--launches unmeasured --rows 1,8,64" ...  # what bench.decode_plan lists as
#     declined for want of a measurement
#   ONLY="decode attention input" bash scripts/h200.sh kernels decode-attention  # its checks, bench
#   ATTN_ARGS="--rows 1,8" RUN_COMMIT=abc1234 bash scripts/h200.sh decode-attention attention-table
#   ATTN_PRIOR=bench/results/2026-12-01-decode/decode-attention.json ...  # keep earlier runs' rows
#   MODEL=llama3-8b PHASE=prefill,train MODEL_LIMIT=300 bash scripts/h200.sh model
#   DETAIL=1 MODEL=qwen3-0.6b PHASE=train bash scripts/h200.sh model  # + kernels by name, HLO
#   ROUNDS=4 MODEL=qwen3-4b PHASE=train bash scripts/h200.sh model    # more interleaved rounds
#   BOUNDED=1 MODEL=gemma3-1b PHASE=train bash scripts/h200.sh model  # + the scaled norm-free limit
#   MODEL_VARIANTS=stock,jaxnorm,norm-free MODEL=qwen3-0.6b PHASE=decode DECODE_BATCH=64 \
#     bash scripts/h200.sh model   # fewer variants resident: caches that fit an 80 GB card
#   DETAIL=1 MODEL=qwen3-0.6b bash scripts/h200.sh variant-probe  # more variants, + HLO
#   DECODE_ARGS="--launches losing --configs 8" ...  # every candidate at the table's losses
#   ONLY="cluster sum,residual epilogue" bash scripts/h200.sh kernels decode-residual
#     # the in-cluster split-K sum and the decode residual epilogue: GPU checks, then timed
#   DECODE_ARGS="--launches presets --rows 1,8 --configs 3" LAUNCHES_LIMIT=300 \
#     bash scripts/h200.sh decode-launches  # timed cold (copies >= 3x L2, bench/timing.py):
#     the table's launches under 15 MB were timed inside L2 before 2026-12-05
#   SHAPES=4096x1024x6144,8192x1024x4096 bash scripts/h200.sh gemm-pingpong  # pingpong vs table
#   LAUNCH_ARGS="--launches 1,8,32" bash scripts/h200.sh launch-cost  # wall us per launch, by kind
#   MODEL=gemma3-1b PHASE="train prefill" bash scripts/h200.sh timeline  # idle GPU time, by kernel
#   MODEL=gemma3-1b bash scripts/h200.sh gain-reduction train-processes  # the training cell over
#     three processes, and the emitter XLA gave its norm-gain gradients
#   bash scripts/h200.sh head-data   # the tied head's GEMMs on stock's and norm-free data
#   FUSED_ARGS="--kind lazy --n 1024,256,256" bash scripts/h200.sh fused-configs  # q/k/v configs
#   SHAPES=$(python -m bench.gemm_sweep --unmeasured) SWEEP_PRIOR="..." bash scripts/h200.sh gemm-screen
#     # the preset shapes the GEMM table has no entry for, screened and merged into it
#   RUN_COMMIT=abc1234 bash scripts/h200.sh norm-backward-configs norm-backward  # its configs
#     swept at every preset training shape, then its dispatch table timed with them
#   RUN_COMMIT=abc1234 bash scripts/h200.sh norm-backward         # the backward kernel, its table
#   BACKWARD_ARGS="--cotangents 2,3" BACKWARD_PRIOR=prior.json BACKWARD_LIMIT=300 RUN_COMMIT=abc1234 \
#     bash scripts/h200.sh norm-backward   # each consumer's cotangent summed in the kernel, merged
#   bash scripts/h200.sh backward-probes   # 1B-class training steps with it, interleaved
#   RUN_COMMIT=abc1234 MODEL=gemma3-1b,llama3.2-1b,qwen3-0.6b PHASE=train bash scripts/h200.sh \
#     cotangents model   # the per-consumer cotangent form timed, tabled, then the training steps
#   ONLY=lazy,gated_mlp_in,residual_dense bash scripts/h200.sh gemm-table kernels gated residual-gemm
#     # the GEMM table re-measured with a wgmma step in flight, then its kernels checked and timed
# Each stage has its own time limit; one that overruns is stopped and the rest
# still run. Logs and bench results go into one tarball in $OUT (the device
# returns at most 8 files), with a summary of every stage's tail.
set -uo pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
WORK=/tmp/h200
mkdir -p "$OUT" "$WORK/bench"
bench() {  # stage name, seconds, bench arguments...: each stage writes its own folder
  local name=$1 limit=$2; shift 2
  stage "$name" "$limit" python3 -m bench --out "$WORK/bench/$name" --repeats 10 "$@"
}

stage() {  # name, seconds, command...
  local name=$1 limit=$2; shift 2
  local start=$SECONDS
  timeout "$limit" "$@" > "$WORK/$name.log" 2>&1
  local rc=$?
  { echo "=== $name: rc=$rc in $((SECONDS - start))s (limit ${limit}s) ==="; tail -n 30 "$WORK/$name.log"; } \
    | tee -a "$WORK/summary.txt"
}

{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  python3 -c 'import jax, flax; print("jax", jax.__version__, "flax", flax.__version__, jax.devices())'
  date -u; } | tee -a "$WORK/summary.txt"

for name in "$@"; do
  case "$name" in
    check)
      stage verify_mosaic 170 python3 -m verify --impl mosaic --examples 3 --max-k 2048 --no-identities
      stage decode_parity 80 python3 examples/decode_parity.py --impl mosaic --steps 256
      stage demo 70 python3 examples/demo.py --steps 60 --out "$WORK/demo" ;;
    gemm-a) bench gemm_4096x6144 120 --suite norm-gemm --norm rms --kn 4096x6144 ;;
    gemm-b) bench gemm_4096x28672 130 --suite norm-gemm --norm rms --kn 4096x28672 ;;
    gemm-c) bench gemm_8192x10240 130 --suite norm-gemm --norm rms --kn 8192x10240 ;;
    gemm-d) bench gemm_8192x57344 150 --suite norm-gemm --norm rms --kn 8192x57344 ;;
    post-norm)  # issue 6: kernel checks (clusters, groups), timings, verify, the bench suite
      stage check_kernels 240 env OUT="$WORK" python3 bench/gpu/check_kernels.py
      stage verify_post 120 python3 -m verify --impl mosaic --examples 3 --max-k 2048 \
        --no-identities --ops dense_rms_norm dense_layer_norm
      bench post_norm 110 --suite post-norm --quick ;;
    kernels) stage check_kernels "${KERNELS_LIMIT:-200}" env OUT="$WORK" python3 bench/gpu/check_kernels.py ;;
    decode-sweep) stage decode_sweep 230 python3 -m bench.decode_gemm --rows 1,64 --budget-s 210 \
                    --out "$WORK/decode_sweep" ;;
    decode-launches)  # DECODE_ARGS="--launches gemma --rows 1,8": one launch set
      stage decode_launches "${LAUNCHES_LIMIT:-120}" python3 -m bench.decode_gemm ${DECODE_ARGS:-} \
        --budget-s $(( ${LAUNCHES_LIMIT:-120} - 20 )) --out "$WORK/decode_launches" ;;
    decode-table)  # after decode-launches: its configs (over DECODE_PRIOR's runs) become the table
      stage decode_table 30 python3 -m bench.decode_gemm --write-table ${DECODE_PRIOR:-} \
        "$WORK/decode_launches/decode-gemm.json" --run-commit "${RUN_COMMIT:-unknown}" \
        --run-command "python -m bench.decode_gemm ${DECODE_ARGS:-}"
      cp pallas_kernels/decode_configs.py "$WORK/" ;;
    decode-presets) stage decode_presets "${PRESETS_LIMIT:-170}" python3 -m bench.decode_gemm \
                      --launches presets --rows "${ROWS:-1,8}" --configs 2 --budget-s 120 \
                      --out "$WORK/decode_presets" ;;
    decode-residual)  # the residual stream at decode: stock, two launches, one (cluster sum)
      stage decode_residual "${RESIDUAL_LIMIT:-200}" python3 -m bench.decode_residual \
        --rows "${ROWS:-1,8,64}" --budget-s $(( ${RESIDUAL_LIMIT:-200} - 20 )) \
        --out "$WORK/decode_residual" ;;
    decode-groups) stage decode_groups "${GROUPS_LIMIT:-120}" python3 -m bench.decode_groups \
                     --budget-s $(( ${GROUPS_LIMIT:-120} - 20 )) --out "$WORK/decode_groups" \
                     ${GROUPS_ARGS:-} ;;
    gated-table)  # after decode-groups: its ratios (over GATED_PRIOR's runs) become dispatch's table
      stage gated_table 30 python3 -m bench.decode_groups --write-table ${GATED_PRIOR:-} \
        "$WORK/decode_groups/decode-groups.json" --run-commit "${RUN_COMMIT:-unknown}" \
        --run-command "python -m bench.decode_groups --budget-s $(( ${GROUPS_LIMIT:-120} - 20 )) ${GROUPS_ARGS:-}"
      cp jaxnorm/backends/decode_gated_measured.py "$WORK/" ;;
    decode-attention) stage decode_attention "${ATTN_LIMIT:-220}" python3 -m bench.decode_attention_bench \
                        --budget-s $(( ${ATTN_LIMIT:-220} - 20 )) --out "$WORK/decode_attention" \
                        ${ATTN_ARGS:-} ;;
    attention-table)  # after decode-attention: its ratios (over ATTN_PRIOR's runs) become dispatch's table
      stage attention_table 30 python3 -m bench.decode_attention_bench --write-table ${ATTN_PRIOR:-} \
        "$WORK/decode_attention/decode-attention.json" --run-commit "${RUN_COMMIT:-unknown}" \
        --run-command "python -m bench.decode_attention_bench --budget-s $(( ${ATTN_LIMIT:-220} - 20 )) ${ATTN_ARGS:-}"
      cp jaxnorm/backends/decode_attention_measured.py "$WORK/" ;;
    norm-backward-configs)  # every candidate config of the backward kernel, the fastest kept
      stage norm_backward_configs "${CONFIGS_LIMIT:-280}" python3 -m bench.norm_backward --configs \
        ${SHAPES:+--shapes "$SHAPES"} --budget-s $(( ${CONFIGS_LIMIT:-280} - 30 )) \
        --out "$WORK/norm_backward_configs"
      stage configs_table 30 python3 -m bench.norm_backward --write-configs ${CONFIGS_PRIOR:-} \
        "$WORK/norm_backward_configs/norm-backward-configs.json" --run-commit "${RUN_COMMIT:-unknown}"
      cp pallas_kernels/rms_norm_backward_configs.py "$WORK/" ;;
    norm-backward)  # RMSNorm's backward kernel vs JAX's autodiff of the norm, then its table
                    # (over BACKWARD_PRIOR's runs; BACKWARD_ARGS="--cotangents 2,3": those only)
      stage norm_backward "${BACKWARD_LIMIT:-150}" python3 -m bench.norm_backward \
        --budget-s $(( ${BACKWARD_LIMIT:-150} - 30 )) --out "$WORK/norm_backward" ${BACKWARD_ARGS:-}
      stage backward_table 30 python3 -m bench.norm_backward --write-table ${BACKWARD_PRIOR:-} \
        "$WORK/norm_backward/norm-backward.json" --run-commit "${RUN_COMMIT:-unknown}" \
        --run-command "python -m bench.norm_backward ${BACKWARD_ARGS:-}"
      cp jaxnorm/backends/norm_backward_measured.py "$WORK/" ;;
    cotangents)  # each consumer's cotangent summed in RMSNorm's backward kernel, at the presets'
                 # d_model rows, merged into the table over the last H100 run (probes.json)
                 # on an H100; on another GPU the whole table is measured afresh
      python3 - > "$WORK/cotangents_prior.log" 2>&1 <<'PY'
import json, subprocess
gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                     capture_output=True, text=True).stdout.strip()
prior = json.load(open("bench/results/2026-12-05-h100/probes.json"))[
    "norm-backward table, measured configs (8b86dda)"]
if prior["environment"]["devices"][0] == gpu:
    json.dump(prior, open("/tmp/norm-backward-prior.json", "w"))
    print("prior: the 8b86dda run on", gpu)
PY
      if [ -f /tmp/norm-backward-prior.json ]; then
        stage norm_backward "${BACKWARD_LIMIT:-240}" python3 -m bench.norm_backward \
          --budget-s $(( ${BACKWARD_LIMIT:-240} - 30 )) --out "$WORK/norm_backward" \
          --cotangents 2,3 --shapes 4096x2048,4096x1024,2048x1152,4096x4096,4096x2560
        args=(/tmp/norm-backward-prior.json) commits="8b86dda; ${RUN_COMMIT:-unknown}"
        command="python -m bench.norm_backward; python -m bench.norm_backward --cotangents 2,3"
      else
        stage norm_backward "${BACKWARD_LIMIT:-330}" python3 -m bench.norm_backward \
          --budget-s $(( ${BACKWARD_LIMIT:-330} - 30 )) --out "$WORK/norm_backward"
        args=() commits="${RUN_COMMIT:-unknown}" command="python -m bench.norm_backward"
      fi
      stage backward_table 30 python3 -m bench.norm_backward --write-table "${args[@]}" \
        "$WORK/norm_backward/norm-backward.json" --run-commit "$commits" \
        --run-command "$command"
      cp jaxnorm/backends/norm_backward_measured.py "$WORK/" ;;
    gemm-table)  # issue 17: each preset shape's table config against one wgmma step in flight
      stage gemm_sweep "${SWEEP_LIMIT:-260}" python3 -m bench.gemm_sweep --around-table \
        --budget-s $(( ${SWEEP_LIMIT:-260} - 25 )) --out "$WORK/gemm_sweep"
      stage gemm_table 30 python3 -m bench.gemm_sweep --write-table "$WORK/gemm_sweep/gemm_sweep.json"
      cp pallas_kernels/gemm_configs.py "$WORK/" ;;
    gemm-screen)  # SHAPES=MxKxN,...: every screen config at the shapes the table loses at,
                  # merged over SWEEP_PRIOR's sweeps into the table
      stage gemm_screen "${SWEEP_LIMIT:-300}" python3 -m bench.gemm_sweep --screen-all \
        --shapes "$SHAPES" --budget-s $(( ${SWEEP_LIMIT:-300} - 25 )) --out "$WORK/gemm_screen"
      stage gemm_table 30 python3 -m bench.gemm_sweep --write-table ${SWEEP_PRIOR:-} \
        "$WORK/gemm_screen/gemm_sweep.json"
      cp pallas_kernels/gemm_configs.py "$WORK/" ;;
    gemm-pingpong)  # [SHAPES=MxKxN,...]: each shape's table pick against pingpong warpgroups
      stage gemm_pingpong "${SWEEP_LIMIT:-260}" python3 -m bench.gemm_sweep --pingpong \
        ${SHAPES:+--shapes "$SHAPES"} --budget-s $(( ${SWEEP_LIMIT:-260} - 25 )) \
        --out "$WORK/gemm_pingpong" ;;
    fused-configs)  # FUSED_ARGS="--kind lazy --n 1024,256,256": a fused kernel's configs at a model's shapes
      stage fused_configs "${FUSED_LIMIT:-200}" python3 bench/gpu/fused_config_probe.py ${FUSED_ARGS:-} \
        --budget-s $(( ${FUSED_LIMIT:-200} - 30 )) --out "$WORK/fused-configs.json" ;;
    gated) stage gated_bench "${GATED_LIMIT:-130}" python3 -m bench.gated_bench ${GATED_ARGS:-} \
             --out "$WORK/gated" ;;  # GATED_ARGS="--activation gelu_tanh --shapes 8192x1152x6912"
    residual-gemm) bench residual_gemm "${RESIDUAL_LIMIT:-100}" --suite residual-gemm ;;
    decode-box) stage decode_box 130 python3 bench/gpu/decode_box_probe.py --out "$WORK/decode_box" ;;
    post-after) bench post_after 120 --suite post-norm --quick --m 4096 ;;
    parity)  # issue 18: 256 greedy tokens through the kernels, Llama- and Qwen3-shaped
      for family in ${FAMILIES:-llama qwen3}; do
        stage "parity_$family" "${PARITY_LIMIT:-110}" python3 examples/decode_parity.py --impl mosaic --steps 256 \
          --family "$family"
      done ;;
    head-data)  # the tied head's GEMMs on stock's and the norm-free limit's data (Gemma-3-1B)
      stage head_data "${HEAD_LIMIT:-150}" python3 bench/gpu/head_data_probe.py \
        --model "${MODEL:-gemma3-1b}" --out "$WORK/head_data" ;;
    launch-cost)  # what one more launch (XLA fusion, cuBLAS, Mosaic) costs a program's wall time
      stage launch_cost "${LAUNCH_LIMIT:-150}" python3 bench/gpu/launch_cost_probe.py \
        ${LAUNCH_ARGS:-} --out "$WORK/launch-cost.json" ;;
    timeline)  # MODEL=gemma3-1b PHASE=train VARIANTS=stock,jaxnorm: GPU idle time between kernels
      for phase in ${PHASE:-train}; do
        stage "timeline_${MODEL:-gemma3-1b}_$phase" "${TIMELINE_LIMIT:-150}" python3 \
          bench/gpu/timeline_probe.py --model "${MODEL:-gemma3-1b}" --phase "$phase" \
          --variants "${VARIANTS:-stock,jaxnorm}" --out "$WORK/timeline"
      done ;;
    gain-reduction)  # MODEL=gemma3-1b: the norm-gain gradients' emitter, then the step timed
      stage "gain_reduction_${MODEL:-gemma3-1b}" "${GAIN_LIMIT:-200}" python3 \
        bench/gpu/gain_reduction_probe.py --model "${MODEL:-gemma3-1b}" ${ROUNDS:+--rounds "$ROUNDS"} \
        --out "$WORK/gain-reduction" ;;
    train-processes)  # MODEL=gemma3-1b PROCESSES=3: one training cell, a probe per process
      # (XLA autotunes each compile: docs/backward.md, "What moves a training step ...")
      for i in $(seq "${PROCESSES:-3}"); do
        stage "train_${MODEL:-gemma3-1b}_process_$i" "${PROBE_LIMIT:-150}" python3 \
          bench/gpu/variant_probe.py --model "${MODEL:-gemma3-1b}" --phase train --rounds 2 \
          --variants "${VARIANTS:-stock,jaxnorm,norm-free}" --out "$WORK/train-process-$i"
      done ;;
    doctor) stage doctor 60 python3 -m jaxnorm.doctor ;;
    hf-parity) stage hf_parity 90 env OUT="$WORK" python3 bench/gpu/hf_parity.py ;;
    model)  # 30 wall samples a round: cheap next to compiling, and 10 left a variant's
            # median unsteady (docs/mosaic-notes.md, "What a launch costs the host")
      bench "model${MODEL_TAG:-}" "${MODEL_LIMIT:-500}" --repeats "${MODEL_REPEATS:-30}" \
             --suite model --model "${MODEL:-llama3.2-1b}" \
             --phase "${PHASE:-prefill,train,decode}" ${DECODE_BATCH:+--decode-batch "$DECODE_BATCH"} ${DECODE_STEPS:+--decode-steps "$DECODE_STEPS"} \
             ${ROUNDS:+--rounds "$ROUNDS"} ${BOUNDED:+--bounded-limit} \
             ${MODEL_VARIANTS:+--variants "$MODEL_VARIANTS"} \
             ${DETAIL:+--detail "$WORK/detail${MODEL_TAG:-}"} ;;
    variant-probe)  # VARIANTS="stock,jaxnorm,kernels declined" PHASE=train|prefill
      stage "probe_${MODEL:-qwen3-0.6b}_${PHASE:-train}" "${PROBE_LIMIT:-330}" python3 \
        bench/gpu/variant_probe.py --model "${MODEL:-qwen3-0.6b}" --phase "${PHASE:-train}" ${ROUNDS:+--rounds "$ROUNDS"} \
        ${VARIANTS:+--variants "$VARIANTS"} ${DETAIL:+--detail} --out "$WORK/probe" ;;
    backward-probes)  # training steps with RMSNorm's backward kernel, the 1B-class presets
      for model in ${MODELS:-qwen3-0.6b llama3.2-1b gemma3-1b}; do
        stage "backward_probe_$model" "${PROBE_LIMIT:-200}" python3 bench/gpu/variant_probe.py \
          --model "$model" --phase train --rounds "${ROUNDS:-2}" \
          --variants "${VARIANTS:-stock,jaxnorm,norm backward kernel,norm-free}" --out "$WORK/probe"
      done ;;
    others) bench norms_post 110 --suite norms,post-norm --quick
            bench decode_train 100 --suite decode-step,train-step --quick ;;
    *) echo "unknown stage $name" ;;
  esac
done
tar czf "$OUT/h200_$(date -u +%H%M%S).tgz" -C "$WORK" .
cp "$WORK/summary.txt" "$OUT/summary.txt"
