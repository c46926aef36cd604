"""Mosaic GPU (Pallas) kernels for Hopper and newer GPUs; nothing else here imports Pallas.

- `lazy_norm_matmul`: RMSNorm / LayerNorm fused into the GEMM that follows
  (row statistics applied in the epilogue), several weights per launch.
- `plain_matmul`: the same GEMM without a norm (the benchmarks' baseline).
- `row_norm`: standalone RMSNorm / LayerNorm, one HBM read and write per
  element; wide rows split across a thread-block cluster.
- `post_norm_matmul`: Norm(x @ W + b [+ residual]) with a cluster covering whole
  output rows; only per-row statistics move between CTAs.
- `cluster_exchange`: the one helper that all-gathers per-row partial
  statistics in a cluster (DSMEM on the GPU, global scratch + cluster barrier
  under the interpreter).
- `interpreter_flags`: the XLA:CPU flag the interpreter needs (set before jax
  computes anything).

Modules are imported on use (`from pallas_kernels import lazy_norm_matmul`),
so importing this package does not import Pallas.
"""
