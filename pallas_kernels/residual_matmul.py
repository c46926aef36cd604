"""Residual GEMM on Hopper: h = x @ w (+ bias) + residual, and per-row statistics of h.

The GEMM core (`pallas_kernels.gemm_kernel`) with a residual epilogue: each
epilogue piece's residual arrives by TMA into a three-slot staging ring while the
K-loop (or the previous piece) runs, is added to the float32 accumulator, and the
sum is both stored in x.dtype and reduced into per-row partial (sum, M2) of its
warpgroup tile's columns (`pallas_kernels.gemm_epilogue`). The next pre-norm GEMM
takes the combined statistics (`jaxnorm.row_stats.from_partials`) as its row scale
and never reads h for them.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from pallas_kernels import gemm_kernel, hardware
from pallas_kernels.gemm_config import (Epilogue, TuningConfig, check_epilogue, check_shapes,
                                        default_config, smem_bytes)

Array = jax.Array


def residual_config(m: int, k: int, n: int, *, itemsize: int = 2) -> TuningConfig:
    """The GEMM's pick for the shape, refitted to the residual's three staging slots:
    a narrower epilogue piece first (it keeps the pipeline's depth), then fewer stages."""
    config = default_config(m, k, [n], itemsize=itemsize)
    for epi_n in (config.epi_tile_n, config.epi_tile_n // 2):
        for steps in range(config.max_concurrent_steps, 2, -1):
            fitted = dataclasses.replace(config, epi_tile_n=epi_n, max_concurrent_steps=steps)
            if smem_bytes(fitted, itemsize, residual=True) <= hardware.SMEM_BYTES_PER_CTA:
                return fitted
    return dataclasses.replace(config, max_concurrent_steps=2)


def residual_matmul(
    x: Array,
    w: Array,
    residual: Array,
    *,
    bias: Array | None = None,
    config: TuningConfig | None = None,
    interpret: bool = False,
) -> tuple[Array, tuple[Array, Array]]:
    """(h, (sum_parts, m2_parts)): h = x @ w + bias + residual in x.dtype, with float32 [P, M]
    partials per block of tile_n columns (`gemm_config.part_columns`) of the float32 h
    before its rounding: the sum and the M2 about the block's own mean.

    x [M, K] and w [K, N] bf16/f16, residual [M, N] of x's dtype, bias [N] (float32 add).
    """
    if config is None:
        config = residual_config(x.shape[0], x.shape[1], w.shape[1],
                                 itemsize=jnp.dtype(x.dtype).itemsize)
    epilogue = Epilogue(col_bias=bias is not None, row_stats_out=True, residual=True)
    check_shapes(x, [w], config)
    check_epilogue(x, [w], config, epilogue, residual)
    vectors = [] if bias is None else [bias.astype(jnp.float32)]
    h, sums, m2s = gemm_kernel.run(x, [w], vectors, config=config, epilogue=epilogue,
                                   interpret=interpret, residual=residual)
    m = x.shape[0]
    return h, (sums[:, :m], m2s[:, :m])
