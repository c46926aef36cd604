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

from jaxnorm import row_stats
from jaxnorm.backends import decode_gated_measured
from jaxnorm.backends.mosaic_dense import DECODE_MAX_RATIO, _check, nearest_measured
from jaxnorm.backends.xla_gated import OP
from jaxnorm.dispatch import decline_automatic, register
from pallas_kernels import decode_config, decode_gated, gated_matmul

Array = jax.Array


@register(OP, "mosaic")
def rms_norm_gated_dense(x: Array, scale: Array | None, gate_kernel: Array, up_kernel: Array,
                         gate_bias: Array | None, up_bias: Array | None,
                         stats: row_stats.RowStats | None = None, *, activation: str,
                         eps: float, scale_offset: float, interpret: bool) -> Array:
    x = _check(x, (gate_kernel, up_kernel), OP, interpret)
    decode = x.shape[0] <= decode_gated.MAX_ROWS
    kernel = decode_gated.decode_gated_rms_matmul if decode else gated_matmul.gated_rms_matmul
    config = {}
    if decode and (measured := measured_decode_config(x.shape[0], x.shape[1],
                                                      gate_kernel.shape[1])) is not None:
        config = dict(config=measured)
    return kernel(
        x, gate_kernel, up_kernel, activation=activation, eps=eps, scale=scale,
        scale_offset=scale_offset, gate_bias=gate_bias, up_bias=up_bias,
        row_scale=None if stats is None else row_stats.rms_inverse(stats, eps),
        interpret=interpret, **config)


# Measured on the H200 (bench/results/2026-12-01-free-stats, gated-bench.json, CUPTI,
# SwiGLU, gain unfolded): 0.785-0.959x XLA's norm + two dots + silu * up at M = 4096
# (K x d_ff = 2048x8192, 4096x14336, 1024x3072, 2560x9728) and M = 8192 (2048x8192,
# 4096x14336). M between decode's 64 and 4096 is not measured.
MIN_MEASURED_ROWS = 4096
# GeGLU (Gemma) at prefill is not among them, and in Gemma-3-1B's prefill the model ran
# no faster with the kernel than with this op on xla (docs/measurements.md, "Gemma-3-1B's
# prefill and its GeGLU kernel").
MEASURED_ACTIVATIONS = ("silu",)


def _nearest_decode_entry(m: int, k: int, n: int):
    """(shape, folded ratio, unfolded ratio, config fields) of the decode_gated_measured entry
    within 2x of (M, K, d_ff) in each, nearest in log2; None if none."""
    return nearest_measured(
        decode_gated_measured.PROVENANCE, (m, k, n),
        ((shape, (shape, folded, unfolded, config))
         for shape, _, folded, unfolded, config in decode_gated_measured.ENTRIES))


def measured_decode_config(m: int, k: int, n: int) -> decode_config.DecodeConfig | None:
    """The config the nearest measured shape ran fastest with the gain folded (the one its
    ratio is of), where it fits this launch; else None (the kernel's modelled pick)."""
    entry = _nearest_decode_entry(m, k, n)
    return None if entry is None else decode_config.fitting_config(entry[3], k)


def decode_not_faster(x: Array, scale: Array | None, gate_kernel: Array) -> str | None:
    """At decode the kernel runs automatically only where the nearest measured shape had it
    at or under DECODE_MAX_RATIO of stock's MLP input, with the gain as this call has it."""
    (m, k), n = x.shape, gate_kernel.shape[1]
    gain = "folded" if scale is None else "unfolded"
    entry = _nearest_decode_entry(m, k, n)
    if entry is None:
        return (f"at {m}x{k}x{n} the decode gated kernel has no measured shape within 2x "
                "(jaxnorm/backends/decode_gated_measured.py, bench/decode_groups.py); "
                "impl='mosaic' forces it")
    shape, folded, unfolded, _ = entry
    ratio = folded if scale is None else unfolded
    if ratio is None:
        return (f"at {m}x{k}x{n} the decode gated kernel with the gain {gain} is not yet "
                f"measured (nearest shape {'x'.join(map(str, shape))}, "
                "jaxnorm/backends/decode_gated_measured.py); impl='mosaic' forces it")
    if ratio > DECODE_MAX_RATIO:
        return (f"at {m}x{k}x{n} the decode gated kernel with the gain {gain} measured "
                f"{ratio:.3f}x stock's norm + two dots + act * up at "
                f"{'x'.join(map(str, shape))} on the H200, above {DECODE_MAX_RATIO}x "
                "(jaxnorm/backends/decode_gated_measured.py); impl='mosaic' forces it")
    return None


@decline_automatic(OP)
def _not_measured_faster(x, scale, gate_kernel, *args, activation: str, **kwargs
                         ) -> str | None:
    """The kernel runs under impl=None only at the row counts and activations where it
    measured faster."""
    if x.shape[0] <= decode_gated.MAX_ROWS:
        return decode_not_faster(x, scale, gate_kernel)
    if x.shape[0] < MIN_MEASURED_ROWS:
        return (f"at M={x.shape[0]} < {MIN_MEASURED_ROWS} the gated gate/up kernel is not "
                "measured against XLA's norm + two dots + act * up on the H200 "
                "(bench/gated_bench.py); impl='mosaic' forces it")
    if activation not in MEASURED_ACTIVATIONS:
        return (f"at M={x.shape[0]} the gated gate/up kernel with activation {activation!r} "
                "is not measured faster than XLA's norm + two dots + act * up in a model "
                "(docs/measurements.md); impl='mosaic' forces it")
    return None
