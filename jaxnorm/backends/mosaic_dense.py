"""Mosaic GPU backend of the pre-norm dense ops: the lazy norm GEMM of pallas_kernels.

Serves bfloat16/float16 activations with kernels of the same dtype, K and
every N a multiple of 64, any M >= 1. Anything else raises `Unsupported` with
the reason, and dispatch falls back to xla. Forward only: the ops' custom_vjp
supplies a pure-JAX backward.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxnorm.dispatch import Unsupported, register
from pallas_kernels import lazy_norm_matmul as lazy

Array = jax.Array


def _check(x: Array, kernels: tuple[Array, ...]) -> None:
    if x.dtype not in (jnp.bfloat16, jnp.float16):
        raise Unsupported(f"x dtype {x.dtype} not served by the Mosaic GEMM (bfloat16, float16)")
    if x.shape[0] == 0:
        raise Unsupported("M=0 (empty leading dimensions)")
    for i, w in enumerate(kernels):
        if w.dtype != x.dtype:
            raise Unsupported(
                f"kernel[{i}] dtype {w.dtype} differs from x dtype {x.dtype}; casting the "
                "weights per call would copy them"
            )


def _config(x: Array, kernels: tuple[Array, ...]) -> lazy.TuningConfig:
    m, k = x.shape
    return lazy.default_config(
        m, k, [w.shape[1] for w in kernels],
        stats_warpgroup=lazy.use_statistics_warpgroup(m, k, [w.shape[1] for w in kernels]),
    )


@register("rms_norm_dense", "mosaic")
def rms_norm_dense(
    x: Array,
    scale: Array | None,
    kernels: tuple[Array, ...],
    biases: tuple[Array | None, ...],
    *,
    eps: float,
    scale_offset: float,
    interpret: bool,
) -> tuple[Array, ...]:
    _check(x, kernels)
    try:
        return lazy.lazy_rms_matmul(
            x, kernels, eps=eps, scale=scale, scale_offset=scale_offset, biases=biases,
            config=_config(x, kernels), interpret=interpret,
        )
    except lazy.Unsupported as reason:
        raise Unsupported(str(reason)) from None


@register("layer_norm_dense", "mosaic")
def layer_norm_dense(
    x: Array,
    scale: Array | None,
    norm_bias: Array | None,
    kernels: tuple[Array, ...],
    biases: tuple[Array | None, ...],
    *,
    eps: float,
    scale_offset: float,
    interpret: bool,
) -> tuple[Array, ...]:
    _check(x, kernels)
    try:
        return lazy.lazy_layer_norm_matmul(
            x, kernels, eps=eps, scale=scale, norm_bias=norm_bias, scale_offset=scale_offset,
            biases=biases, config=_config(x, kernels), interpret=interpret,
        )
    except lazy.Unsupported as reason:
        raise Unsupported(str(reason)) from None
