"""The row-norm kernel's tuning knobs, register layout and per-shape selection (`select_config`).

The kernel itself is `pallas_kernels.row_norm`; what the selection's budgets were
measured on is in docs/mosaic-notes.md, row norm.
"""

from __future__ import annotations

import dataclasses

import jax.experimental.pallas.mosaic_gpu as plgpu
import jax.numpy as jnp
from jax.experimental.mosaic.gpu import fragmented_array as mgpu_fa

from pallas_kernels import hardware
from pallas_kernels.errors import Unsupported
from pallas_kernels.row_stats import Transport

# A copy into shared memory moves a multiple of 128 bytes (each of the
# warpgroup's 128 threads arrives for its share of the bytes): rows (or row
# parts) are multiples of 64 elements, so any gain/bias dtype qualifies too.
_ROW_MULTIPLE = 64
_LANES = 32
_WARPS = 4


def _vector_length(dtype: jnp.dtype, vector_bytes: int) -> int:
    """Elements each lane moves per shared-memory access."""
    return max(1, vector_bytes // jnp.dtype(dtype).itemsize)


def _tile_width(dtype: jnp.dtype, warps_per_row: int, vector_bytes: int) -> int:
    return warps_per_row * _LANES * _vector_length(dtype, vector_bytes)


def row_layout(dtype: jnp.dtype, warps_per_row: int, vector_bytes: int = 16) -> plgpu.Layout:
    """Register layout of a [rows, cols] chunk: lanes along a row, warps across rows.

    Each warp reads 32 x vector_bytes contiguous bytes of one row (no bank
    conflicts; 16-byte vectors are the fast path, narrower ones serve rows
    that are not a multiple of 32 x 16 bytes). With warps_per_row = 1 each
    warp owns whole rows, so a row sum needs only warp shuffles; with 2 or 4 a
    row is spread over that many warps (blocks of fewer than 4 rows) and the
    row sum goes through shared memory.
    """
    rows = _WARPS // warps_per_row
    vec = _vector_length(dtype, vector_bytes)
    width = _tile_width(dtype, warps_per_row, vector_bytes)
    tiled = mgpu_fa.TiledLayout(
        mgpu_fa.Tiling(((rows, width), (1, _LANES * vec), (1, vec))),
        warp_dims=(-6, -5),
        lane_dims=(-3,),
        vector_dim=-1,
        _check_canonical=False,
    ).canonicalize()
    return plgpu.Layout.TILED(
        tiled.tiling,
        warp_dims=tiled.warp_dims,
        lane_dims=tiled.lane_dims,
        vector_dim=tiled.vector_dim,
    )


@dataclasses.dataclass(frozen=True)
class RowNormConfig:
    """Tuning knobs of the row-norm kernel.

    Attributes:
      block_m: rows per CTA.
      cluster_k: CTAs a row is split across (1 = no cluster).
      warps_per_row: 1 (block_m % 4 == 0), 2 (block_m == 2) or 4 (block_m == 1).
      chunk_k: columns processed per register chunk (bounds register use).
      vector_bytes: bytes per lane per shared-memory access (16, 8 or 4).
      transport: how partials move across the cluster ("dsmem" on the GPU).
    """

    block_m: int
    cluster_k: int = 1
    warps_per_row: int = 1
    chunk_k: int = 1024
    vector_bytes: int = 16
    transport: Transport = "dsmem"

    def __post_init__(self) -> None:
        if self.warps_per_row not in (1, 2, 4):
            raise ValueError(f"warps_per_row must be 1, 2 or 4; got {self.warps_per_row}")
        rows_per_tile = _WARPS // self.warps_per_row
        if self.block_m % rows_per_tile:
            raise ValueError(
                f"block_m={self.block_m} must be a multiple of {rows_per_tile} "
                f"(4 warps / warps_per_row={self.warps_per_row})"
            )
        if not 1 <= self.cluster_k <= hardware.MAX_CLUSTER:
            raise ValueError(f"cluster_k={self.cluster_k} must be in [1, {hardware.MAX_CLUSTER}]")
        if self.vector_bytes not in (16, 8, 4):
            raise ValueError(f"vector_bytes must be 16, 8 or 4; got {self.vector_bytes}")


def check_shape(m: int, k: int, dtype: jnp.dtype, config: RowNormConfig) -> None:
    """Raise Unsupported naming the dimension that does not divide the tile."""
    if m % config.block_m:
        raise Unsupported(f"M={m} must be divisible by block_m={config.block_m}")
    if k % config.cluster_k:
        raise Unsupported(f"K={k} must be divisible by cluster_k={config.cluster_k}")
    k_part = k // config.cluster_k
    if k_part % _ROW_MULTIPLE:
        raise Unsupported(
            f"K / cluster_k = {k_part} must be a multiple of {_ROW_MULTIPLE} (copies into "
            "shared memory move multiples of 128 bytes)"
        )
    tile = _tile_width(dtype, config.warps_per_row, config.vector_bytes)
    if config.chunk_k % tile:
        raise Unsupported(
            f"chunk_k={config.chunk_k} must be a multiple of the layout width {tile} "
            f"({config.warps_per_row} warps x 32 lanes x "
            f"{_vector_length(dtype, config.vector_bytes)} elements)"
        )
    if k_part % config.chunk_k:
        raise Unsupported(
            f"K / cluster_k = {k_part} must be divisible by chunk_k={config.chunk_k}"
        )


# ------------------------------------------------------------------ heuristics

# A CTA's staged tile; many small CTAs per SM keep bytes in flight while others
# compute: 16 KiB measured fastest on the H200 (docs/mosaic-notes.md, row norm).
_TARGET_TILE_BYTES = 16 * 1024
# Widest part of a row one CTA stages before the row is split across a cluster:
# a split only adds the exchange, with many rows or few (docs/mosaic-notes.md, row norm).
_MAX_ROW_PART_BYTES = 48 * 1024
# What one CTA may stage at all (H100/H200: 227 KiB of shared memory per CTA).
_MAX_TILE_BYTES = 192 * 1024
# Register budget: float32 elements per thread per chunk.
_CHUNK_ELEMS_PER_THREAD = 32


def _splits_evenly(
    m: int, k: int, dtype: jnp.dtype, *, block_m: int, cluster: int, vector_bytes: int
) -> bool:
    tile = _tile_width(dtype, _WARPS // min(block_m, _WARPS), vector_bytes)
    k_part, rest = divmod(k, cluster)
    return m % block_m == 0 and not rest and k_part % tile == 0 and k_part % _ROW_MULTIPLE == 0


def select_config(
    m: int,
    k: int,
    dtype: jnp.dtype,
    *,
    num_sms: int,
    transport: Transport = "dsmem",
    max_cluster: int | None = None,
) -> RowNormConfig:
    """Pick block_m / cluster_k / chunk_k for an [m, k] input; Unsupported if unsupported."""
    max_cluster = min(max_cluster or hardware.MAX_CLUSTER, hardware.MAX_CLUSTER)
    row_bytes = k * jnp.dtype(dtype).itemsize
    enough_ctas = 2 * num_sms
    cluster = 1
    while row_bytes // cluster > _MAX_ROW_PART_BYTES and cluster < max_cluster:
        cluster *= 2
    # The most rows per CTA that fit the tile budget and still give every SM
    # two CTAs; with too few rows for that, one row per CTA.
    candidates = [
        bm
        for bm in (16, 8, 4, 2)
        if m % bm == 0
        and bm * row_bytes // cluster <= _TARGET_TILE_BYTES
        and (m // bm) * cluster >= enough_ctas
    ]
    block_m = candidates[0] if candidates else 1
    # Fall back to fewer CTAs per row, then to more rows per CTA (fewer warps
    # per row, so narrower layout tiles), then to narrower vectors, until the
    # row splits into whole tiles.
    fallbacks = [
        (c, bm, vb)
        for vb in (16, 8, 4)
        for c in (cluster >> i for i in range(cluster.bit_length()))
        for bm in (block_m, *(b for b in (2, 4, 8, 16) if b > block_m))
    ]
    valid = [
        (c, bm, vb) for c, bm, vb in fallbacks
        if _splits_evenly(m, k, dtype, block_m=bm, cluster=c, vector_bytes=vb)
    ]
    if not valid:
        raise Unsupported(
            f"no split of {m} x {k} rows: K (per CTA) must be a multiple of {_ROW_MULTIPLE} "
            "(copies of 128-byte multiples) and of the register layout width, 32 lanes x "
            "vector x (4 / rows per CTA) warps, for some rows per CTA dividing M"
        )
    cluster, block_m, vector_bytes = valid[0]
    config = make_config(m, k, dtype, block_m=block_m, cluster_k=cluster,
                         vector_bytes=vector_bytes, transport=transport)
    if block_m * (k // cluster) * jnp.dtype(dtype).itemsize > _MAX_TILE_BYTES:
        raise Unsupported(
            f"a row of K={k} {jnp.dtype(dtype).name} split over {cluster} CTAs "
            f"({k // cluster * jnp.dtype(dtype).itemsize} bytes each) does not fit in shared memory"
        )
    return config


def make_config(
    m: int, k: int, dtype: jnp.dtype, *, block_m: int, cluster_k: int,
    vector_bytes: int = 16, transport: Transport = "dsmem",
) -> RowNormConfig:
    """The config for a chosen split: warps per row from block_m, the widest chunk that
    divides the row part within the register budget."""
    warps_per_row = _WARPS // min(block_m, _WARPS)
    tile = _tile_width(dtype, warps_per_row, vector_bytes)
    k_part = k // cluster_k
    budget = _CHUNK_ELEMS_PER_THREAD * _LANES * _WARPS // block_m
    chunk = min(k_part, max(tile, budget // tile * tile))
    while chunk > tile and k_part % chunk:
        chunk -= tile
    config = RowNormConfig(
        block_m=block_m,
        cluster_k=cluster_k,
        warps_per_row=warps_per_row,
        chunk_k=chunk,
        vector_bytes=vector_bytes,
        transport=transport,
    )
    check_shape(m, k, dtype, config)
    return config
