"""Standalone RMSNorm / LayerNorm over the last axis as Mosaic GPU kernels (Hopper+).

One HBM read and one HBM write per element: each CTA copies its rows (or, with
a cluster, its column block of those rows) into shared memory with one bulk
copy per row, makes its passes over shared memory in registers, writes the
normalized values back in place, and copies them out. Statistics are float32.

- One CTA per row block (`cluster_k == 1`) whenever a row fits in shared
  memory: on the H200 that was never slower, even with few rows.
- A row split across the `cluster_k` CTAs of a thread-block cluster when it is
  wider than one CTA stages (48 KiB): each CTA reduces its columns to per-row
  partials and the partials are exchanged (`cluster_exchange`, DESIGN.md
  algebra 3).

LayerNorm partials are shifted two-pass statistics, Chan-combined: CTA c takes
its first element s_c as a shift, md_c = mean(x - s_c) and
M2_c = sum((x - s_c - md_c)^2) over its columns. Relative to s_0 the CTA means
are a_c = (s_c - s_0) + md_c, the row mean is mu = mean_c(a_c) and
M2 = sum_c M2_c + K_c * sum_c (a_c - mu)^2. s_c - s_0 and x - s_0 are exact
when the values are within a factor 2 of each other (Sterbenz), which is the
|mean| >> std case where an unshifted E[x^2] - E[x]^2 has nothing left.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Literal

import jax
import jax.experimental.pallas as pl
import jax.experimental.pallas.mosaic_gpu as plgpu
import jax.numpy as jnp
from jax import lax
from jax.experimental.mosaic.gpu import fragmented_array as mgpu_fa

from pallas_kernels.cluster_exchange import RowStatsExchange, Site, Transport

Kind = Literal["rms", "layer"]

# A copy into shared memory moves a multiple of 128 bytes (each of the
# warpgroup's 128 threads arrives for its share of the bytes): rows (or row
# parts) are multiples of 64 elements, so any gain/bias dtype qualifies too.
_ROW_MULTIPLE = 64
_MAX_CLUSTER = 8  # the portable cluster size limit
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
        if not 1 <= self.cluster_k <= _MAX_CLUSTER:
            raise ValueError(f"cluster_k={self.cluster_k} must be in [1, {_MAX_CLUSTER}]")
        if self.vector_bytes not in (16, 8, 4):
            raise ValueError(f"vector_bytes must be 16, 8 or 4; got {self.vector_bytes}")


def check_shape(m: int, k: int, dtype: jnp.dtype, config: RowNormConfig) -> None:
    """Raise ValueError naming the dimension that does not divide the tile."""
    if m % config.block_m:
        raise ValueError(f"M={m} must be divisible by block_m={config.block_m}")
    if k % config.cluster_k:
        raise ValueError(f"K={k} must be divisible by cluster_k={config.cluster_k}")
    k_part = k // config.cluster_k
    if k_part % _ROW_MULTIPLE:
        raise ValueError(
            f"K / cluster_k = {k_part} must be a multiple of {_ROW_MULTIPLE} (copies into "
            "shared memory move multiples of 128 bytes)"
        )
    tile = _tile_width(dtype, config.warps_per_row, config.vector_bytes)
    if config.chunk_k % tile:
        raise ValueError(
            f"chunk_k={config.chunk_k} must be a multiple of the layout width {tile} "
            f"({config.warps_per_row} warps x 32 lanes x "
            f"{_vector_length(dtype, config.vector_bytes)} elements)"
        )
    if k_part % config.chunk_k:
        raise ValueError(
            f"K / cluster_k = {k_part} must be divisible by chunk_k={config.chunk_k}"
        )


# ------------------------------------------------------------------ heuristics

# A CTA's staged tile; many small CTAs per SM keep bytes in flight while
# others compute. H200, RMSNorm bf16 (tests/gpu_norms/h200_results.md):
# 4096 x 4096 ran 18.1 / 18.8 / 18.8 / 21.2 / 27.5 us with 8 / 16 / 32 / 64 /
# 128 KiB tiles, 8192 x 8192 66.5 / 67.5 / 71.7 us with 16 / 32 / 64 KiB.
_TARGET_TILE_BYTES = 16 * 1024
# Widest part of a row one CTA stages before the row is split across a
# cluster. A split only adds the exchange, with many rows or few (H200, RMSNorm
# bf16, us whole / over 2, 4, 8 CTAs): 4096 x 16384 66.5 / 75.4; 256 x 16384
# 7.2 / - / 9.1 / 12.0; 16 x 8192 2.4 / 2.5 / 2.3 / 2.4 (launch-bound).
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
    """Pick block_m / cluster_k / chunk_k for an [m, k] input; ValueError if unsupported."""
    max_cluster = min(max_cluster or _MAX_CLUSTER, _MAX_CLUSTER)
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
        raise ValueError(
            f"no split of {m} x {k} rows: K (per CTA) must be a multiple of {_ROW_MULTIPLE} "
            "(copies of 128-byte multiples) and of the register layout width, 32 lanes x "
            "vector x (4 / rows per CTA) warps, for some rows per CTA dividing M"
        )
    cluster, block_m, vector_bytes = valid[0]
    config = make_config(m, k, dtype, block_m=block_m, cluster_k=cluster,
                         vector_bytes=vector_bytes, transport=transport)
    if block_m * (k // cluster) * jnp.dtype(dtype).itemsize > _MAX_TILE_BYTES:
        raise ValueError(
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


# ---------------------------------------------------------------------- kernel


def safe_rsqrt(v: jax.Array) -> jax.Array:
    """rsqrt(v) for v > 0, 0 for v == 0 (a zero row with eps = 0 gives zeros), NaN stays NaN."""
    positive = v > 0
    return jnp.where(positive, lax.rsqrt(jnp.where(positive, v, 1.0)), jnp.where(v != v, v, 0.0))


def combine_rms(partial: Callable[[int, int], jax.Array], num_partials: int, k: int,
                eps: float) -> jax.Array:
    """rsqrt(mean(x^2) + eps) per row from partial sums of squares (stat 0)."""
    total = partial(0, 0)
    for p in range(1, num_partials):
        total = total + partial(p, 0)
    return safe_rsqrt(total * (1.0 / k) + eps)


def combine_layer(
    partial: Callable[[int, int], jax.Array], num_partials: int, count: int, eps: float
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(s_0, mu, 1/std) per row from Chan partials (shift, shifted mean, M2), `count` each.

    The row mean is s_0 + mu; normalize as ((x - s_0) - mu) * inv_std.
    """
    shift0 = partial(0, 0)
    means = [(partial(p, 0) - shift0) + partial(p, 1) for p in range(num_partials)]
    mu = means[0]
    for a in means[1:]:
        mu = mu + a
    mu = mu * (1.0 / num_partials)
    m2 = partial(0, 2)
    for p in range(1, num_partials):
        m2 = m2 + partial(p, 2)
    spread = (means[0] - mu) * (means[0] - mu)
    for a in means[1:]:
        spread = spread + (a - mu) * (a - mu)
    m2 = m2 + spread * float(count)
    return shift0, mu, safe_rsqrt(m2 * (1.0 / (count * num_partials)) + eps)


def combine_rms_matrix(sums_of_squares: jax.Array, k: int, eps: float) -> jax.Array:
    """combine_rms from a [rows, partials] matrix of partial sums of squares."""
    return safe_rsqrt(jnp.sum(sums_of_squares, axis=1) * (1.0 / k) + eps)


def combine_layer_matrix(
    shift: jax.Array, mean_d: jax.Array, m2: jax.Array, count: int, eps: float,
    along_rows: Callable[[jax.Array], jax.Array],
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """combine_layer from [rows, partials] matrices of Chan partials, `count` each; the
    reference shift s_0 is the partials' mean shift. `along_rows` broadcasts a [rows]
    vector to the matrices' shape (and layout)."""
    parts = shift.shape[1]
    shift0 = jnp.sum(shift, axis=1) * (1.0 / parts)
    means = (shift - along_rows(shift0)) + mean_d
    mu = jnp.sum(means, axis=1) * (1.0 / parts)
    spread = means - along_rows(mu)
    m2 = jnp.sum(m2, axis=1) + jnp.sum(spread * spread, axis=1) * float(count)
    return shift0, mu, safe_rsqrt(m2 * (1.0 / (count * parts)) + eps)


def num_stats(kind: Kind) -> int:
    return 1 if kind == "rms" else 3


def _kernel(
    *refs,
    kind: Kind,
    has_scale: bool,
    has_bias: bool,
    eps: float,
    scale_offset: float,
    k: int,
    config: RowNormConfig,
    exchange: RowStatsExchange,
):
    refs = list(refs)
    x_gmem = refs.pop(0)
    scale_gmem = refs.pop(0) if has_scale else None
    bias_gmem = refs.pop(0) if has_bias else None
    y_gmem = refs.pop(0)
    stats_gmem = refs.pop(0) if exchange.gmem_scratch(1) is not None else None
    x_smem, scale_smem, bias_smem, x_barrier, vec_barrier, ex_scratch = refs

    bm, n, chunk = config.block_m, config.cluster_k, config.chunk_k
    k_part = k // n
    num_chunks = k_part // chunk
    layout = row_layout(x_smem.dtype, config.warps_per_row, config.vector_bytes)
    col_layout = layout.reduce(0)
    row0 = lax.axis_index("m") * bm
    col0 = lax.axis_index("k") * k_part if n > 1 else 0
    in_bounds = plgpu.OOBFillMode.PROMISE_IN_BOUNDS

    # Whole rows are contiguous in HBM: one bulk copy. A column block of rows
    # is not, and TMA tensor boxes stop at 256 elements, so copy row by row.
    if n == 1:
        plgpu.copy_gmem_to_smem(x_gmem.at[pl.ds(row0, bm)], x_smem, x_barrier, oob_mode=in_bounds)
    else:
        for r in range(bm):
            plgpu.copy_gmem_to_smem(
                x_gmem.at[pl.ds(row0 + r, 1), pl.ds(col0, k_part)],
                x_smem.at[pl.ds(r, 1)],
                x_barrier,
                oob_mode=in_bounds,
            )
    for vec_gmem, vec_smem in ((scale_gmem, scale_smem), (bias_gmem, bias_smem)):
        if vec_gmem is not None:
            plgpu.copy_gmem_to_smem(
                vec_gmem.at[pl.ds(col0, k_part)], vec_smem, vec_barrier, oob_mode=in_bounds
            )

    def load(c) -> jax.Array:
        return plgpu.load(x_smem.at[:, pl.ds(c * chunk, chunk)], layout=layout).astype(jnp.float32)

    def rows(v: jax.Array) -> jax.Array:
        dims = [0] if v.ndim else []
        return plgpu.layout_cast(lax.broadcast_in_dim(v, (bm, chunk), dims), layout)

    def cols(v: jax.Array) -> jax.Array:
        return plgpu.layout_cast(lax.broadcast_in_dim(v, (bm, chunk), [1]), layout)

    def load_vector(vec_smem, span) -> jax.Array:
        # The layout's vectors are sized for x; a wider vector dtype (f32 gain
        # for bf16 x) doubles them, which the optimized transfer planner may
        # reject. These loads are 1/block_m of the traffic: the plain path is fine.
        wider = vec_smem.dtype.itemsize > x_smem.dtype.itemsize
        value = plgpu.load(vec_smem.at[span], layout=col_layout, optimized=not wider)
        return value.astype(jnp.float32)

    def row_sum(term: Callable[[jax.Array], jax.Array]) -> jax.Array:
        # Accumulate elementwise and reduce once: one shuffle tree per row, not per chunk.
        zero = plgpu.layout_cast(jnp.zeros((bm, chunk), jnp.float32), layout)
        acc = lax.fori_loop(0, num_chunks, lambda c, acc: acc + term(load(c)), zero)
        return jnp.sum(acc, axis=1)

    plgpu.barrier_wait(x_barrier)
    if kind == "rms":
        partials = [row_sum(lambda x: x * x)]
    else:
        first_col = plgpu.broadcasted_iota(jnp.int32, (bm, chunk), 1, layout=layout) == 0
        shift = jnp.sum(jnp.where(first_col, load(0), 0.0), axis=1)
        mean_d = row_sum(lambda x: x - rows(shift)) * (1.0 / k_part)

        def centred_square(x: jax.Array) -> jax.Array:
            d = (x - rows(shift)) - rows(mean_d)
            return d * d

        partials = [shift, mean_d, row_sum(centred_square)]

    if n == 1:
        partial = lambda p, j: partials[j]  # noqa: E731
    else:
        if bm == 1:
            # Shared-memory transfers of one-element vectors do not lower; move scalars.
            partials = [jnp.sum(v, axis=0) for v in partials]
        gathered = exchange.all_gather(partials, ex_scratch, stats_gmem,
                                       Site(party=0, cluster_id=lax.axis_index("m")))
        partial = functools.partial(exchange.load_partial, gathered, bm, layout.reduce(1))
    if kind == "rms":
        inv = combine_rms(partial, n, k, eps)
        shift = mu = None
    else:
        shift, mu, inv = combine_layer(partial, n, k_part, eps)

    if has_scale or has_bias:
        plgpu.barrier_wait(vec_barrier)

    @pl.loop(0, num_chunks)
    def _normalize(c):
        x = load(c)
        y = x * rows(inv) if kind == "rms" else ((x - rows(shift)) - rows(mu)) * rows(inv)
        span = pl.ds(c * chunk, chunk)
        if has_scale:
            y = y * cols(load_vector(scale_smem, span) + scale_offset)
        if has_bias:
            y = y + cols(load_vector(bias_smem, span))
        # In place: each thread overwrites exactly the elements it just read.
        x_smem[:, span] = y.astype(x_smem.dtype)

    plgpu.commit_smem()  # make the generic-proxy stores visible to the TMA engine
    if n == 1:
        plgpu.copy_smem_to_gmem(x_smem, y_gmem.at[pl.ds(row0, bm)])
    else:
        for r in range(bm):
            plgpu.copy_smem_to_gmem(
                x_smem.at[pl.ds(r, 1)], y_gmem.at[pl.ds(row0 + r, 1), pl.ds(col0, k_part)]
            )
    # Shared memory must outlive the copies' reads of it.
    plgpu.wait_smem_to_gmem(0, wait_read_only=True)


def row_norm(
    x: jax.Array,
    scale: jax.Array | None,
    bias: jax.Array | None,
    *,
    kind: Kind,
    eps: float,
    scale_offset: float,
    config: RowNormConfig,
    interpret: bool = False,
) -> jax.Array:
    """Norm over the last axis of a 2-D x, output in x.dtype; `bias` only for LayerNorm."""
    if x.ndim != 2:
        raise ValueError(f"x must be 2-D [M, K]; got shape {x.shape}")
    if kind == "rms" and bias is not None:
        raise ValueError("RMSNorm takes no bias")
    m, k = x.shape
    check_shape(m, k, x.dtype, config)
    n = config.cluster_k
    k_part = k // n
    exchange = RowStatsExchange(
        axis="k",
        cluster_size=n,
        parties=1,
        num_stats=num_stats(kind),
        rows=config.block_m,
        transport=config.transport,
        gpu_fences=not interpret,
    )
    num_blocks = m // config.block_m
    out_type = [jax.ShapeDtypeStruct((m, k), x.dtype)]
    if (stats := exchange.gmem_scratch(num_blocks)) is not None:
        out_type.append(stats)
    num_vectors = (scale is not None) + (bias is not None)
    scratch = (
        plgpu.SMEM((config.block_m, k_part), x.dtype),
        None if scale is None else plgpu.SMEM((k_part,), scale.dtype),
        None if bias is None else plgpu.SMEM((k_part,), bias.dtype),
        plgpu.Barrier(num_arrivals=config.block_m if n > 1 else 1),
        plgpu.Barrier(num_arrivals=max(num_vectors, 1)),
        exchange.smem_scratch() if n > 1 else None,
    )
    body = functools.partial(
        _kernel,
        kind=kind,
        has_scale=scale is not None,
        has_bias=bias is not None,
        eps=float(eps),
        scale_offset=float(scale_offset),
        k=k,
        config=config,
        exchange=exchange,
    )
    call = plgpu.kernel(
        body,
        out_type=tuple(out_type),
        grid=(num_blocks,),
        grid_names=("m",),
        cluster=(n,),
        cluster_names=("k",),
        scratch_types=scratch,
        compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Lane),
        interpret=plgpu.InterpretGPUParams(detect_races=True) if interpret else False,
    )
    args = [a for a in (x, scale, bias) if a is not None]
    return call(*args)[0]
