"""Lazy pre-norm GEMM on Hopper: Norm(X) @ W + b with Norm(X) never in memory.

    RMSNorm:   RMSNorm(X; g) @ W + b = diag(r) (X @ W*) + b,            W* = diag(g + offset) W
    LayerNorm: LayerNorm(X; g, beta) @ W + b
                 = diag(s) (X @ W*) - (s * mu) c^T + (beta @ W + b),    c = 1^T W*

r = rsqrt(mean(x^2) + eps), mu = mean(x), s = rsqrt(var(x) + eps), float32.
The GEMM runs on X itself; the row scale (and the column-sum correction) is
applied to the float32 accumulator in the epilogue, which writes x.dtype.

The row statistics come from outside the GEMM: one float32 row reduction in
XLA (`rms_row_scale` / `layer_norm_row_vectors`), which fuses into whatever
produced x; callers that have them pass them in. On the H200 the epilogue row
scale cost nothing over our plain GEMM and the statistics pass one read of x; a
statistics warpgroup inside the GEMM measured slower and was removed
(docs/mosaic-notes.md, removed variants).

The gain when it is not folded (training, g learns): scaling whichever operand
is smaller costs least. For M <= 2 * sum(N) x is scaled in the same XLA pass
that reads x for the statistics (its write is the only extra traffic;
measured +1-3% over the folded case); otherwise each weight is scaled once
per call (W* = diag(g) W, 2 K N bytes against 2 M K N flops).

LayerNorm's mean correction needs c = 1^T W* and beta @ W: one float32 pass
over the weights per call unless `col_sums` is passed (folded inference:
compute it once with `jaxnorm.fold.column_sums`). When that pass costs more
than normalizing x outright (`prenormalize_is_cheaper`: small M), or when
`prenormalize=True`, the kernel is fed the normalized x (XLA norm, then our
GEMM). Cancellation: the epilogue subtracts (s mu) c from s (X @ W*), and
X @ W* carries float32 accumulation error that grows with |mu| / std; measured
within verify's tolerance up to |mu|/std = 3000 (docs/mosaic-notes.md). Rows whose
bf16 values are all but constant (var ~ 0, s ~ 1/sqrt(eps)) amplify that error by
s: `prenormalize=True` (the normalized x is centred) is the guard.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import jax.experimental.pallas as pl
import jax.numpy as jnp

from pallas_kernels import gemm_kernel
from pallas_kernels.gemm_config import (
    Epilogue,
    MatmulDimension,
    TuningConfig,
    check_shapes,
    default_config,
)
from pallas_kernels.errors import Unsupported
from pallas_kernels.row_stats import safe_rsqrt

__all__ = [
    "MatmulDimension",
    "TuningConfig",
    "Unsupported",
    "default_config",
    "layer_norm_row_vectors",
    "lazy_layer_norm_matmul",
    "lazy_rms_matmul",
    "rms_row_scale",
]

Array = jax.Array
# With return_row_stats: per weight, (row_sum, row_sumsq) partials [P_i, M] of y.
RowStats = tuple[tuple[Array, Array], ...]


def rms_row_scale(x: Array, eps: float) -> Array:
    """r = rsqrt(mean(x^2) + eps) per row, float32 [M]."""
    x32 = x.astype(jnp.float32)
    return safe_rsqrt(jnp.mean(x32 * x32, axis=-1) + eps)


def _mean_and_inverse_std(x: Array, eps: float) -> tuple[Array, Array]:
    """(mu, s) per row, float32 [M], from shifted one-pass statistics.

    Each row is offset by the mean of its first 64 elements (an early estimate
    of the mean) before its sum and sum of
    squares are taken, so the variance does not cancel when |mu| >> std.
    """
    x32 = x.astype(jnp.float32)
    shift = jnp.mean(x32[:, :64], axis=-1)
    d = x32 - shift[:, None]
    # One pass (sum and sum of squares of the shifted values, one read of x):
    # with the shift near the mean, E[d^2] - E[d]^2 keeps its digits.
    mean_d = jnp.mean(d, axis=-1)
    var = jnp.maximum(jnp.mean(d * d, axis=-1) - mean_d * mean_d, 0.0)
    return shift + mean_d, safe_rsqrt(var + eps)


def layer_norm_row_vectors(x: Array, eps: float) -> tuple[Array, Array]:
    """(s, s * mu) per row, float32 [M]: the epilogue's row scale and row shift."""
    mu, s = _mean_and_inverse_std(x, eps)
    return s, s * mu


def _gain(scale: Array | None, scale_offset: float) -> Array | None:
    return None if scale is None else scale.astype(jnp.float32) + scale_offset


def _scale_weights(weights: Sequence[Array], gain: Array) -> tuple[Array, ...]:
    return tuple((gain[:, None] * w.astype(jnp.float32)).astype(w.dtype) for w in weights)


def _columns(vectors: Sequence[Array | None], ns: Sequence[int]) -> list[Array]:
    """One float32 vector per weight (zeros where a weight has none)."""
    return [jnp.zeros((n,), jnp.float32) if v is None else v.astype(jnp.float32)
            for v, n in zip(vectors, ns)]


def _resolve_config(
    x: Array, weights: Sequence[Array], config: TuningConfig | None
) -> TuningConfig:
    ns = [w.shape[1] for w in weights]
    if config is None:
        config = default_config(x.shape[0], x.shape[1], ns)
    check_shapes(x, weights, config)
    return config


def _run(
    x: Array,
    weights: Sequence[Array],
    *,
    config: TuningConfig,
    epilogue: Epilogue,
    row_scale: Array | None,
    row_shift: Array | None,
    col_sums: Sequence[Array | None] | None,
    biases: Sequence[Array | None],
    return_row_stats: bool,
    interpret: bool,
    column_gain: Array | None = None,
) -> tuple[Array, ...] | tuple[tuple[Array, ...], RowStats]:
    """Run the GEMM core; the epilogue gains the bias columns and row statistics out
    that `biases` and `return_row_stats` ask for, the mainloop the column gain."""
    epilogue = dataclasses.replace(
        epilogue, col_bias=any(b is not None for b in biases), row_stats_out=return_row_stats,
        column_gain=column_gain is not None,
    )
    m = x.shape[0]
    ns = [w.shape[1] for w in weights]
    vectors = [] if column_gain is None else [column_gain.astype(x.dtype)]
    vectors += [v for v in (row_scale, row_shift) if v is not None]
    if epilogue.col_sums:
        vectors += _columns(col_sums, ns)
    if epilogue.col_bias:
        vectors += _columns(biases, ns)
    results = gemm_kernel.run(
        x, weights, vectors, config=config, epilogue=epilogue, interpret=interpret
    )
    outs = tuple(results[: len(weights)])
    if not return_row_stats:
        return outs
    row_sum, row_sumsq = results[len(weights):]
    per_tile = config.cta_tile_n // config.tile_n
    stats, start = [], 0
    for n in ns:
        parts = pl.cdiv(n, config.cta_tile_n) * per_tile
        stats.append((row_sum[start : start + parts, :m], row_sumsq[start : start + parts, :m]))
        start += parts
    return outs, tuple(stats)


def lazy_rms_matmul(
    x: Array,
    weights: Sequence[Array],
    *,
    eps: float = 1e-6,
    scale: Array | None = None,
    scale_offset: float = 0.0,
    biases: Sequence[Array | None] | None = None,
    row_scale: Array | None = None,
    config: TuningConfig | None = None,
    return_row_stats: bool = False,
    gain_in_kernel: bool = False,
    interpret: bool = False,
) -> tuple[Array, ...] | tuple[tuple[Array, ...], RowStats]:
    """RMSNorm(x; scale) @ W_i + b_i for every weight, in one launch; outputs in x.dtype.

    x: [M, K] bf16/f16; weights: [K, N_i] of x's dtype (folded W* when
    scale is None). `row_scale` ([M] float32 r) skips the statistics pass.
    With `return_row_stats`, also returns per weight (row_sum, row_sumsq) of y,
    [P_i, M] float32 partials over column blocks (sum over P_i for the row).
    `gain_in_kernel`: a gain (scale + scale_offset, rounded to x's dtype) multiplies each x
    tile in the GEMM's mainloop instead of x or the weights in an XLA pass
    (`Epilogue.column_gain`; not with a 2-CTA cluster or a wgmma step in flight).
    """
    weights = tuple(weights)
    biases = tuple(biases) if biases is not None else (None,) * len(weights)
    config = _resolve_config(x, weights, config)
    # The gain scales each x tile in the mainloop, or x or the weights in an XLA pass.
    column_gain = _gain(scale, scale_offset) if gain_in_kernel else None
    gain = None if gain_in_kernel else _gain(scale, scale_offset)
    if gain is not None and x.shape[0] <= 2 * sum(w.shape[1] for w in weights):
        # One pass over x yields both the statistic and the scaled operand.
        if row_scale is None:
            row_scale = rms_row_scale(x, eps)
        x = (x.astype(jnp.float32) * gain).astype(x.dtype)
    elif gain is not None:
        weights = _scale_weights(weights, gain)
    if row_scale is None:
        row_scale = rms_row_scale(x, eps)
    return _run(
        x,
        weights,
        config=config,
        epilogue=Epilogue(row_scale=True),
        row_scale=row_scale,
        row_shift=None,
        col_sums=None,
        biases=biases,
        return_row_stats=return_row_stats,
        interpret=interpret,
        column_gain=column_gain,
    )


def prenormalize_is_cheaper(
    m: int, ns: Sequence[int], *, has_scale: bool, has_col_sums: bool
) -> bool:
    """Normalizing x in XLA (write + re-read M K) beats the per-call passes over the weights
    (column sums and beta @ W: one read; folding the gain: one more read and write)."""
    weight_passes = (0 if has_col_sums else 1) + (2 if has_scale else 0)
    return 2 * m < weight_passes * sum(ns)


def lazy_layer_norm_matmul(
    x: Array,
    weights: Sequence[Array],
    *,
    eps: float = 1e-6,
    scale: Array | None = None,
    norm_bias: Array | None = None,
    scale_offset: float = 0.0,
    biases: Sequence[Array | None] | None = None,
    col_sums: Sequence[Array] | None = None,
    row_vectors: tuple[Array, Array] | None = None,
    prenormalize: bool | None = None,
    config: TuningConfig | None = None,
    return_row_stats: bool = False,
    interpret: bool = False,
) -> tuple[Array, ...] | tuple[tuple[Array, ...], RowStats]:
    """LayerNorm(x; scale, norm_bias) @ W_i + b_i for every weight, in one launch.

    `col_sums` (float32 c_i = 1^T W*_i of the weights as passed, gain folded)
    and `row_vectors` ((s, s * mu) from `layer_norm_row_vectors`) skip the
    passes that would compute them. `prenormalize`: None = by cost
    (`prenormalize_is_cheaper`), True = feed the kernel the normalized x
    (no cancellation), False = always lazy.
    """
    weights = tuple(weights)
    biases = tuple(biases) if biases is not None else (None,) * len(weights)
    ns = [w.shape[1] for w in weights]
    config = _resolve_config(x, weights, config)
    gain = _gain(scale, scale_offset)
    if col_sums is not None and (gain is not None or len(col_sums) != len(weights)):
        raise ValueError("col_sums are the folded weights': pass scale=None, one per weight")
    if prenormalize is None:
        prenormalize = (
            row_vectors is None
            and prenormalize_is_cheaper(
                x.shape[0], ns, has_scale=gain is not None, has_col_sums=col_sums is not None
            )
        )
    if prenormalize:
        if row_vectors is not None:
            raise ValueError("prenormalize=True computes its own statistics; drop row_vectors")
        mu, s = _mean_and_inverse_std(x, eps)
        normed = (x.astype(jnp.float32) - mu[:, None]) * s[:, None]
        if gain is not None:
            normed = normed * gain
        if norm_bias is not None:
            normed = normed + norm_bias.astype(jnp.float32)
        return _run(
            normed.astype(x.dtype),
            weights,
            config=config,
            epilogue=Epilogue(),
            row_scale=None,
            row_shift=None,
            col_sums=None,
            biases=biases,
            return_row_stats=return_row_stats,
            interpret=interpret,
        )

    folded = _scale_weights(weights, gain) if gain is not None else weights
    if col_sums is None:
        col_sums = [jnp.sum(w.astype(jnp.float32), axis=0) for w in folded]
    if norm_bias is not None:
        beta = norm_bias.astype(jnp.float32)
        biases = tuple(
            jnp.sum(beta[:, None] * w.astype(jnp.float32), axis=0)
            + (0.0 if b is None else b.astype(jnp.float32))
            for w, b in zip(weights, biases)
        )
    row_scale, row_shift = (
        row_vectors if row_vectors is not None else layer_norm_row_vectors(x, eps)
    )
    return _run(
        x,
        folded,
        config=config,
        epilogue=Epilogue(row_scale=True, row_shift=True, col_sums=True),
        row_scale=row_scale,
        row_shift=row_shift,
        col_sums=col_sums,
        biases=biases,
        return_row_stats=return_row_stats,
        interpret=interpret,
    )

