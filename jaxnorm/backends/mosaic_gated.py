"""Mosaic GPU backend of the gated MLP input: `pallas_kernels.gated_matmul`, and at decode
(M <= 64) `pallas_kernels.decode_gated` (one weight-streaming launch, the row statistic in the
kernel when the gain is folded).

Serves bfloat16/float16 activations with weights of the same dtype, K and N
multiples of 64, any M >= 1. Anything else raises `Unsupported` with the
reason, and dispatch falls back to xla. Forward only: `jaxnorm.gated`'s
custom_vjp supplies a pure-JAX backward.
"""

from __future__ import annotations

import jax

from jaxnorm.backends.mosaic_dense import _check
from jaxnorm.backends.xla_gated import OP
from jaxnorm.dispatch import decline_automatic, register
from pallas_kernels import decode_gated, gated_matmul

Array = jax.Array


@register(OP, "mosaic")
def rms_norm_gated_dense(x: Array, scale: Array | None, gate_kernel: Array, up_kernel: Array,
                         gate_bias: Array | None, up_bias: Array | None, *, activation: str,
                         eps: float, scale_offset: float, interpret: bool) -> Array:
    x = _check(x, (gate_kernel, up_kernel), OP, interpret)
    kernel = (decode_gated.decode_gated_rms_matmul if x.shape[0] <= decode_gated.MAX_ROWS
              else gated_matmul.gated_rms_matmul)
    return kernel(
        x, gate_kernel, up_kernel, activation=activation, eps=eps, scale=scale,
        scale_offset=scale_offset, gate_bias=gate_bias, up_bias=up_bias, interpret=interpret)


# Measured on the H200 (bench/results/2026-12-01-free-stats, gated-bench.json, CUPTI,
# SwiGLU, gain unfolded): 0.785-0.959x XLA's norm + two dots + silu * up at M = 4096
# (K x d_ff = 2048x8192, 4096x14336, 1024x3072, 2560x9728) and M = 8192 (2048x8192,
# 4096x14336). Smaller M is not measured.
MIN_MEASURED_ROWS = 4096


@decline_automatic(OP)
def _not_measured_faster(x, *args, **kwargs) -> str | None:
    """The kernel runs under impl=None only at the row counts where it measured faster."""
    if x.shape[0] <= decode_gated.MAX_ROWS:
        return (f"at M={x.shape[0]} the decode gated kernel (pallas_kernels/decode_gated.py) "
                "is not yet measured against XLA's norm + two dots + act * up on the H200 "
                "(bench/decode_groups.py); impl='mosaic' forces it")
    if x.shape[0] >= MIN_MEASURED_ROWS:
        return None
    return (f"at M={x.shape[0]} < {MIN_MEASURED_ROWS} the gated gate/up kernel is not measured "
            "against XLA's norm + two dots + act * up on the H200 (bench/gated_bench.py); "
            "impl='mosaic' forces it")
