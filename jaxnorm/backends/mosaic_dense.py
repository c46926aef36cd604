"""Mosaic GPU backend of the pre-norm dense ops: the lazy norm GEMM of pallas_kernels.

Serves bfloat16/float16 activations with kernels of the same dtype, K and
every N a multiple of 64, any M >= 1. Anything else raises `Unsupported` with
the reason, and dispatch falls back to xla. Forward only: the ops' custom_vjp
supplies a pure-JAX backward.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import jax
import jax.numpy as jnp

from jaxnorm import row_stats
from jaxnorm.backends.mosaic_device import on_gpu_only
from jaxnorm.dispatch import decline_automatic, register
from pallas_kernels import decode_config, decode_matmul, hardware
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
    return lazy.default_config(m, k, [w.shape[1] for w in kernels])


@register("rms_norm_dense", "mosaic")
def rms_norm_dense(
    x: Array,
    scale: Array | None,
    kernels: tuple[Array, ...],
    biases: tuple[Array | None, ...],
    stats: row_stats.RowStats | None = None,
    *,
    eps: float,
    scale_offset: float,
    interpret: bool,
) -> tuple[Array, ...]:
    x = _check(x, kernels, "rms_norm_dense", interpret)
    row_scale = None if stats is None else row_stats.rms_inverse(stats, eps)
    if x.shape[0] <= decode_matmul.MAX_ROWS:  # decode: the weight-streaming split-K GEMM
        return decode_matmul.decode_rms_norm_dense(
            x, kernels, eps=eps, scale=scale, scale_offset=scale_offset, biases=biases,
            row_scale=row_scale, interpret=interpret)
    return lazy.lazy_rms_matmul(
        x, kernels, eps=eps, scale=scale, scale_offset=scale_offset, biases=biases,
        row_scale=row_scale, config=_config(x, kernels), interpret=interpret,
    )


@register("layer_norm_dense", "mosaic")
def layer_norm_dense(
    x: Array,
    scale: Array | None,
    norm_bias: Array | None,
    kernels: tuple[Array, ...],
    biases: tuple[Array | None, ...],
    stats: row_stats.RowStats | None = None,
    *,
    eps: float,
    scale_offset: float,
    interpret: bool,
) -> tuple[Array, ...]:
    x = _check(x, kernels, "layer_norm_dense", interpret)
    row_vectors = None
    if stats is not None:
        inv_std = row_stats.inverse_std(stats, eps)
        row_vectors = (inv_std, inv_std * stats.mean)
    return lazy.lazy_layer_norm_matmul(
        x, kernels, eps=eps, scale=scale, norm_bias=norm_bias, scale_offset=scale_offset,
        biases=biases, row_vectors=row_vectors, config=_config(x, kernels), interpret=interpret,
    )


# Where the lazy-norm kernel is not used automatically above decode's M <= 64, from H200
# measurements (CUPTI kernel time, bf16, against the stock norm then one dot per weight):
# - M <= 512 with N <= 10240 in total: 1.06-1.97x the stock time
#   (bench/results/2026-11-29-norm-gemm);
# - N > 8192 in total: the GEMM dominates and the kernel loses more than the norm
#   saves: 8192x2048x(8192+8192) took 738 us against 695 us, while
#   8192x2048x(2048+512+512) took 155 against 192 and 8192x1024x(3072+3072) 154 against
#   209 (bench/results/2026-12-01-model, training-ops.json). The plain GEMM core itself
#   measured 1.01-1.02x cuBLAS at 2048 x 16384 (bench/results/2026-12-04-gemm-core).
_MAX_TOTAL_N = 8192


def _slower_than_xla(x: Array, kernels: tuple[Array, ...]) -> str | None:
    """The reason the kernel stays out at this shape under impl=None, or None."""
    m, total_n = x.shape[0], sum(w.shape[1] for w in kernels)
    if m <= 512 and total_n <= 10240:
        return (f"at M={m}, N={total_n} the lazy-norm kernel measured 1.06-1.97x the stock "
                "norm + dot on the H200 (decode-sized GEMMs are not tuned yet); "
                "impl='mosaic' forces it")
    if total_n > _MAX_TOTAL_N:
        return (f"N={total_n} in total > {_MAX_TOTAL_N}: the GEMM dominates and the kernel's "
                "mainloop (1.01-1.02x cuBLAS there) loses more than the norm saves; "
                "impl='mosaic' forces it")
    return None


# At decode a launch must have measured at most this fraction of stock's dots alone: on the
# H200 Llama-3.2-1B's q/k/v launch at M = 8 measured 0.931x stock's three dots alone but
# made the decode step 1.022x stock's in both rounds (4793b0f), while M = 1 launches at
# 0.32-0.47x took the step to 0.779-0.794x (bench/results/2026-12-01-decode). That 0.931
# was timed inside L2 and against three slice kernels that XLA's merged q/k/v GEMM needed
# only because the bench returned its outputs apart; against the GEMM alone, timed cold, the
# launch is 1.31-1.44x (bench/results/2026-12-05-decode-cold; the table's ratios are so
# since, `bench.decode_table_writer.xla_slice_share`). The margin stays until a model
# step shows a launch between it and 1 paying off.
DECODE_MAX_RATIO = 0.9


def nearest_measured(provenance: dict, point: Sequence[int],
                     entries: Iterable[tuple[Sequence[int], tuple]]) -> tuple | None:
    """Of a measured table's (dimensions, entry) pairs, the entry within 2x of `point` in
    every dimension and nearest it in log2 (ties: the smaller entry[0]); None where there is
    none or the table was measured on a GPU with another SM count."""
    if provenance.get("sms") != hardware.num_sms():
        return None
    here = [math.log2(d) for d in point]
    near = []
    for dims, entry in entries:
        there = [math.log2(d) for d in dims]
        if all(abs(a - b) <= 1 for a, b in zip(here, there)):
            near.append((math.dist(here, there), entry))
    return min(near, key=lambda e: (e[0], e[1][0]))[1] if near else None


def decode_not_faster(x: Array, kernels: tuple[Array, ...]) -> str | None:
    """At decode (M <= 64) a kernel built on the decode GEMM runs automatically only where
    its measured table (pallas_kernels/decode_configs.py) has it at or under
    DECODE_MAX_RATIO of stock's dots at the nearest measured launch: the XLA work around
    the product (the norm's pass over x, or the residual add and statistics) is the same
    either way."""
    m, k = x.shape
    ns = [w.shape[1] for w in kernels]
    entry = decode_config.measured_entry(m, k, ns, sms=hardware.num_sms(),
                                         itemsize=x.dtype.itemsize)
    if entry is None:
        return (f"at M={m}, K={k}, N={sum(ns)} the decode GEMM "
                "has no measured shape nearby (pallas_kernels/decode_configs.py); "
                "impl='mosaic' forces it")
    if entry.ratio_to_cublas > DECODE_MAX_RATIO:
        em, ek, ens = entry.shape
        return (f"at M={m} the decode GEMM measured {entry.ratio_to_cublas:.3f}x cuBLAS at "
                f"the nearest launch {em}x{ek}x{'+'.join(map(str, ens))} on the H200, above "
                f"the {DECODE_MAX_RATIO}x that carries into a model's decode step "
                "(pallas_kernels/decode_configs.py); impl='mosaic' forces it")
    return None


@decline_automatic("rms_norm_dense")
def _decline_rms_norm_dense(x, scale, kernels, biases, *stats, **kwargs) -> str | None:
    if x.shape[0] <= decode_matmul.MAX_ROWS:
        return decode_not_faster(x, kernels)
    return _slower_than_xla(x, kernels)


@decline_automatic("layer_norm_dense")
def _decline_layer_norm_dense(x, scale, norm_bias, kernels, biases, *stats,
                              **kwargs) -> str | None:
    return _slower_than_xla(x, kernels)
