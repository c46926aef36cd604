"""Mosaic GPU backend of RMSNorm's backward (`pallas_kernels.rms_norm_backward`).

The op "rms_norm_backward" maps (x, the cotangent of RMSNorm(x) in x's dtype or a tuple of
them (one per consumer of the normalized x, summed), scale, and optionally x's other
cotangent to add) to (dx, d scale). Its xla implementation is JAX's
VJP of the stock norm (`jaxnorm.backends.xla.rms_norm_vjp`); this one pads rows to whole
blocks (zero rows: zero gradients, dropped), runs the kernel compiled for the GPU or, with
`interpret=True`, under the Pallas GPU interpreter with race detection. Under automatic
dispatch a training step's norms take it only where bench/norm_backward.py measured it
faster than the stock backward (jaxnorm/backends/norm_backward_measured.py).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxnorm.backends import norm_backward_measured as measured
from jaxnorm.backends.mosaic_dense import nearest_measured
from jaxnorm.backends.mosaic_norms import _gpu_input, _num_sms
from jaxnorm.dispatch import decline_automatic, register
from pallas_kernels import rms_norm_backward as kernel
from pallas_kernels.errors import Unsupported
from pallas_kernels.padding import config_for_rows, pad_rows

Array = jax.Array
OP = "rms_norm_backward"

# Take the kernel where it measured at most this fraction of stock's backward and saved at
# least this much a launch: a kernel launch also splits XLA's command buffer, a wall-time
# cost CUPTI does not see. Gemma-3-1B's training step took up to 1.03x stock's wall time
# with 17 backward launches that saved at most 4.6 us each, Qwen3-0.6B's and Llama-3.2-1B's
# ran at or under stock's with launches saving 9.5-25 us
# (bench/results/2026-12-04-norm-backward).
MAX_RATIO = 0.95
MIN_SAVED_US = 5.0


def _config(m: int, k: int, dtype: jnp.dtype, interpret: bool, addend: bool,
            cotangents: int) -> kernel.BackwardConfig:
    return kernel.select_backward_config(m, k, dtype, num_sms=_num_sms(interpret),
                                         addend=addend, cotangents=cotangents)


@register(OP, "mosaic")
def rms_norm_backward(x: Array, g: Array | tuple[Array, ...], scale: Array | None,
                      addend: Array | None = None, *, eps: float, scale_offset: float,
                      interpret: bool) -> tuple[Array, Array | None]:
    m, k = x.shape
    gs = kernel.cotangents_of(g)
    if m == 0:
        raise Unsupported("x has no rows")
    if any(a is not None and a.dtype != x.dtype for a in (*gs, addend)):
        raise Unsupported(f"the cotangents' dtypes are not x's {x.dtype}")
    # Narrow rows take blocks of 4 rows (one warp per row), as the forward's.
    config, padded_m = config_for_rows(
        m, lambda rows: _config(rows, k, x.dtype, interpret, addend is not None, len(gs)), 4)
    x = _gpu_input(pad_rows(x, padded_m), OP, interpret)
    gs = tuple(pad_rows(a, padded_m) for a in gs)
    addend = None if addend is None else pad_rows(addend, padded_m)
    dx, d_scale = kernel.rms_norm_backward(x, gs, scale, addend, eps=eps,
                                           scale_offset=scale_offset, config=config,
                                           interpret=interpret)
    return dx[:m], None if d_scale is None else d_scale.astype(scale.dtype)


@decline_automatic(OP)
def _not_measured_faster(x: Array, g: Array | tuple[Array, ...], scale: Array | None,
                         addend: Array | None = None, **kwargs) -> str | None:
    (m, k), dtype, gain = x.shape, jnp.dtype(x.dtype).name, scale is not None
    stream, cotangents = addend is not None, len(kernel.cotangents_of(g))
    what = "with the stream's cotangent added in it" if stream else "alone"
    what += f", {cotangents} cotangents summed in it" if cotangents > 1 else ""
    entry = nearest_measured(measured.PROVENANCE, (m, k), (
        (shape, (shape, ratio, saved))
        for shape, name, has_gain, added, count, ratio, saved in measured.ENTRIES
        if name == dtype and has_gain == gain and added == stream and count == cotangents))
    if entry is None:
        return (f"RMSNorm's backward kernel ({what}) has no measured shape within 2x of "
                f"{m}x{k} {dtype} on this GPU (jaxnorm/backends/norm_backward_measured.py, "
                "python -m bench.norm_backward); training keeps JAX's autodiff of the norm")
    shape, ratio, saved = entry
    at = f"at {'x'.join(map(str, shape))} {dtype} (jaxnorm/backends/norm_backward_measured.py)"
    if ratio > MAX_RATIO:
        return (f"RMSNorm's backward kernel ({what}) measured {ratio:.3f}x JAX's autodiff of "
                f"the norm {at}, above {MAX_RATIO}x")
    if saved < MIN_SAVED_US:
        return (f"RMSNorm's backward kernel ({what}) saved {saved:.1f} us a launch {at}, "
                f"under the {MIN_SAVED_US} us a launch costs the step's wall time")
    return None
