"""The decode GEMM (M <= 64): diag(r) (X @ W_i) + b_i for several weights, streaming weights.

The weight-streaming kernel of `pallas_kernels.decode_kernel` with one stream per
weight: work units (weight, N tile, K split) over the concatenated N of q/k/v
(or any weights sharing x) in one launch. split_k = 1 runs the epilogue (row
scale, bias, cast) in the kernel, and with no row scale given takes the row
statistic there too, from the x tiles every unit streams anyway; split_k > 1
writes float32 partials that one XLA fusion sums, scales and biases (M*N*S
floats: small at decode), or with `reduction="cluster"` sums them in the kernel
(each tile's splits one cluster) and runs the same epilogue there. Knobs and
selection: pallas_kernels/decode_config.py.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
import jax.experimental.pallas as pl
import jax.numpy as jnp

from pallas_kernels import decode_config as dc
from pallas_kernels import decode_kernel, hardware
from pallas_kernels.decode_config import MAX_ROWS, DecodeConfig, check_shapes, decode_config
from pallas_kernels.decode_kernel import x_box_rows
from pallas_kernels.lazy_norm_matmul import rms_row_scale

__all__ = ["MAX_ROWS", "DecodeConfig", "decode_config", "decode_residual_matmul",
           "decode_rms_norm_dense", "lazy_rms_decode_matmul", "residual_smem_bytes",
           "x_box_rows"]

Array = jax.Array


def _build(x: Array, weights: Sequence[Array], *, config: DecodeConfig, has_bias: bool,
           interpret: bool, x_box: int = MAX_ROWS, in_kernel_stats: bool = False,
           eps: float = 0.0):
    """The launch for these weights: x.dtype outputs (split_k = 1) or float32 partials."""
    m = x.shape[0]
    if not config.partials_out:
        out_types = [jax.ShapeDtypeStruct((m, w.shape[1]), x.dtype) for w in weights]
        row_scale = "in_kernel" if in_kernel_stats else "given"
    else:
        out_types = [jax.ShapeDtypeStruct((config.split_k, m, w.shape[1]), jnp.float32)
                     for w in weights]
        row_scale = None
    plan = decode_kernel.Plan(
        n_tiles=tuple(pl.cdiv(w.shape[1], config.cta_tile_n) for w in weights), x_box=x_box,
        has_bias=has_bias, row_scale=row_scale, eps=eps)
    return decode_kernel.build(x, weights, out_types, config=config, plan=plan,
                               interpret=interpret)


def lazy_rms_decode_matmul(
    x: Array,
    weights: Sequence[Array],
    *,
    row_scale: Array | None = None,
    eps: float = 1e-6,
    biases: Sequence[Array | None] | None = None,
    config: DecodeConfig | None = None,
    interpret: bool = False,
) -> tuple[Array, ...]:
    """diag(r) (x @ W_i) + b_i for every weight in one launch; outputs in x.dtype.

    x: [M, K] bf16/f16 with M <= 64; weights: [K, N_i] of x's dtype (the norm's
    gain folded into x or W); row_scale: [M] float32 r, or None for
    r = rsqrt(mean(x^2) + eps) of this x: in the kernel where it sums the K splits itself
    (split_k = 1, or a cluster), else one XLA row reduction (`rms_row_scale`).
    """
    weights = tuple(weights)
    biases = tuple(biases) if biases is not None else (None,) * len(weights)
    m, k = x.shape
    ns = [w.shape[1] for w in weights]
    if config is None:
        config = decode_config(m, k, ns, sms=hardware.num_sms())
    check_shapes(x, weights, config)
    if row_scale is not None and row_scale.shape != (m,):
        raise ValueError(f"row_scale must be [M={m}]; got {row_scale.shape}")
    if len(biases) != len(weights):
        raise ValueError(f"biases: {len(biases)} given for {len(weights)} weights")
    in_kernel = row_scale is None and not config.partials_out
    if row_scale is None and not in_kernel:
        row_scale = rms_row_scale(x, eps)
    bias32 = [jnp.zeros((n,), jnp.float32) if b is None else b.astype(jnp.float32)
              for b, n in zip(biases, ns)]
    has_bias = any(b is not None for b in biases)
    # x and the outputs keep their M rows: TMA zero-fills the box's rows past M on loads and
    # drops them on stores.
    build = functools.partial(_build, x, weights, config=config, interpret=interpret,
                              x_box=x_box_rows(m))
    if not config.partials_out:
        vectors = (([] if in_kernel else [row_scale.astype(jnp.float32)])
                   + (bias32 if has_bias else []))
        return build(has_bias=has_bias, in_kernel_stats=in_kernel, eps=eps)(x, *weights,
                                                                           *vectors)
    partials = build(has_bias=False)(x, *weights)
    row_scale = row_scale.astype(jnp.float32)
    return tuple(
        (jnp.sum(p, axis=0) * row_scale[:, None] + b[None, :]).astype(x.dtype)
        for p, b in zip(partials, bias32)
    )


def decode_residual_matmul(
    x: Array,
    w: Array,
    residual: Array,
    *,
    bias: Array | None = None,
    config: DecodeConfig | None = None,
    interpret: bool = False,
) -> tuple[Array, Array, Array]:
    """(h, sums, m2s): h = x @ w + bias + residual in x.dtype, added in float32 before the
    one rounding, and per tile_n-column block the rows' sum and M2 of h as stored (what
    the xla path's statistics are of; [N / tile_n, M] each, `jaxnorm.row_stats.from_partials`
    combines them), from one launch: the residual stream and the next norm's statistics
    at decode (M <= 64).

    The config's K splits must be summed in the kernel (split_k = 1 or
    reduction="cluster") and N must be whole CTA tiles; else `Unsupported`."""
    m, k = x.shape
    n = w.shape[1]
    if residual.shape != (m, n) or residual.dtype != x.dtype:
        raise ValueError(f"residual must be {(m, n)} {x.dtype}; got {residual.shape} "
                         f"{residual.dtype}")
    if config is None:
        config = decode_config(m, k, [n], sms=hardware.num_sms())
    extra = residual_smem_bytes(config, jnp.dtype(x.dtype).itemsize)
    config = dc.deepest(config, jnp.dtype(x.dtype).itemsize, max_stages=config.stages,
                        extra=extra)
    check_shapes(x, [w], config, extra=extra)
    plan = decode_kernel.Plan(n_tiles=(pl.cdiv(n, config.cta_tile_n),), x_box=x_box_rows(m),
                              has_bias=bias is not None, row_scale=None, residual=True)
    # The statistics' rows padded to the x box: TMA wants 16-byte row strides.
    parts, box = n // config.tile_n, x_box_rows(m)
    out_types = [jax.ShapeDtypeStruct((m, n), x.dtype)] + [
        jax.ShapeDtypeStruct((parts, box), jnp.float32)] * 2
    vectors = [] if bias is None else [bias.astype(jnp.float32)]
    h, sums, m2s = decode_kernel.build(x, [w], out_types, config=config, plan=plan,
                                       interpret=interpret)(x, w, *vectors, residual)
    return h, sums[:, :m], m2s[:, :m]


def residual_smem_bytes(config: DecodeConfig, itemsize: int) -> int:
    """Shared memory of the residual epilogue: double-buffered residual tiles and the row
    statistics' staging (`decode_kernel.Plan.residual`), and 3 KiB for their alignment and
    barriers (`smem_bytes` is an estimate; Mosaic's count ran 1.5 KiB above it here)."""
    return (2 * config.cta_tile_n * MAX_ROWS * itemsize + config.warpgroups * 2 * MAX_ROWS * 4
            + 3 * 1024)


def decode_rms_norm_dense(
    x: Array,
    weights: Sequence[Array],
    *,
    eps: float,
    scale: Array | None,
    scale_offset: float,
    biases: Sequence[Array | None] | None,
    row_scale: Array | None = None,
    config: DecodeConfig | None = None,
    interpret: bool = False,
    in_kernel_statistic: bool = False,
) -> tuple[Array, ...]:
    """RMSNorm(x; scale) @ W_i + b_i at decode. A gain that is not folded scales x (M*K, the
    smaller operand) in XLA, in the pass that also takes the row statistic of the unscaled x
    (unless `row_scale` gives it). With the gain folded or absent, no `row_scale` and
    `in_kernel_statistic`, the statistic is left to `lazy_rms_decode_matmul` (in the kernel
    at split_k = 1); by default it is one XLA row reduction, the path the H200 measured in
    decode steps, until the in-kernel one has run there (bench/gpu/check_kernels.py,
    "decode GEMM statistic")."""
    if row_scale is None and (scale is not None or not in_kernel_statistic):
        row_scale = rms_row_scale(x, eps)
    if scale is not None:
        x = (x.astype(jnp.float32) * (scale.astype(jnp.float32) + scale_offset)).astype(x.dtype)
    return lazy_rms_decode_matmul(x, weights, row_scale=row_scale, eps=eps, biases=biases,
                                  config=config, interpret=interpret)
