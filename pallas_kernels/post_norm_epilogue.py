"""The post-norm GEMM's epilogue, one MMA warpgroup's tile after its K-loop, top to bottom.

    h = acc + bias (+ residual)            `pre_norm_sum`
    partials of h's rows                   `row_partials`    -> published to the peers
    store h (if asked for)                 `store_tile`      while the peers' partials arrive
    combine every party's partials         `row_statistics`
    y = Norm(h) * scale (+ norm_bias)      `normalize`
    (y += residual, with residual_after)   `add_residual_after`
    store y                                `store_tile`
    (y's row partials, if asked for)       `store_row_stats`

With `residual_after` (Gemma 2/3's and OLMo 2's r + Norm(a @ W_o)) the residual tile
arrives as it does before the norm (staged by TMA, or in registers) but is added to y
after the gain, in float32, instead of to h.

`epilogue` runs them in that order. Everything is float32 in the WGMMA layout until
the stores cast to the output dtype. 256-wide warpgroup tiles take the epilogue's
vectors 64 columns at a time (`by_columns`): whole vectors would hold 64 registers
per thread each next to the 128 accumulators.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.experimental.pallas as pl
import jax.experimental.pallas.mosaic_gpu as plgpu
import jax.numpy as jnp
from jax import lax

from pallas_kernels.gemm_epilogue import chan_combine, piece_stats
from pallas_kernels.post_norm_config import PIECE, PIECE_SLOTS, PostNormConfig
from pallas_kernels.row_stats import (Kind, RowStatsExchange, Site, combine_layer,
                                      combine_layer_matrix, combine_rms, combine_rms_matrix)

LAYOUT = plgpu.Layout.WGMMA
COL_LAYOUT, ROW_LAYOUT = LAYOUT.reduce(0), LAYOUT.reduce(1)
# vector(name, first, width): columns [first, first + width) of an epilogue vector.
Vector = Callable[[str, int, int], jax.Array]


class EpilogueRefs(NamedTuple):
    """What every warpgroup's epilogue reads and writes besides its own tile."""

    kind: Kind
    eps: float
    config: PostNormConfig
    exchange: RowStatsExchange
    has_bias: bool
    has_scale: bool
    has_norm_bias: bool
    has_residual: bool
    residual_after: bool  # the residual is added to y after the norm, not to h
    whole_tiles: bool  # h and y leave through one staged tile (else 64 x 64 pieces)
    dtype: Any
    vec_names: list[str]  # epilogue vectors present, in `vec_smem` order
    vec_smem: list[Any]
    vec_copies: int
    vec_barrier: Any
    io_barrier: Any
    ex_scratch: Any
    stats_gmem: Any
    h_gmem: Any
    y_gmem: Any
    y_stats_gmem: Any  # (sums, M2s) [N / tile_n, M] float32 outputs of y's rows, or None
    semaphores: Any

    @property
    def chunk(self) -> int:
        """Columns of the epilogue's arithmetic at a time (see the module docstring)."""
        tile_n = self.config.tile_n
        return tile_n if tile_n <= 128 else PIECE


def bcast(v: jax.Array, shape: tuple[int, int], dim: int) -> jax.Array:
    return plgpu.layout_cast(lax.broadcast_in_dim(v, shape, [dim]), LAYOUT)


def by_columns(e: EpilogueRefs, fn: Callable[[jax.Array, int], jax.Array],
               value: jax.Array) -> jax.Array:
    """fn(columns [c, c + chunk) of value, c) for each chunk, side by side."""
    parts = [fn(value[:, c:c + e.chunk], c) for c in range(0, e.config.tile_n, e.chunk)]
    return parts[0] if len(parts) == 1 else jnp.concatenate(parts, axis=1)


def vector_loader(e: EpilogueRefs, wg: jax.Array, rounds: jax.Array) -> Vector:
    """The epilogue vectors of warpgroup `wg`, loaded from shared memory where used; the
    first round waits for their copy."""
    copy = 0 if e.vec_copies == 1 else wg
    if e.vec_names:
        pl.when(rounds == 0)(lambda: plgpu.barrier_wait(e.vec_barrier.at[copy]))
    smem = {name: ref.at[copy] for name, ref in zip(e.vec_names, e.vec_smem)}

    def vector(name: str, first: int, width: int) -> jax.Array:
        return plgpu.load(smem[name].at[pl.ds(first, width)],
                          layout=COL_LAYOUT).astype(jnp.float32)

    return vector


def _residual_tile(e: EpilogueRefs, io: Any, residual: jax.Array | None) -> jax.Array:
    """The warpgroup's residual tile: already in registers, or waited for in `io`."""
    if residual is not None:
        return residual
    plgpu.barrier_wait(e.io_barrier.at[lax.axis_index("wg")])
    return plgpu.load(io, layout=LAYOUT)


def pre_norm_sum(e: EpilogueRefs, acc: jax.Array, vector: Vector, io: Any,
                 residual: jax.Array | None) -> jax.Array:
    """acc + bias (+ the residual: in registers, or staged in `io`), float32."""
    h = acc
    if e.has_bias:
        h = by_columns(e, lambda part, c: part + bcast(vector("bias", c, e.chunk),
                                                       part.shape, 1), h)
    if e.has_residual and not e.residual_after:
        h = h + _residual_tile(e, io, residual).astype(jnp.float32)
    return h


def add_residual_after(e: EpilogueRefs, y: jax.Array, io: Any,
                       residual: jax.Array | None) -> jax.Array:
    """y + the residual (float32) with `residual_after`; h was not stored, so a staged
    residual is still in `io`."""
    if not (e.has_residual and e.residual_after):
        return y
    return y + _residual_tile(e, io, residual).astype(jnp.float32)


def row_partials(e: EpilogueRefs, h: jax.Array) -> list[jax.Array]:
    """This warpgroup's partials of h's rows: a sum of squares, or (shift, mean, M2)."""
    if e.kind == "rms":
        return [jnp.sum(h * h, axis=1)]
    # Shift by the warpgroup's own mean, then the corrected two-pass sum (Chan, Golub &
    # LeVeque): exact enough that Chan's combine of the partials keeps float32
    # precision, one operation an element fewer than centring twice.
    inv_count = 1.0 / e.config.tile_n
    shift = jnp.sum(h, axis=1) * inv_count
    d = h - bcast(shift, h.shape, 0)
    sum_d = jnp.sum(d, axis=1)
    mean_d = sum_d * inv_count
    return [shift, mean_d, jnp.sum(d * d, axis=1) - sum_d * mean_d]


def row_statistics(e: EpilogueRefs, gathered: Any) -> tuple[jax.Array, ...]:
    """The block's (row scale,) for RMSNorm or (shift, mean, 1/std) for LayerNorm, per row,
    from every party's partials."""
    exchange, tile_n = e.exchange, e.config.tile_n
    row_count = e.config.cluster_n * e.config.cta_n
    if exchange.loads_as_matrix:
        stats = [exchange.load_partials_matrix(gathered, j) for j in range(exchange.num_stats)]
        if e.kind == "rms":
            return (combine_rms_matrix(stats[0], row_count, e.eps),)
        along_rows = lambda v: bcast(v, stats[0].shape, 0)  # noqa: E731
        return combine_layer_matrix(*stats, tile_n, e.eps, along_rows)

    def partial(p: int, j: int) -> jax.Array:
        return exchange.load_partial(gathered, e.config.tile_m, ROW_LAYOUT, p, j)

    if e.kind == "rms":
        return (combine_rms(partial, exchange.num_partials, row_count, e.eps),)
    return combine_layer(partial, exchange.num_partials, tile_n, e.eps)


def normalize(e: EpilogueRefs, h: jax.Array, gathered: Any, vector: Vector) -> jax.Array:
    """Norm of the block's rows from the gathered partials, then gain and bias."""
    stats = row_statistics(e, gathered)

    def normalize_columns(part: jax.Array, c: int) -> jax.Array:
        along = lambda v: bcast(v, part.shape, 0)  # noqa: E731
        if e.kind == "rms":
            y = part * along(stats[0])
        else:
            shift0, mu, inv = stats
            y = ((part - along(shift0)) - along(mu)) * along(inv)
        if e.has_scale:
            y = y * bcast(vector("scale", c, e.chunk), part.shape, 1)
        if e.has_norm_bias:
            y = y + bcast(vector("norm_bias", c, e.chunk), part.shape, 1)
        return y

    return by_columns(e, normalize_columns, h)


def _store_staged(io: Any, out_gmem: Any, rows: pl.Slice, cols: pl.Slice) -> None:
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(io, out_gmem.at[rows, cols])


def store_tile(e: EpilogueRefs, value: jax.Array, io: Any, out_gmem: Any, rows: pl.Slice,
               cols: pl.Slice, first_piece: int = 0) -> int:
    """Write a warpgroup's [tile_m, tile_n] float32 `value` to out_gmem[rows, cols] through
    `io`: whole, or piece by piece through its slots (numbering from `first_piece`, as
    the plain GEMM's epilogue). Returns the next piece."""
    if e.whole_tiles:
        # The previous store from the staging tile must be done reading it.
        plgpu.wait_smem_to_gmem(0, wait_read_only=True)
        io[...] = value.astype(e.dtype)
        _store_staged(io, out_gmem, rows, cols)
        return first_piece
    if first_piece == 0:  # the previous block's last pieces must have been read
        plgpu.wait_smem_to_gmem(0, wait_read_only=True)
    piece = first_piece
    for r in range(0, e.config.tile_m, PIECE):
        for c in range(0, e.config.tile_n, PIECE):
            slot = io.at[piece % PIECE_SLOTS]
            # The store issued PIECE_SLOTS pieces ago read this slot; wait until it has.
            plgpu.wait_smem_to_gmem(PIECE_SLOTS - 1, wait_read_only=True)
            slot[...] = value[r:r + PIECE, c:c + PIECE].astype(e.dtype)
            _store_staged(slot, out_gmem, pl.ds(rows.start + r, PIECE),
                          pl.ds(cols.start + c, PIECE))
            piece += 1
    return piece


def store_row_stats(e: EpilogueRefs, y: jax.Array, part: jax.Array | int,
                    rows: pl.Slice) -> None:
    """The warpgroup's partial (sum, M2) of the float32 y's rows over its tile_n columns, into
    slot `part` of the [N / tile_n, M] outputs: two-pass per 64 columns, Chan-combined
    (the residual GEMM's epilogue math, `gemm_epilogue`)."""
    stats = None
    for c in range(0, e.config.tile_n, PIECE):
        piece = piece_stats(y[:, c:c + PIECE])
        stats = piece if stats is None else chan_combine(stats, piece, c, PIECE)
    for out, value in zip(e.y_stats_gmem, stats):
        out[part, rows] = value


def epilogue(e: EpilogueRefs, acc: jax.Array, wg: jax.Array, cols: pl.Slice, io: Any,
             m_idx: jax.Array, rows: pl.Slice, rounds: jax.Array,
             residual: jax.Array | None, part: jax.Array | int | None) -> None:
    """Publish this block's partials, store h while the peers' arrive, collect them and
    normalize; then store y (and its rows' partials, in `part`, while the store drains)."""
    vector = vector_loader(e, wg, rounds)
    h = pre_norm_sum(e, acc, vector, io, residual)
    site = Site(party=wg, cluster_id=m_idx, round_index=rounds, semaphores=e.semaphores,
                group=lax.axis_index("m"))
    e.exchange.publish(row_partials(e, h), e.ex_scratch, e.stats_gmem, site)
    piece = 0
    if e.h_gmem is not None:
        piece = store_tile(e, h, io, e.h_gmem, rows, cols)
    gathered = e.exchange.collect(e.ex_scratch, e.stats_gmem, site)
    y = add_residual_after(e, normalize(e, h, gathered, vector), io, residual)
    e.exchange.release(e.ex_scratch)
    store_tile(e, y, io, e.y_gmem, rows, cols, piece)
    if e.y_stats_gmem is not None:
        store_row_stats(e, y, part, rows)
