"""Mosaic GPU (Pallas) kernels for Hopper and newer GPUs; nothing else here imports Pallas.

- `lazy_norm_matmul`: RMSNorm / LayerNorm fused into the GEMM that follows
  (row statistics applied in the epilogue), several weights per launch.
- `plain_matmul`: the same GEMM without a norm (the benchmarks' baseline).

Modules are imported on use (`from pallas_kernels import lazy_norm_matmul`),
so importing this package does not import Pallas.
"""
