"""The GEMM's tuning knobs, epilogue flags, shared-memory model and per-shape selection.

`default_config` picks tiles and pipeline for a shape (near a swept shape, the sweep's
config from pallas_kernels/gemm_configs.py); `check_shapes` says what the kernel
(`pallas_kernels.gemm_kernel`) does not serve. Measurements behind the picks:
docs/mosaic-notes.md, lazy GEMM and GEMM configs per shape.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Mapping, Sequence

import jax
import jax.experimental.pallas as pl
import jax.numpy as jnp

from pallas_kernels import gemm_configs, hardware
from pallas_kernels.errors import Unsupported

Array = jax.Array
# Output staging slots per MMA warpgroup with a residual, at least: one storing, one
# computing, one loading the residual of a later piece (a ring;
# `pallas_kernels.gemm_epilogue.ResidualPieces`). More where SMEM holds them: `residual_slots`.
RESIDUAL_SLOTS = 3


class MatmulDimension(enum.IntEnum):
    M = 0
    N = 1

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return self.name


@dataclasses.dataclass(frozen=True)
class TuningConfig:
    """Tile sizes and schedule of the GEMM (one compute warpgroup owns tile_m x tile_n).

    The CTA tile doubles along `wg_dimension` (two MMA warpgroups). With `cluster_dimension`
    two CTAs of a cluster take neighbouring tiles along it and share the other operand's
    tile (along N: the x tile), each loading half of it, multicast to both.
    `wgmma_in_flight` = 1 leaves one K step's wgmmas running while the next is issued and
    releases each pipeline slot a step late, so the tensor cores never wait for the
    issuing warps (one slot fewer for the TMA to run ahead); 0 waits every step.
    `pingpong`: the two MMA warpgroups take whole CTA tiles in turn (tile_m x tile_n each,
    `wg_dimension` unused) from one ring filled in tile order, so one warpgroup's epilogue
    runs while the other's mainloop keeps the tensor cores busy.
    """

    tile_m: int = 128
    tile_n: int = 128
    tile_k: int = 64
    max_concurrent_steps: int = 4
    epi_tile_m: int = 64
    epi_tile_n: int = 64
    grid_minor_dim: MatmulDimension = MatmulDimension.N
    grid_tile_width: int = 1
    wg_dimension: MatmulDimension = MatmulDimension.N
    cluster_dimension: MatmulDimension | None = None
    wgmma_in_flight: int = 0
    pingpong: bool = False

    @property
    def cta_tile_m(self) -> int:
        return self.tile_m * (2 if self.wg_dimension == MatmulDimension.M and not self.pingpong
                              else 1)

    @property
    def cta_tile_n(self) -> int:
        return self.tile_n * (2 if self.wg_dimension == MatmulDimension.N and not self.pingpong
                              else 1)


def config_fields(config: TuningConfig) -> dict[str, int | str]:
    """The config as plain JSON values (dimensions by name): what sweeps and tables store."""
    return {f.name: (v.name if isinstance(v := getattr(config, f.name), MatmulDimension) else v)
            for f in dataclasses.fields(config)}


def config_from_fields(fields: Mapping[str, int | str | None]) -> TuningConfig:
    """Inverse of `config_fields`; a field TuningConfig lacks is a ValueError naming it."""
    known = {f.name for f in dataclasses.fields(TuningConfig)}
    if unknown := set(fields) - known:
        raise ValueError(f"fields: {sorted(unknown)} are not TuningConfig fields")
    dims = {n: MatmulDimension[v] for n, v in fields.items()
            if (n.endswith("_dim") or n.endswith("_dimension")) and v is not None}
    return TuningConfig(**{**fields, **dims})


@dataclasses.dataclass(frozen=True)
class Epilogue:
    """What the epilogue applies to acc = X @ W (all float32, then cast to the output dtype).

        y = row_scale[:, None] * acc - row_shift[:, None] * col_sums[None, :] + col_bias[None, :]

    Row vectors are inputs (statistics computed outside the GEMM). `column_gain` scales
    x's columns by a [K] gain of x's dtype before the product (RMSNorm's unfolded gain):
    each x tile is loaded from shared memory into registers, multiplied and fed to wgmma
    from there, so x is never rewritten in memory. `residual` adds an
    [M, N] input of x's dtype to y. `row_stats_out` also writes per-row partial
    (sum, M2) of the float32 y over each warpgroup's tile_n columns (part p covers
    columns [p tile_n, (p + 1) tile_n): `part_columns`); M2 is the sum of squared
    deviations about the partial's own mean (`pallas_kernels.gemm_epilogue`).
    """

    row_scale: bool = False
    row_shift: bool = False
    col_sums: bool = False
    col_bias: bool = False
    row_stats_out: bool = False
    residual: bool = False
    column_gain: bool = False

    def __post_init__(self) -> None:
        if self.row_shift != self.col_sums:
            raise ValueError("a row shift (s * mean(x)) and col_sums (1^T W*) come together")


def check_shapes(
    x: jax.ShapeDtypeStruct | Array,
    weights: Sequence[jax.ShapeDtypeStruct | Array],
    config: TuningConfig,
) -> None:
    """Raise Unsupported naming the dimension and the tile it must divide (what we do not serve)."""
    if x.ndim != 2:
        raise Unsupported(f"x must be 2-D [M, K]; got shape {x.shape}")
    if x.dtype not in (jnp.bfloat16, jnp.float16):
        raise Unsupported(f"x dtype {x.dtype} not served (bfloat16 and float16 only)")
    m, k = x.shape
    if m < 1:
        raise Unsupported(f"M={m} must be >= 1")
    if not weights:
        raise Unsupported("at least one weight matrix is needed")
    if k % config.tile_k:
        raise Unsupported(f"K={k} must be a multiple of tile_k={config.tile_k}")
    for i, w in enumerate(weights):
        if w.ndim != 2 or w.shape[0] != k:
            raise Unsupported(f"weight[{i}] must be [K={k}, N]; got {w.shape}")
        if w.dtype != x.dtype:
            raise Unsupported(f"weight[{i}] dtype {w.dtype} differs from x dtype {x.dtype}")
        if w.shape[1] % 64:
            raise Unsupported(
                f"weight[{i}] N={w.shape[1]} must be a multiple of 64 (TMA row of the output tile)"
            )
    if config.tile_m not in (64, 128):
        raise Unsupported(f"tile_m={config.tile_m} must be 64 or 128 (wgmma M per warpgroup)")
    if config.tile_m % config.epi_tile_m:
        raise Unsupported(
            f"tile_m={config.tile_m} must be a multiple of epi_tile_m={config.epi_tile_m}"
        )
    if config.tile_n % config.epi_tile_n:
        raise Unsupported(
            f"tile_n={config.tile_n} must be a multiple of epi_tile_n={config.epi_tile_n}"
        )
    if config.wgmma_in_flight not in (0, 1):
        raise Unsupported(f"wgmma_in_flight={config.wgmma_in_flight} must be 0 or 1")
    if config.tile_n % 64 or config.tile_n > 256:
        raise Unsupported(f"tile_n={config.tile_n} must be a multiple of 64 and <= 256")
    if config.cluster_dimension == MatmulDimension.M and pl.cdiv(m, config.cta_tile_m) % 2:
        raise Unsupported(f"M={m} must span an even number of {config.cta_tile_m}-row CTA tiles "
                          "for a cluster along M")
    n_tiles = sum(pl.cdiv(w.shape[1], config.cta_tile_n) for w in weights)
    if config.cluster_dimension == MatmulDimension.N and n_tiles % 2:
        raise Unsupported(f"the weights' N must span an even number of {config.cta_tile_n}-column "
                          f"CTA tiles for a cluster along N (got {n_tiles})")


def part_columns(n: int, config: TuningConfig) -> tuple[int, ...]:
    """Columns of a weight of width n that each row-statistics part covers (0 past N)."""
    parts = pl.cdiv(n, config.cta_tile_n) * (config.cta_tile_n // config.tile_n)
    return tuple(min(max(n - p * config.tile_n, 0), config.tile_n) for p in range(parts))


def check_epilogue(
    x: jax.ShapeDtypeStruct | Array,
    weights: Sequence[jax.ShapeDtypeStruct | Array],
    config: TuningConfig,
    epilogue: Epilogue,
    residual: jax.ShapeDtypeStruct | Array | None,
) -> None:
    """Raise Unsupported for what the epilogue does not serve (ValueError for a bad residual)."""
    if epilogue.residual != (residual is not None):
        raise ValueError("pass a residual exactly when the epilogue adds one")
    if config.pingpong and config.cluster_dimension is not None:
        raise Unsupported("pingpong warpgroups take whole tiles of one CTA: no 2-CTA cluster")
    if epilogue.column_gain and config.cluster_dimension is not None:
        raise Unsupported("a column gain is applied per CTA: no 2-CTA cluster")
    if epilogue.column_gain and config.wgmma_in_flight:
        raise Unsupported("a column gain feeds wgmma from registers: wgmma_in_flight must be 0")
    if residual is not None:
        _check_residual(x, weights, config, residual)
    if epilogue.row_stats_out:
        for i, w in enumerate(weights):
            if w.shape[1] % config.tile_n:
                raise Unsupported(
                    f"row statistics need weight[{i}] N={w.shape[1]} to be a multiple of "
                    f"tile_n={config.tile_n}: a warpgroup's partial covers whole pieces")


def _check_residual(
    x: jax.ShapeDtypeStruct | Array,
    weights: Sequence[jax.ShapeDtypeStruct | Array],
    config: TuningConfig,
    residual: jax.ShapeDtypeStruct | Array,
) -> None:
    if len(weights) != 1:
        raise Unsupported(f"a residual epilogue takes one weight; got {len(weights)}")
    n = weights[0].shape[1]
    if residual.shape != (x.shape[0], n) or residual.dtype != x.dtype:
        raise ValueError(f"residual must be [M, N] = {(x.shape[0], n)} of {x.dtype}; got "
                         f"{residual.shape} {residual.dtype}")
    if n % config.cta_tile_n:
        raise Unsupported(f"a residual epilogue needs N={n} to be a multiple of the CTA tile "
                          f"{config.cta_tile_n}: every piece loads a residual piece")


# Relative wgmma efficiency of CTA tiles (bigger tiles reuse each SMEM byte
# more). A model: only the 128x256 CTA tile (128x128 per warpgroup, 4 stages,
# ~800 TFLOP/s at M >= 2048 on the H200) and the decode tiles were measured.
_CANDIDATES = (
    # (tile_m, tile_n, wg_dimension, relative efficiency)
    (128, 128, MatmulDimension.N, 1.0),
    (128, 64, MatmulDimension.N, 0.9),
    (64, 128, MatmulDimension.N, 0.8),
    (64, 64, MatmulDimension.N, 0.7),
)


def smem_bytes(config: TuningConfig, itemsize: int, residual: bool = False, *,
               staging_slots: int | None = None) -> int:
    """Upper bound of the kernel's SMEM: pipeline slots, output staging (`staging_slots` per
    MMA warpgroup; by default two, three with a residual), and the largest set of epilogue
    vectors (row scale and shift, column sums and bias, row statistics out), plus barriers.
    (The vectors' term still counts the rows of the retired statistics warpgroup: the
    bound, and so every pick, is as measured.)"""
    stage = (config.cta_tile_m + config.cta_tile_n) * config.tile_k * itemsize
    slots = staging_slots or (RESIDUAL_SLOTS if residual else 2)
    out = 2 * slots * config.epi_tile_m * config.epi_tile_n * itemsize
    vectors = 4 * (2 * 2 * config.cta_tile_m + 2 * 2 * config.cta_tile_n + 2 * 2 * config.cta_tile_m
                   + 2 * 2 * config.tile_m)
    return stage * config.max_concurrent_steps + out + vectors + 512


def residual_slots(config: TuningConfig, itemsize: int) -> int:
    """Output staging slots per MMA warpgroup with a residual: one per epilogue piece of the
    warpgroup tile where SMEM holds them, so every residual piece is loaded before the
    K-loop and lands behind it; else a ring of RESIDUAL_SLOTS, where a piece's residual is
    loaded while the pieces before it are computed and can keep the epilogue waiting."""
    pieces = (config.tile_m // config.epi_tile_m) * (config.tile_n // config.epi_tile_n)
    if pieces > RESIDUAL_SLOTS and (smem_bytes(config, itemsize, staging_slots=pieces)
                                    <= hardware.SMEM_BYTES_PER_CTA):
        return pieces
    return RESIDUAL_SLOTS


def _fit_smem(config: TuningConfig, itemsize: int, max_steps: int) -> TuningConfig:
    """The deepest pipeline (<= max_steps) that fits; a narrower output staging tile
    first, when that is what keeps 4 stages."""
    for epi_n in (config.epi_tile_n, config.epi_tile_n // 2):
        for steps in range(max_steps, 3, -1):
            fitted = dataclasses.replace(config, max_concurrent_steps=steps, epi_tile_n=epi_n)
            if smem_bytes(fitted, itemsize) <= hardware.SMEM_BYTES_PER_CTA:
                return fitted
    return dataclasses.replace(config, max_concurrent_steps=3)


def default_config(
    m: int,
    k: int,
    ns: Sequence[int],
    *,
    sms: int = hardware.H200_SMS,
    itemsize: int = 2,
) -> TuningConfig:
    """Tiles per shape: a decode config for M <= 64, else the CTA tile that best fills the SMs.

    Prefill shapes near a measured one take its config (`measured_config`).
    Decode (M <= 64) streams the weights: 64x64 warpgroup tiles (more CTAs
    pulling weights at once), the deepest pipeline that fits.
    Prefill: among the candidate tiles, the one with the least modelled time
    (waves of `sms` CTAs times tile area over its relative efficiency).
    The grid walks 8-M-tile strips across N so a wave's A and B tiles stay in
    L2 (measured faster than N-tile columns: docs/mosaic-notes.md, lazy GEMM).
    """
    if m > 64 and (measured := measured_config(m, k, ns, sms=sms, itemsize=itemsize)):
        return measured
    if m <= 64:
        # 64x128 CTA tiles; when those leave more than half the SMs idle, 128x64
        # ones (the second warpgroup's rows are past M: its wgmma is idle tensor
        # time, but twice the CTAs stream weights; docs/mosaic-notes.md, lazy GEMM).
        wide_tiles = sum(pl.cdiv(n, 128) for n in ns)
        wg_dim = MatmulDimension.M if wide_tiles < sms // 2 else MatmulDimension.N
        config = TuningConfig(tile_m=64, tile_n=64, wg_dimension=wg_dim)
        return _fit_smem(config, itemsize, max_steps=8)
    best, best_time = None, float("inf")
    for tile_m, tile_n, wg_dim, efficiency in _CANDIDATES:
        config = TuningConfig(tile_m=tile_m, tile_n=tile_n, wg_dimension=wg_dim)
        tiles = pl.cdiv(m, config.cta_tile_m) * sum(pl.cdiv(n, config.cta_tile_n) for n in ns)
        time = pl.cdiv(tiles, sms) * config.cta_tile_m * config.cta_tile_n / efficiency
        if time < best_time:
            best, best_time = config, time
    assert best is not None
    return dataclasses.replace(
        _fit_smem(best, itemsize, max_steps=6),
        grid_minor_dim=MatmulDimension.M,
        grid_tile_width=min(8, pl.cdiv(m, best.cta_tile_m)),
    )


# A measured config serves shapes within this distance of its own in log2(M, K, N):
# a factor of 2 along one dimension (M = 2048 and 16384 from sweeps at 4096 and 8192).
TABLE_RADIUS_LOG2 = 1.0


def measured_config(
    m: int, k: int, ns: Sequence[int], *, sms: int, itemsize: int
) -> TuningConfig | None:
    """The config of the shape nearest (M, K, sum(ns)) in the sweep's table
    (pallas_kernels/gemm_configs.py), if one is within TABLE_RADIUS_LOG2 and the table was
    measured on a GPU of `sms` SMs in 2-byte types; else None. Its cluster is dropped where
    this shape's tiles do not pair up along it."""
    if itemsize != 2 or not gemm_configs.ENTRIES or gemm_configs.PROVENANCE.get("sms") != sms:
        return None
    point = (math.log2(m), math.log2(k), math.log2(sum(ns)))

    def distance(entry) -> float:
        return math.dist(point, [math.log2(d) for d in entry[0]])

    nearest = min(gemm_configs.ENTRIES, key=distance)
    if distance(nearest) > TABLE_RADIUS_LOG2:
        return None
    config = config_from_fields(nearest[1])
    tiles = {MatmulDimension.M: pl.cdiv(m, config.cta_tile_m),
             MatmulDimension.N: sum(pl.cdiv(n, config.cta_tile_n) for n in ns)}
    if config.cluster_dimension is not None and tiles[config.cluster_dimension] % 2:
        config = dataclasses.replace(config, cluster_dimension=None)
    return config


# TMA moves the row dimension of x and of the outputs in 8-row tiles (the
# swizzled SMEM layout wgmma needs), so a GMEM row count above 8 must be a
# multiple of 8; other M are padded (a copy of x and of the outputs, M*K and M*N).
TMA_ROW_TILE = 8


def padded_rows(m: int) -> int:
    return m if m <= TMA_ROW_TILE else pl.cdiv(m, TMA_ROW_TILE) * TMA_ROW_TILE
