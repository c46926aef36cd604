"""The GEMM core's epilogue: y = scale * acc - shift * c + b (+ residual), row statistics of y.

Runs in each MMA warpgroup after its K-loop (`pallas_kernels.gemm_kernel`), on the
float32 accumulator, in (epi_m x epi_n) pieces staged through SMEM and stored by TMA.

Row statistics are per-row partial (sum, M2) of the float32 y over the warpgroup's
tile_n columns, M2 the sum of squared deviations about the partial's own mean:
two-pass in registers per piece, pieces combined by Chan's formula (static counts).
A bare sum of squares would lose a LayerNorm row's variance to cancellation when
|mean| >> std; M2 keeps it (docs/design.md, statistics from the producer).

The residual (an [M, N] array of the output's dtype) arrives by TMA into staging slots
per warpgroup that also stage y (`ResidualPieces`): one per piece where SMEM holds them,
else a three-slot ring.
"""

from __future__ import annotations

import jax
import jax.experimental.pallas as pl
import jax.experimental.pallas.mosaic_gpu as plgpu
import jax.numpy as jnp
from jax import lax

from pallas_kernels.gemm_config import TuningConfig

Array = jax.Array


class ResidualPieces:
    """The residual's epilogue pieces of one warpgroup tile, TMA-loaded into `slots`
    staging slots (`gemm_config.residual_slots`).

    Piece p (row-major over the tile's epi_m x epi_n pieces) lands in slot p % slots,
    where its y is written and stored from. With a slot per piece every piece is loaded
    before the K-loop and lands behind it. In a ring (slots < pieces) the first
    slots - 1 are; piece p + slots - 1 is loaded once the store of piece p - 1 (its slot)
    has read the slot, and lands behind the pieces in between.
    """

    def __init__(self, gmem, ring, ready, wg_idx, config: TuningConfig, *, slots: int, row0,
                 col0):
        self.gmem, self.ring, self.ready, self.wg_idx = gmem, ring, ready, wg_idx
        self.config, self.slots, self.row0, self.col0 = config, slots, row0, col0
        self.n_pieces = config.tile_n // config.epi_tile_n
        self.pieces = config.tile_m // config.epi_tile_m * self.n_pieces
        # Pieces loaded ahead of the one being computed.
        self.ahead = self.pieces if slots >= self.pieces else slots - 1

    def _barrier(self, slot: int):
        return self.ready.at[self.wg_idx * self.slots + slot]

    def load(self, p: int) -> None:
        epi_m, epi_n = self.config.epi_tile_m, self.config.epi_tile_n
        mi, ni = divmod(p, self.n_pieces)
        rows, cols = pl.ds(self.row0 + mi * epi_m, epi_m), pl.ds(self.col0 + ni * epi_n, epi_n)
        plgpu.copy_gmem_to_smem(
            self.gmem.at[rows, cols],
            self.ring.at[p % self.slots],
            self._barrier(p % self.slots),
        )

    def prefetch(self) -> None:
        # The previous tile's stores (and its row statistics) must be done reading the slots.
        plgpu.wait_smem_to_gmem(0, wait_read_only=True)
        for p in range(self.ahead):
            self.load(p)

    def add_to(self, y: Array, p: int) -> Array:
        plgpu.barrier_wait(self._barrier(p % self.slots))
        r = plgpu.load(self.ring.at[p % self.slots], layout=plgpu.Layout.WGMMA)
        return y + r.astype(jnp.float32)

    def after_store(self, p: int) -> None:
        if p + self.ahead < self.pieces:
            # In the ring, slot (p + slots - 1) % slots last held piece p - 1: its store
            # must have read it.
            plgpu.wait_smem_to_gmem(1, wait_read_only=True)
            self.load(p + self.ahead)


def piece_stats(y: Array) -> tuple[Array, Array]:
    """(sum, M2) per row of one float32 piece, two-pass: M2 about the piece's own mean."""
    row_sum = jnp.sum(y, axis=1)
    d = y - lax.broadcast_in_dim(row_sum * (1.0 / y.shape[1]), y.shape, [0])
    return row_sum, jnp.sum(d * d, axis=1)


def chan_combine(a: tuple[Array, Array], b: tuple[Array, Array], n_a: int, n_b: int):
    """Chan's combine of the (sum, M2) of n_a and n_b columns (static counts)."""
    delta = b[0] * (1.0 / n_b) - a[0] * (1.0 / n_a)
    return a[0] + b[0], a[1] + b[1] + delta * delta * (n_a * n_b / (n_a + n_b))


def epilogue(
    acc: Array,
    *,
    wg_idx,
    out_smem,
    store,
    vectors: dict,
    row_stats,
    residual: ResidualPieces | None,
    config: TuningConfig,
    out_dtype,
    ragged: bool = False,
) -> None:
    """y = scale * acc - shift * c + b (+ residual) on one warpgroup's tile, stored in
    (epi_m x epi_n) pieces.

    `vectors` maps row_scale/row_shift ([tile_m]) and col_sums/col_bias
    ([tile_n]) to SMEM refs; `row_stats` is (SMEM [2, tile_m], GMEM
    destinations) for the per-row (sum, M2) of the float32 y over the tile's
    columns: two-pass per piece, Chan-combined across pieces (docs/design.md).
    `ragged`: some pieces lie wholly past N and `store` skips them, so a slot's previous
    store is not the one before last: every piece waits for all stores.
    """
    tile_m, tile_n = config.tile_m, config.tile_n
    epi_m, epi_n = config.epi_tile_m, config.epi_tile_n
    row_layout = plgpu.Layout.WGMMA.reduce(1)
    col_layout = plgpu.Layout.WGMMA.reduce(0)
    n_pieces = tile_n // epi_n
    slots = residual.slots if residual is not None else 2
    if residual is None:
        # Drain any store still reading out_smem (or the row statistics) from the previous
        # tile (with a residual, its prefetch did).
        plgpu.wait_smem_to_gmem(0, wait_read_only=True)
    for mi in range(tile_m // epi_m):
        rows = slice(mi * epi_m, (mi + 1) * epi_m)

        def row_vector(name):
            ref = vectors.get(name)
            return None if ref is None else plgpu.load(ref.at[rows], layout=row_layout)

        scale, shift = row_vector("row_scale"), row_vector("row_shift")
        stats = None
        for ni in range(n_pieces):
            p = mi * n_pieces + ni
            cols = slice(ni * epi_n, (ni + 1) * epi_n)
            y = acc[rows, cols]
            if scale is not None:
                y = y * lax.broadcast_in_dim(scale, y.shape, [0])
            if shift is not None:
                c = plgpu.load(vectors["col_sums"].at[cols], layout=col_layout)
                y = y - (lax.broadcast_in_dim(shift, y.shape, [0])
                         * lax.broadcast_in_dim(c, y.shape, [1]))
            if "col_bias" in vectors:
                b = plgpu.load(vectors["col_bias"].at[cols], layout=col_layout)
                y = y + lax.broadcast_in_dim(b, y.shape, [1])
            if residual is not None:
                y = residual.add_to(y, p)
            if row_stats is not None:
                piece = piece_stats(y)
                stats = piece if stats is None else chan_combine(stats, piece, ni * epi_n, epi_n)
            slot = p % slots
            if residual is None:
                # The store issued two pieces ago read this slot; wait until it has.
                plgpu.wait_smem_to_gmem(0 if ragged else 1, wait_read_only=True)
            out_smem[wg_idx, slot] = y.astype(out_dtype)
            # Make the generic-proxy SMEM writes visible to the TMA engine.
            plgpu.commit_smem()
            store(out_smem.at[wg_idx, slot], mi * epi_m, ni * epi_n)
            if residual is not None:
                residual.after_store(p)
        if row_stats is not None:
            row_stats[0].at[0, rows][...] = stats[0]
            row_stats[0].at[1, rows][...] = stats[1]
    if row_stats is not None:
        plgpu.commit_smem()
        for j in range(2):
            plgpu.copy_smem_to_gmem(row_stats[0].at[j], row_stats[1][j])
