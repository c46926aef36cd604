"""Mosaic GPU backend of `residual_dense`: the residual GEMM of pallas_kernels.

Serves bfloat16/float16 x with a kernel and residual of x's dtype, K a multiple
of 64 and N a multiple of the GEMM's CTA tile (256 at prefill shapes), any M >= 1;
anything else raises `Unsupported` with the reason and dispatch falls back to
xla. The kernel's [P, M] partials are combined here, in XLA (M-sized work), by
Chan's formula (`jaxnorm.row_stats.from_partials`).

At decode (M <= 64) the product is the weight-streaming decode GEMM's
(pallas_kernels/decode_matmul.py). Where its config sums the K splits in a cluster and
N is whole tiles, the kernel also adds the residual and writes h's per-tile statistics
(`decode_residual_matmul`): one launch. Otherwise (split_k = 1 too, until
`python -m bench.decode_residual` has timed that form on the GPU) XLA adds the residual and
takes the statistics in the fusion that follows it (M*N elements: small at decode), as the
xla path does after its dot.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxnorm import row_stats
from jaxnorm.backends.mosaic_device import on_gpu_only
from jaxnorm.dispatch import decline_automatic, register
from jaxnorm.backends import xla
from jaxnorm.backends.mosaic_dense import decode_not_faster
from pallas_kernels import decode_matmul, gemm_config, hardware
from pallas_kernels import residual_matmul as rm
from pallas_kernels.errors import Unsupported

Array = jax.Array

# impl=None keeps the kernel out: on the H200 (bench/results/2026-12-04-gemm-core,
# residual-gemm.json) it took 1.011-1.027x XLA's x @ w + r at four of the five measured
# shapes (8192 x (4096x4096, 14336x4096, 8192x2048, 2048x3072); 0.961 at 2048x2048, where
# XLA's time moved 7% between runs), against a target of 1.01x: the epilogue's residual
# tile and statistics cost 2-12% over our plain GEMM. Taken at every o- and
# down-projection, Llama-3.2-1B's and Qwen3-0.6B's prefill measured no faster (0.969 and
# 0.979x stock against 0.970 and 0.973x without it, medians of three rounds).
MEASURED_RATIO = "1.011-1.027x"


@register("residual_dense", "mosaic")
def residual_dense(x: Array, kernel: Array, bias: Array | None, residual: Array, *,
                   interpret: bool) -> tuple[Array, Array, Array]:
    if x.dtype not in (jnp.bfloat16, jnp.float16):
        raise Unsupported(f"x dtype {x.dtype} not served by the Mosaic GEMM (bfloat16, float16)")
    if x.shape[0] == 0:
        raise Unsupported("M=0 (empty leading dimensions)")
    if kernel.dtype != x.dtype:
        raise Unsupported(f"kernel dtype {kernel.dtype} differs from x dtype {x.dtype}; casting "
                          "the weights per call would copy them")
    x = x if interpret else on_gpu_only(x, "residual_dense")
    m, k = x.shape
    if m <= decode_matmul.MAX_ROWS:
        return _decode(x, kernel, bias, residual, interpret=interpret)
    config = rm.residual_config(m, k, kernel.shape[1], itemsize=jnp.dtype(x.dtype).itemsize)
    h, (sums, m2s) = rm.residual_matmul(x, kernel, residual, bias=bias, config=config,
                                        interpret=interpret)
    mean, m2 = row_stats.from_partials(sums, m2s, gemm_config.part_columns(kernel.shape[1],
                                                                           config))
    return h, mean, m2


def _decode(x: Array, kernel: Array, bias: Array | None, residual: Array, *,
            interpret: bool) -> tuple[Array, Array, Array]:
    """(h, mean, m2) at decode rows: one launch where the config's splits are a cluster (the
    decode table has such entries only where a GPU run checked and timed them), else the
    decode GEMM's product and XLA's add and statistics."""
    m, k = x.shape
    n = kernel.shape[1]
    config = decode_matmul.decode_config(m, k, [n], sms=hardware.num_sms())
    if config.cluster_splits and n % config.cta_tile_n == 0:
        h, sums, m2s = decode_matmul.decode_residual_matmul(
            x, kernel, residual, bias=bias, config=config, interpret=interpret)
        mean, m2 = row_stats.from_partials(sums, m2s, config.tile_n)
        return h, mean, m2
    (y,) = decode_matmul.lazy_rms_decode_matmul(
        x, [kernel], row_scale=jnp.ones((m,), jnp.float32), biases=[bias], config=config,
        interpret=interpret)
    return xla.residual_outputs(y, residual)


@decline_automatic("residual_dense")
def _slower_than_xla(x, kernel, bias, residual, **kwargs) -> str | None:
    if x.shape[0] <= decode_matmul.MAX_ROWS:
        return decode_not_faster(x, (kernel,))
    return (f"the residual GEMM measured {MEASURED_RATIO} XLA's x @ w + r on the H200 "
            "(bench/results/2026-12-04-gemm-core); impl='mosaic' forces it")
