"""Per-row statistics handed from the GEMM that writes a row to the norm that reads it.

`RowStats` carries, per row of h (length `length`), the float32 mean and M2, the
sum of squared deviations about that mean. Both norms follow from it without
reading h again (docs/design.md, "Statistics from the producer"):

    RMSNorm:   r = rsqrt(mean(h^2) + eps) = rsqrt(m2 / K + mean^2 + eps)
    LayerNorm: mu = mean,  s = rsqrt(m2 / K + eps)

(mean, M2) rather than (sum, sum of squares): the variance of a row with
|mean| >> std is a difference of two nearly equal sums of squares and loses its
digits in float32, while M2 is a sum of small, already-centred squares. Partials
of column blocks combine by Chan's formula (`from_partials`), which only ever
subtracts nearby means.

The xla path's statistics (`of_rows`) also carry `mean_square`, mean(h^2): the one
reduction RMSNorm needs, a sibling of the mean's. Under jit a reader that only
scales rows (RMSNorm) keeps that one reduction and XLA drops the two-pass M2, so the
xla producer costs what stock's norm costs; LayerNorm's readers use (mean, M2).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxnorm.statistics import rsqrt_plus_eps

Array = jax.Array
F32 = jnp.float32


class RowStats(NamedTuple):
    """float32 per-row `mean` and `m2` (shape: the rows' leading dims) of rows of `length`,
    and optionally their `mean_square` (RMSNorm's statistic, where the producer had it).

    A pytree whose leaves are `mean`, `m2` and `mean_square` (None: none);
    `length` is static (tree metadata).
    """

    mean: Array
    m2: Array
    length: int
    mean_square: Array | None = None


jax.tree_util.register_pytree_node(
    RowStats,
    lambda s: ((s.mean, s.m2, s.mean_square), s.length),
    lambda length, leaves: RowStats(leaves[0], leaves[1], length, leaves[2]),
)


def of_rows(h: Array) -> RowStats:
    """float32 statistics of the rows of h (what the xla path computes): the two-pass
    (mean, M2), and mean(h^2) in the mean's pass, which is all an RMSNorm reader keeps."""
    h32 = h.astype(F32)
    mean = jnp.mean(h32, axis=-1)
    m2 = jnp.sum(jnp.square(h32 - mean[..., None]), axis=-1)
    return RowStats(mean, m2, h.shape[-1], jnp.mean(jnp.square(h32), axis=-1))


def of_split_rows(h32: Array, axis_name: tuple) -> RowStats:
    """Two-pass float32 statistics of rows whose columns are split over `axis_name` (inside
    `jax.shard_map`): the row sum, then the squared deviations about the whole row's mean,
    each psum-ed; h32 is this shard's columns."""
    n = h32.shape[-1] * jax.lax.psum(1, axis_name)
    mean = jax.lax.psum(jnp.sum(h32, axis=-1), axis_name) / n
    m2 = jax.lax.psum(jnp.sum(jnp.square(h32 - mean[..., None]), axis=-1), axis_name)
    mean_square = jax.lax.psum(jnp.sum(jnp.square(h32), axis=-1), axis_name) / n
    return RowStats(mean, m2, n, mean_square)


def output_cotangent(h: Array, mean: Array, dh: Array, d_mean: Array, d_m2: Array) -> Array:
    """float32 cotangent of h when h's RowStats are outputs too: with mean = sum(h) / N and
    M2 = sum((h - mean)^2), dH = dh + d_mean / N + 2 d_m2 (h - mean)."""
    centred = h.astype(F32) - mean[..., None]
    return dh.astype(F32) + d_mean[..., None] / h.shape[-1] + 2.0 * d_m2[..., None] * centred


def from_partials(sums: Array, m2s: Array, counts: int | Sequence[int]) -> tuple[Array, Array]:
    """(mean, M2) per row from P column blocks' partial (sum, M2) [P, M].

    `counts`: the columns of each block (static; one int when all are equal; blocks of
    0 columns, wholly past the row's end, are left out). Chan et al.'s combine: with
    block means a_p = sum_p / n_p, mean = sum_p sum_p / K and
    M2 = sum_p M2_p + sum_p n_p (a_p - mean)^2, a sum of squares of differences of
    nearby means: no cancellation.
    """
    counts = (counts,) * sums.shape[0] if isinstance(counts, int) else tuple(counts)
    if len(counts) != sums.shape[0]:
        raise ValueError(f"{len(counts)} counts for {sums.shape[0]} partials")
    sums, m2s = sums.astype(F32), m2s.astype(F32)
    # Python scalars only: no array constant enters the trace (custom_partitioning, which
    # runs the Mosaic backends per device, refuses closed-over constants).
    if len(set(counts)) == 1 and counts[0] > 0:
        n = float(counts[0])
        mean = jnp.sum(sums, axis=0) / (n * len(counts))
        return mean, jnp.sum(m2s, axis=0) + n * jnp.sum(jnp.square(sums / n - mean), axis=0)
    kept = [(p, float(c)) for p, c in enumerate(counts) if c > 0]
    mean = sum(sums[p] for p, _ in kept) / sum(c for _, c in kept)
    spread = sum(c * jnp.square(sums[p] / c - mean) for p, c in kept)
    return mean, sum(m2s[p] for p, _ in kept) + spread


def rms_inverse(stats: RowStats, eps: float) -> Array:
    """r = rsqrt(mean_square + eps), or without it rsqrt(m2 / K + mean^2 + eps), per row,
    float32."""
    if stats.mean_square is not None:
        return rsqrt_plus_eps(stats.mean_square.astype(F32), eps)
    mean = stats.mean.astype(F32)
    return rsqrt_plus_eps(stats.m2.astype(F32) / stats.length + mean * mean, eps)


def inverse_std(stats: RowStats, eps: float) -> Array:
    """s = rsqrt(m2 / K + eps) per row, float32 (LayerNorm's scale; its shift is the mean)."""
    return rsqrt_plus_eps(stats.m2.astype(F32) / stats.length, eps)


def check(name: str, stats: object, x_shape: tuple[int, ...], x_name: str = "x") -> RowStats:
    """`stats` as RowStats of rows shaped like x's ([..., K]); ValueError naming both shapes."""
    if not isinstance(stats, RowStats):
        raise TypeError(f"{name} must be jaxnorm.RowStats (as residual_dense returns); got "
                        f"{type(stats).__name__}")
    lead, k = tuple(x_shape[:-1]), x_shape[-1]
    fields = ("mean", "m2") if stats.mean_square is None else ("mean", "m2", "mean_square")
    for field in fields:
        value = getattr(stats, field)
        if not jnp.issubdtype(jnp.result_type(value), jnp.floating):
            raise ValueError(f"{name}.{field} must be floating point; got "
                             f"{jnp.result_type(value)}")
        if tuple(jnp.shape(value)) != lead:
            raise ValueError(
                f"{name}.{field} has shape {tuple(jnp.shape(value))} but {x_name} has shape "
                f"{tuple(x_shape)}: the statistics must have {x_name}'s leading shape {lead}")
    if stats.length != k:
        raise ValueError(f"{name}.length is {stats.length} but {x_name} has shape "
                         f"{tuple(x_shape)}: rows of length K={k}")
    mean_square = None if stats.mean_square is None else jnp.asarray(stats.mean_square, F32)
    return RowStats(jnp.asarray(stats.mean, F32), jnp.asarray(stats.m2, F32), k, mean_square)


def reshaped(stats: RowStats, lead: tuple[int, ...]) -> RowStats:
    """The statistics with their rows arranged as `lead` (x's leading dims, or (-1,))."""
    mean_square = None if stats.mean_square is None else stats.mean_square.reshape(lead)
    return RowStats(stats.mean.reshape(lead), stats.m2.reshape(lead), stats.length, mean_square)


def flat_rows(stats: RowStats) -> RowStats:
    """The statistics of the rows of x flattened to [M, K] (as the ops hand x on)."""
    return reshaped(stats, (-1,))
