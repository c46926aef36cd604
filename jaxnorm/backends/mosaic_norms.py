"""Mosaic GPU backends of the standalone norms and the post-norm dense ops.

Thin adapters: pick a kernel config from the shape (the heuristics live with
the kernels in `pallas_kernels`, which raise `Unsupported` for what they do not
serve, so that dispatch can fall back to xla), pad rows to whole tiles (at decode, M <= 64,
the post-norm ops' product is the decode GEMM's and XLA norms it), and run
the kernel compiled for the GPU (`mosaic_device.on_gpu_only`: Unsupported with the
reason anywhere else) or, with `interpret=True`, under the Pallas GPU interpreter
with race detection.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxnorm import row_stats
from jaxnorm.backends import xla
from jaxnorm.backends.mosaic_dense import decode_not_faster
from jaxnorm.backends.mosaic_device import on_gpu_only
from jaxnorm.dispatch import decline_automatic, register
from pallas_kernels import decode_matmul, hardware, post_norm_matmul, row_norm
from pallas_kernels.errors import Unsupported
from pallas_kernels.padding import config_for_rows, pad_rows, round_up

Array = jax.Array


def _num_sms(interpret: bool) -> int:
    # The interpreter has no SM count: plan as for the H200, so that a shape gets the
    # same kind of config on CPU as on the GPU.
    return hardware.H200_SMS if interpret else hardware.num_sms()


def _gpu_input(x: Array, op: str, interpret: bool) -> Array:
    """x, guarded so that impl='mosaic' raises Unsupported where no GPU can run the kernel."""
    return x if interpret else on_gpu_only(x, op)


def _row_norm_config(m: int, k: int, dtype: jnp.dtype, interpret: bool) -> row_norm.RowNormConfig:
    return row_norm.select_config(
        m,
        k,
        dtype,
        num_sms=_num_sms(interpret),
        transport="global" if interpret else "dsmem",
        max_cluster=hardware.INTERPRET_MAX_CLUSTER if interpret else None,
    )


# A row narrower than 4 warps' worth of lanes (e.g. K = 64 to 1000) needs
# blocks of 4 rows (one warp per row); M is then padded to a multiple of 4.
# The padded rows are tiny next to any row wide enough to matter.
_ROW_PAD = 4


def _run_row_norm(
    kind: row_norm.Kind,
    x: Array,
    scale: Array | None,
    bias: Array | None,
    eps: float,
    scale_offset: float,
    interpret: bool,
) -> Array:
    m, k = x.shape
    if m == 0:
        raise Unsupported("x has no rows")
    op = "rms_norm" if kind == "rms" else "layer_norm"
    config, padded_m = config_for_rows(
        m, lambda rows: _row_norm_config(rows, k, x.dtype, interpret), _ROW_PAD)
    x = _gpu_input(pad_rows(x, padded_m), op, interpret)
    y = row_norm.row_norm(
        x, scale, bias, kind=kind, eps=eps, scale_offset=scale_offset, config=config,
        interpret=interpret,
    )
    return y[:m]


@register("rms_norm", "mosaic")
def rms_norm(
    x: Array, scale: Array | None, *, eps: float, scale_offset: float, interpret: bool
) -> Array:
    return _run_row_norm("rms", x, scale, None, eps, scale_offset, interpret)


@register("layer_norm", "mosaic")
def layer_norm(
    x: Array,
    scale: Array | None,
    bias: Array | None,
    *,
    eps: float,
    scale_offset: float,
    interpret: bool,
) -> Array:
    return _run_row_norm("layer", x, scale, bias, eps, scale_offset, interpret)


# Rows are padded to whole 64-row tiles (the wgmma M tile); padded rows are
# computed and dropped.
_POST_NORM_ROW_TILE = 64


def _post_norm(
    kind: row_norm.Kind,
    x: Array,
    kernel: Array,
    bias: Array | None,
    scale: Array | None,
    norm_bias: Array | None,
    residual: Array | None,
    eps: float,
    pre_norm_sum: bool,
    residual_after: bool,
    interpret: bool,
    output_stats: bool = False,
) -> tuple[Array, ...]:
    """(y, h or None); with `output_stats`, (y, mean, M2) of y's float32 rows, combined here
    from the kernel's per-tile partials (`jaxnorm.row_stats.from_partials`)."""
    m, k = x.shape
    n = kernel.shape[1]
    if m == 0:
        raise Unsupported("x has no rows")
    # The tensor cores take one operand dtype; casting W (or the residual) here
    # would copy it on every call, so a mismatch is left to xla.
    for name, a in (("kernel", kernel), ("residual", residual)):
        if a is not None and a.dtype != x.dtype:
            raise Unsupported(f"{name} dtype {a.dtype} differs from x dtype {x.dtype}")
    if m <= decode_matmul.MAX_ROWS:
        return _post_norm_decode(kind, x, kernel, bias, scale, norm_bias, residual, eps,
                                 pre_norm_sum, residual_after, output_stats, interpret)
    padded_m = round_up(m, _POST_NORM_ROW_TILE)
    if interpret:
        config = post_norm_matmul.select_config(
            padded_m, k, n, x.dtype, kind=kind, residual=residual is not None,
            transport="global",
            max_cluster=hardware.INTERPRET_MAX_CLUSTER, num_sms=_num_sms(interpret),
        )
    else:
        config = post_norm_matmul.select_gpu_config(
            padded_m, k, n, x.dtype, kind=kind, residual=residual is not None,
            num_sms=_num_sms(interpret))
    x = _gpu_input(pad_rows(x, padded_m), "dense_rms_norm" if kind == "rms" else
                   "dense_layer_norm", interpret)
    residual = None if residual is None else pad_rows(residual, padded_m)
    outs = post_norm_matmul.post_norm_matmul(
        x, kernel, bias, scale, norm_bias, residual, kind=kind, eps=eps, config=config,
        pre_norm_sum=pre_norm_sum, residual_after=residual_after, output_stats=output_stats,
        interpret=interpret,
    )
    y, h = outs[0][:m], None if outs[1] is None else outs[1][:m]
    if not output_stats:
        return y, h
    sums, m2s = outs[2]
    mean, m2 = row_stats.from_partials(sums[:, :m], m2s[:, :m], config.tile_n)
    return y, mean, m2


def _post_norm_decode(kind: row_norm.Kind, x: Array, kernel: Array, bias: Array | None,
                      scale: Array | None, norm_bias: Array | None, residual: Array | None,
                      eps: float, pre_norm_sum: bool, residual_after: bool, output_stats: bool,
                      interpret: bool) -> tuple[Array, ...]:
    """At decode (M <= 64) the product is the weight-streaming decode GEMM's
    (pallas_kernels/decode_matmul.py), in x's dtype as a dot writes it; XLA then norms it,
    adds the residual in float32 and takes the statistics of that float32 sum (what the
    post-norm kernel's epilogue returns) in the fusion that follows: M*N elements, small at
    decode, where what costs is streaming W (a row's N tiles need no statistics exchange)."""
    x = _gpu_input(x, "dense_rms_norm" if kind == "rms" else "dense_layer_norm", interpret)
    (product,) = decode_matmul.lazy_rms_decode_matmul(
        x, [kernel], row_scale=jnp.ones((x.shape[0],), jnp.float32), interpret=interpret)
    if bias is not None:
        product = product + bias.astype(product.dtype)
    h = product.astype(jnp.float32)
    if residual is not None and not residual_after:
        h = h + residual.astype(jnp.float32)
    y = (xla.rms_normalized_f32(h, scale, eps, 0.0) if kind == "rms"
         else xla.layer_normalized_f32(h, scale, norm_bias, eps, 0.0))
    if residual_after:
        y = y + residual.astype(jnp.float32)
    if output_stats:
        stats = row_stats.of_rows(y)
        return y.astype(x.dtype), stats.mean, stats.m2
    return y.astype(x.dtype), h.astype(x.dtype) if pre_norm_sum else None


@register("dense_rms_norm", "mosaic")
def dense_rms_norm(
    x: Array,
    kernel: Array,
    bias: Array | None,
    scale: Array | None,
    residual: Array | None,
    *,
    eps: float,
    pre_norm_sum: bool = True,
    residual_after: bool = False,
    output_stats: bool = False,
    interpret: bool,
) -> tuple[Array, ...]:
    return _post_norm("rms", x, kernel, bias, scale, None, residual, eps, pre_norm_sum,
                      residual_after, interpret, output_stats)


@register("dense_layer_norm", "mosaic")
def dense_layer_norm(
    x: Array,
    kernel: Array,
    bias: Array | None,
    scale: Array | None,
    norm_bias: Array | None,
    residual: Array | None,
    *,
    eps: float,
    pre_norm_sum: bool = True,
    residual_after: bool = False,
    output_stats: bool = False,
    interpret: bool,
) -> tuple[Array, ...]:
    return _post_norm("layer", x, kernel, bias, scale, norm_bias, residual, eps, pre_norm_sum,
                      residual_after, interpret, output_stats)


# Measured on the H200 against the stock bfloat16 `norm(x @ w + b)` (what a user
# writes without jaxnorm, and about what the xla path costs when h is not
# returned), CUPTI, K = 4096, 2026-11-30 (docs/mosaic-notes.md, dispatch):
# RMSNorm took 0.79-0.93x its time at M = 4096-8192 with N <= 2048 and 0.88-0.96x
# at N = 4096 (with a residual 0.89-0.93x); LayerNorm with a residual 0.88-0.94x at
# M = 8192, N = 1024-4096 (two calls). LayerNorm without a residual, or with fewer
# rows, is not measured. Automatic dispatch takes the kernel only where it measured
# faster; impl="mosaic" forces it elsewhere.
_POST_NORM_MIN_ROWS, _POST_NORM_MIN_K, _POST_NORM_MAX_N = 2048, 4096, 4096
_POST_LAYER_NORM_MIN_ROWS, _POST_LAYER_NORM_MIN_N = 8192, 1024


def _post_norm_not_faster(kind: str, x: Array, kernel: Array, residual: Array | None,
                          residual_after: bool = False) -> str | None:
    (m, k), n = x.shape, kernel.shape[1]
    if m <= decode_matmul.MAX_ROWS:  # the decode GEMM, then XLA's norm: as fast as its GEMM
        return decode_not_faster(x, (kernel,))
    if residual_after:
        if kind == "rms":
            # CUPTI, bench/results/2026-12-05-h100 (probes.json, runs at 619ec51).
            return (f"the residual-after form (r + Norm(x @ W + b)) of the post-norm Mosaic "
                    f"kernel measured slower than XLA's dot, norm and add (M={m}, K={k}, N={n}): "
                    f"1.11x and 1.33x at Gemma-3-1B's 4096x1024x1152 and 4096x6912x1152, "
                    f"0.99-1.06x at N = 3584 and 4096 (H100, 2026-12-06; no H200 run yet); "
                    f"impl='mosaic' forces it")
        return (f"the residual-after form (r + LayerNorm(x @ W + b)) of the post-norm Mosaic "
                f"kernel is not yet measured against XLA's dot, norm and add (M={m}, K={k}, "
                f"N={n}); impl='mosaic' forces it")
    measured = k >= _POST_NORM_MIN_K and n <= _POST_NORM_MAX_N
    if kind == "rms" and measured and m >= _POST_NORM_MIN_ROWS:
        return None
    if (kind == "layer" and measured and residual is not None
            and m >= _POST_LAYER_NORM_MIN_ROWS and n >= _POST_LAYER_NORM_MIN_N):
        return None
    return (f"the post-norm Mosaic kernel is not measured faster than a bfloat16 XLA dot + "
            f"norm on the H200 for {'RMSNorm' if kind == 'rms' else 'LayerNorm'} at "
            f"M={m}, K={k}, N={n}{' with a residual' if residual is not None else ''}: it "
            f"was for RMSNorm at M >= {_POST_NORM_MIN_ROWS}, K >= {_POST_NORM_MIN_K}, "
            f"N <= {_POST_NORM_MAX_N} (177.2 vs 191.2 us at 8192x4096x2048, 362.6 vs 379.5 at "
            f"8192x4096x4096) and for LayerNorm with a residual at M >= "
            f"{_POST_LAYER_NORM_MIN_ROWS}, K >= {_POST_NORM_MIN_K}, {_POST_LAYER_NORM_MIN_N} "
            f"<= N <= {_POST_NORM_MAX_N} (199.6 vs 218.5 us at 8192x4096x2048); "
            "impl='mosaic' forces it")


@decline_automatic("dense_rms_norm")
def _decline_post_rms_norm(x: Array, kernel: Array, bias: Array | None, scale: Array | None,
                           residual: Array | None, *, residual_after: bool = False,
                           **kwargs) -> str | None:
    return _post_norm_not_faster("rms", x, kernel, residual, residual_after)


@decline_automatic("dense_layer_norm")
def _decline_post_layer_norm(x: Array, kernel: Array, bias: Array | None, scale: Array | None,
                             norm_bias: Array | None, residual: Array | None, *,
                             residual_after: bool = False, **kwargs) -> str | None:
    return _post_norm_not_faster("layer", x, kernel, residual, residual_after)


# Standalone norms: faster than XLA alone at M >= 2048 (1.04-1.26x less time),
# but 1.56-1.85x XLA's time at M = 16, where one launch of a few microseconds is
# all there is. Rows narrower than 1024 are per-head norms (QK-norm) whose
# consumer XLA fuses with the norm: 8192x16x128 then a RoPE-like rotation took
# 33.6 us with the kernel against 29.3 us in XLA (H200,
# bench/results/2026-12-01-model, training-ops.json).
_FEW_ROWS = 64
_NARROW_ROW = 1024


@decline_automatic("rms_norm", "layer_norm")
def _decline_few_rows(x: Array, *args, **kwargs) -> str | None:
    m, k = x.shape
    if m <= _FEW_ROWS:
        return (f"M={m} rows: the norm kernel measured 1.56-1.85x XLA's time at M=16 "
                "on the H200; impl='mosaic' forces it")
    if k < _NARROW_ROW:
        return (f"K={k} < {_NARROW_ROW}: XLA fuses a narrow norm (QK-norm) into its "
                "consumer, which the kernel measured slower than (1.15x); "
                "impl='mosaic' forces it")
    return None
