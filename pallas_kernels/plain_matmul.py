"""Our plain Hopper GEMM: the lazy-norm kernel's configuration with an empty epilogue.

This is the baseline the benchmarks hold the fused kernels against ("<= 1.02x
our plain GEMM of the same config"), so it shares every line of the pipeline
with `lazy_norm_matmul` (pallas_kernels/gemm_kernel.py).
"""

from __future__ import annotations

import jax

from pallas_kernels import gemm_kernel
from pallas_kernels.gemm_config import Epilogue, TuningConfig, default_config


def plain_matmul(
    x: jax.Array, w: jax.Array, *, config: TuningConfig | None = None, interpret: bool = False
) -> jax.Array:
    """x @ w in x.dtype (bf16/f16, float32 accumulation); M >= 1, K and N multiples of 64."""
    if config is None:
        config = default_config(x.shape[0], x.shape[1], (w.shape[1],))
    (y,) = gemm_kernel.run(x, [w], [], config=config, epilogue=Epilogue(), interpret=interpret)
    return y
