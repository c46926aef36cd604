"""Mosaic GPU backend of the pre-norm dense ops: the lazy norm GEMM of pallas_kernels.

Serves bfloat16/float16 activations with kernels of the same dtype, K and
every N a multiple of 64, any M >= 1. Anything else raises `Unsupported` with
the reason, and dispatch falls back to xla. Forward only: the ops' custom_vjp
supplies a pure-JAX backward.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxnorm.backends.mosaic_device import on_gpu_only
from jaxnorm.dispatch import decline_automatic, register
from pallas_kernels import lazy_norm_matmul as lazy
from pallas_kernels.errors import Unsupported

Array = jax.Array


def _check(x: Array, kernels: tuple[Array, ...], op: str, interpret: bool) -> Array:
    """x, checked (and guarded against running off a GPU unless interpreted)."""
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
    return x if interpret else on_gpu_only(x, op)


def _config(x: Array, kernels: tuple[Array, ...]) -> lazy.TuningConfig:
    m, k = x.shape
    ns = [w.shape[1] for w in kernels]
    return lazy.default_config(m, k, ns)


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
    x = _check(x, kernels, "rms_norm_dense", interpret)
    return lazy.lazy_rms_matmul(
        x, kernels, eps=eps, scale=scale, scale_offset=scale_offset, biases=biases,
        config=_config(x, kernels), interpret=interpret,
    )


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
    x = _check(x, kernels, "layer_norm_dense", interpret)
    return lazy.lazy_layer_norm_matmul(
        x, kernels, eps=eps, scale=scale, norm_bias=norm_bias, scale_offset=scale_offset,
        biases=biases, config=_config(x, kernels), interpret=interpret,
    )


def _slower_than_xla(x: Array, kernels: tuple[Array, ...]) -> str | None:
    """Where bench/results/h200-2026-11-29 measured the kernel slower than XLA, say so.

    CUPTI kernel time, bf16, against XLA's norm + dot: at M <= 16 the kernel
    took 1.06-1.97x XLA's time (it streams weights at 1.4-3.4 TB/s against
    XLA's 3.2-4.0), and at M <= 512 with N <= 10240 in total 1.18-1.97x. Elsewhere
    it was within 0.85-1.05x (one outlier at 1.18x, 16384x4096x28672).
    """
    m, total_n = x.shape[0], sum(w.shape[1] for w in kernels)
    if m <= 16 or (m <= 512 and total_n <= 10240):
        return (f"at M={m}, N={total_n} the lazy-norm kernel measured 1.06-1.97x XLA's time on "
                "the H200 (decode-sized GEMMs are not tuned yet); impl='mosaic' forces it")
    return None


@decline_automatic("rms_norm_dense")
def _decline_rms_norm_dense(x, scale, kernels, biases, **kwargs) -> str | None:
    return _slower_than_xla(x, kernels)


@decline_automatic("layer_norm_dense")
def _decline_layer_norm_dense(x, scale, norm_bias, kernels, biases, **kwargs) -> str | None:
    return _slower_than_xla(x, kernels)
