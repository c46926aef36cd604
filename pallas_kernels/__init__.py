"""Mosaic GPU (Pallas) kernels for Hopper and newer GPUs; nothing else here imports Pallas.

- `lazy_norm_matmul`: RMSNorm / LayerNorm fused into the GEMM that follows
  (row statistics applied in the epilogue), several weights per launch.
- `plain_matmul`: the same GEMM without a norm (the benchmarks' baseline).
- `residual_matmul`: x @ W + b + residual with per-row (sum, M2) partials of the
  sum in the epilogue (`gemm_epilogue`), the next pre-norm GEMM's statistics.
- `decode_matmul` / `decode_config`: the decode GEMM (M <= 64): split-K work
  units that keep every SM streaming weights, the RMSNorm row scale in the epilogue.
- `decode_gated`: the gated MLP input at decode (gate and up of one N tile per unit,
  act(gate) * up in the epilogue); `decode_kernel` is the mainloop both share, with the
  row statistic taken from the x tiles in the kernel where the gain is folded.
- `row_norm`: standalone RMSNorm / LayerNorm, one HBM read and write per
  element; wide rows split across a thread-block cluster.
- `post_norm_matmul`: Norm(x @ W + b [+ residual]) with a cluster covering whole
  output rows; only per-row statistics move between CTAs.
- `row_stats`: the per-row partial statistics, their combine and their exchange
  among the CTAs that share a row (DSMEM, global scratch, or grid semaphores).
- `gemm_config` / `gemm_kernel`, `row_norm_config`, `post_norm_config` /
  `post_norm_epilogue`: each kernel's knobs and selection apart from its kernel.
- `hardware`: SM count, shared memory, cluster limits, the interpreter's caps.
- `errors.Unsupported`: what every kernel raises for what it does not serve.
- `padding`: rows padded to whole tiles and cropped, for kernels and backends.
- `interpreter_flags`: the XLA:CPU flag the interpreter needs (set before jax
  computes anything).

Modules are imported on use (`from pallas_kernels import lazy_norm_matmul`),
so importing this package does not import Pallas.
"""
