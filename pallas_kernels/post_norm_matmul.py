"""Post-norm GEMM: Norm(x @ W + b [+ residual]) with the norm fused into the epilogue (Hopper+).

DESIGN.md algebra 3. A norm over output rows needs whole rows, which are
wider than one CTA's tile, so a thread-block cluster of `cluster_n` CTAs
covers whole rows: CTA r of the cluster owns columns [r * cta_n, (r + 1) *
cta_n) of the same rows, its two MMA warpgroups one column half each (or,
with `split_rows`, one row half each, so a row has one partial per CTA).
After the K-loop every warpgroup adds the bias (and residual), writes the
pre-norm sum h, reduces its [tile_m, tile_n] part of h to per-row partial
statistics, and the partials (not the tiles) are all-gathered across the
cluster (`cluster_exchange`). Each warpgroup then normalizes its own tile in
registers and writes y. HBM sees x and W once per row block, h and y once.

Partials are those of `row_norm` (float32): RMSNorm a sum of squares;
LayerNorm (shift, shifted mean, M2) with the warpgroup's own mean as shift,
Chan-combined, so rows with |mean| >> std keep their digits.

Kernel shape (after jax's `ops/gpu/hopper_matmul_mgpu.py`): persistent, the
grid's `grid_clusters` clusters walking the row blocks (`plgpu.nd_loop`), so
the TMA warpgroup fetches the next block's first K steps while the MMA
warpgroups run this block's epilogue; `plgpu.emit_pipeline_warp_specialized`
with two MMA warpgroups and a TMA warpgroup for the K-loop, chained across a
CTA's blocks where the stages allow (`chain_blocks`), so it does not drain
between them. The grid holds no more clusters than the GPU runs at once
(`resident_clusters`). All CTAs of a cluster read the same rows of x, so on
the GPU one TMA multicast can feed them all (`multicast`; off by default, as
it measured no faster). With a residual, each MMA warpgroup stages one
[tile_m, tile_n] tile in shared memory that carries, in turn, the residual
in, h out and y out (or, with `residual_in_registers`, loads the residual
into registers before the K-loop); otherwise h and y leave in
double-buffered 64-row pieces as in the plain GEMM, which leaves the
pipeline the shared memory for its stages. h is written only when asked for
(`pre_norm_sum`): the residual stream and autodiff need it, inference does not.

With `transport="semaphore"` (GPU only) the CTAs that share a row are a group
of the grid (axes "m" x "n") rather than a cluster, so rows of 4096 take
128 x 256 CTA tiles in groups of 16 and every SM can work; the statistics then
go through global memory and semaphores (`cluster_exchange`).
`select_gpu_config` takes a group wherever it needs fewer rounds than clusters.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.experimental.pallas as pl
import jax.experimental.pallas.mosaic_gpu as plgpu
import jax.numpy as jnp
from jax import lax

from pallas_kernels import _gemm_core
from pallas_kernels.cluster_exchange import RowStatsExchange, Site, Transport
from pallas_kernels.row_norm import (Kind, combine_layer, combine_layer_matrix, combine_rms,
                                     combine_rms_matrix, num_stats)

_MAX_CLUSTER = 8  # the portable cluster size limit
# CTAs of a grid group ("semaphore" transport): 16 x 256 columns = rows of 4096.
_MAX_GROUP = 16
_COMPUTE_WGS = 2
_PIECE = 64  # output pieces are _PIECE x _PIECE (rows x columns)
# Shared-memory slots per warpgroup that pieces take turns in: one is filled while the
# other's store drains (one slot measured 11-13% slower on the H200).
_PIECE_SLOTS = 2
_MAX_SMEM_BYTES = 227 * 1024  # per CTA on Hopper
_SUPPORTED_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
# (tile_m, tile_n) per MMA warpgroup in order of preference: 128 x 128 (the
# 128 x 256 CTA tile of the jax Hopper matmul) reuses W best; 64 x 256 reaches
# rows of 8 x 512 columns; the rest serve small M or N. Each keeps the float32
# accumulator at <= 128 registers per thread.
_TILES = ((128, 128), (64, 256), (128, 64), (64, 128), (64, 64))


def _max_split(transport: Transport) -> int:
    """CTAs that may share a row: a cluster's, or a grid group's (semaphore transport)."""
    return _MAX_GROUP if transport == "semaphore" else _MAX_CLUSTER


def _cta_tile(tile_m: int, tile_n: int, split_rows: bool) -> tuple[int, int]:
    """A CTA's tile: its two MMA warpgroups' tiles stacked (`split_rows`) or side by side."""
    if split_rows:
        return _COMPUTE_WGS * tile_m, tile_n
    return tile_m, _COMPUTE_WGS * tile_n


def _can_multicast(tile_m: int, cluster_n: int) -> bool:
    # Each CTA issues one share of the tile's 8-row TMA tiles; all CTAs receive it all.
    return cluster_n > 1 and (tile_m // 8) % cluster_n == 0


@dataclasses.dataclass(frozen=True)
class PostNormConfig:
    """Tuning knobs. Each MMA warpgroup computes tile_m x tile_n, a CTA two of them side by
    side (tile_m x 2 tile_n), or stacked with `split_rows` (2 tile_m x tile_n); `cluster_n`
    CTAs cover a row.

    Attributes:
      tile_m: rows per MMA warpgroup (a multiple of 64, the wgmma row tile).
      tile_n: columns per MMA warpgroup.
      cluster_n: CTAs per row block (a cluster, or a grid group with
        transport="semaphore"); N must equal cluster_n * cta_n.
      tile_k: K per pipeline step.
      max_concurrent_steps: pipeline depth (shared-memory stages).
      transport: how the row partials move between those CTAs: "dsmem" (GPU,
        cluster), "global" (interpreter, cluster) or "semaphore" (GPU, group).
      grid_clusters: clusters (or groups) launched, each walking row blocks
        (persistent); None launches one per row block.
      multicast: load x's tile once per cluster with a TMA multicast (GPU only:
        the interpreter has no cluster-collective barriers).
      delay_release: wgmma groups left in flight before a pipeline slot is released.
      chain_blocks: run a CTA's row blocks as one chained pipeline (jax's
        `pipeline_state`), so the TMA warpgroup fetches the next block's first K
        steps as soon as slots free up instead of after the block's last step;
        needs (K / tile_k) % max_concurrent_steps == 0 and delay_release=0.
      residual_in_registers: load a residual straight from global memory into
        registers before the K-loop instead of staging it in shared memory with
        TMA; h and y then leave in 64 x 64 pieces, and the 2 x tile_m x tile_n
        staging tiles' shared memory goes to pipeline stages.
      split_rows: the two MMA warpgroups take the CTA's two row halves, each across all
        its columns (CUTLASS's cooperative layout), instead of its two column halves: a
        row then has one partial per CTA instead of two, and a warpgroup reads only its
        own rows' partials.
    """

    tile_m: int
    tile_n: int
    cluster_n: int
    tile_k: int = 64
    max_concurrent_steps: int = 2
    transport: Transport = "dsmem"
    grid_clusters: int | None = None
    multicast: bool = False
    delay_release: int = 0
    chain_blocks: bool = False
    residual_in_registers: bool = False
    split_rows: bool = False

    def __post_init__(self) -> None:
        if self.tile_m % 64:
            raise ValueError(f"tile_m={self.tile_m} must be a multiple of 64 (the wgmma M tile)")
        if self.tile_n % 64:
            raise ValueError(f"tile_n={self.tile_n} must be a multiple of 64 (the swizzle width)")
        limit = _max_split(self.transport)
        if not 1 <= self.cluster_n <= limit:
            raise ValueError(f"cluster_n={self.cluster_n} must be in [1, {limit}] for "
                             f"transport={self.transport!r}")
        if self.max_concurrent_steps < 2:
            raise ValueError(f"max_concurrent_steps={self.max_concurrent_steps} must be >= 2")
        if self.grid_clusters is not None and self.grid_clusters < 1:
            raise ValueError(f"grid_clusters={self.grid_clusters} must be >= 1 (or None)")
        if self.delay_release not in (0, 1):
            raise ValueError(f"delay_release={self.delay_release} must be 0 or 1")
        if self.chain_blocks and self.delay_release:
            raise ValueError("chain_blocks needs delay_release=0 (jax's pipeline_state)")
        if self.multicast and self.transport != "dsmem":
            raise ValueError("multicast runs only on the GPU (transport='dsmem')")
        if self.multicast and not _can_multicast(self.cta_m, self.cluster_n):
            raise ValueError(f"multicast splits x's {self.cta_m} rows into 8-row tiles, one "
                             f"share per CTA: cluster_n={self.cluster_n} must divide "
                             f"{self.cta_m // 8}")

    @property
    def cta_m(self) -> int:
        """Rows of a CTA's tile (and of a row block)."""
        return _cta_tile(self.tile_m, self.tile_n, self.split_rows)[0]

    @property
    def cta_n(self) -> int:
        """Columns of a CTA's tile."""
        return _cta_tile(self.tile_m, self.tile_n, self.split_rows)[1]


def smem_bytes(config: PostNormConfig, kind: Kind = "layer", itemsize: int = 2, *,
               residual: bool = False) -> int:
    """Shared memory of the kernel: pipeline stages, staging tiles, epilogue vectors (as many
    float32 ones as `kind` takes), gathered partials (DSMEM) and barriers."""
    stage = (config.cta_m * config.tile_k + config.tile_k * config.cta_n) * itemsize
    # A residual loaded by TMA during the K-loop is staged as a whole tile per warpgroup;
    # without one (or with one in registers), h and y leave in double-buffered 64 x 64
    # pieces, as in the plain GEMM (32-wide pieces, to fit a fourth stage, measured slower
    # on the H200).
    if residual and not config.residual_in_registers:
        staging = _COMPUTE_WGS * config.tile_m * config.tile_n * itemsize
    else:
        staging = _COMPUTE_WGS * _PIECE_SLOTS * _PIECE * _PIECE * itemsize
    vectors = (2 if kind == "rms" else 3) * config.cta_n * 4  # bias, gain (, beta)
    rows = -(-config.cta_m // 32) * 32
    # Partials gathered in shared memory (DSMEM); through global memory they are read in place.
    partials = 0
    if config.transport == "dsmem" or config.cluster_n == 1:
        partials = config.cluster_n * _COMPUTE_WGS * num_stats(kind) * rows * 4
    barriers = 64 + 16 * config.max_concurrent_steps
    return config.max_concurrent_steps * stage + staging + vectors + partials + barriers


def check_shape(m: int, k: int, n: int, config: PostNormConfig, kind: Kind = "layer", *,
                residual: bool = False) -> None:
    """Raise ValueError naming the dimension that does not divide the tile."""
    if m % config.cta_m:
        raise ValueError(f"M={m} must be divisible by the CTA's {config.cta_m} rows")
    if k % config.tile_k:
        raise ValueError(f"K={k} must be divisible by tile_k={config.tile_k}")
    if n != config.cluster_n * config.cta_n:
        raise ValueError(
            f"N={n} must equal cluster_n={config.cluster_n} x the CTA's "
            f"{config.cta_n} columns: a cluster covers whole output rows"
        )
    if config.chain_blocks:
        if (k // config.tile_k) % config.max_concurrent_steps:
            raise ValueError(f"chain_blocks needs K / tile_k = {k // config.tile_k} steps "
                             f"divisible by max_concurrent_steps={config.max_concurrent_steps}")
        blocks = m // config.cta_m
        if blocks < 2 * grid_size(config, blocks):
            raise ValueError(f"chain_blocks needs two or more row blocks per cluster: {blocks} "
                             f"blocks for {grid_size(config, blocks)} clusters")
    needed = smem_bytes(config, kind, residual=residual)
    if needed > _MAX_SMEM_BYTES:
        raise ValueError(f"{config} needs {needed} bytes of shared memory"
                         f"{' (with a residual)' if residual else ''}")


def row_stats_exchange(config: PostNormConfig, kind: Kind, *,
                       gpu_fences: bool = True) -> RowStatsExchange:
    """How the kernel under `config` exchanges its rows' partials: one per MMA warpgroup
    that covers a row (two per CTA, or one with `split_rows`), once per row block."""
    return RowStatsExchange(axis="n", cluster_size=config.cluster_n, parties=_COMPUTE_WGS,
                            num_stats=num_stats(kind), rows=config.tile_m,
                            transport=config.transport, gpu_fences=gpu_fences, repeated=True,
                            row_split=config.split_rows)


def max_n() -> int:
    """The widest output row one cluster can cover (8 CTAs x 2 warpgroups x 256 columns)."""
    return _MAX_CLUSTER * _COMPUTE_WGS * 256


def grid_size(config: PostNormConfig, num_blocks: int) -> int:
    """Clusters (or grid groups) launched: each walks row blocks."""
    return min(config.grid_clusters or num_blocks, num_blocks)


# Clusters of each size that the H200 (132 SMs) holds at once: a cluster must
# fit in one GPC, so 16 clusters of 8 do not all fit and the 16th runs after
# the others. Measured with a grid of that many clusters (K=4096, bf16):
# size 8: 16 -> 357 us, 15 -> 228 us (8192x2048); size 4: 33 and 32 -> 182
# us, 30 -> 138 us (8192x1024); size 2: 66 -> 52 us, 60 -> 93 us (8192x512).
# Sizes 3, 5, 6 and 7 are derived from a GPC layout that gives those three
# counts (six GPCs of 18 SMs, one of 16, one of 8), not measured.
_H200_SMS = 132
_H200_RESIDENT_CLUSTERS = {1: 132, 2: 66, 3: 43, 4: 30, 5: 22, 6: 21, 7: 15, 8: 15}


def resident_clusters(cluster_n: int, num_sms: int) -> int:
    """Clusters that run at once: the persistent grid must not exceed it, or the
    clusters past it wait for a whole cluster to finish. Measured on the H200;
    elsewhere 7/8 of the SMs' worth, as cluster placement leaves SMs idle."""
    if num_sms == _H200_SMS:
        return _H200_RESIDENT_CLUSTERS[cluster_n]
    return max(num_sms // cluster_n * 7 // 8, 1)


# (tile_k, stages, chain_blocks): 64-wide K steps first, then by bytes in flight. H200,
# RMS, K = 4096, groups: 64 x 3 beat 32 x 7 and 32 x 5 (394 vs 431 and 425 us at 8192 x
# 4096 x 4096; 188 vs 208 and 202 at 8192 x 4096 x 2048); a fourth 64-wide stage alone
# was no faster (377.9 vs 377.1 us at 8192 x 4096 x 4096, 188.6 vs 188.3 at 4096 x 4096 x
# 4096), but with the blocks chained, which needs K steps in whole rounds of stages, it
# was faster than 64 x 3: 369.1 vs 377.1, 185.2 vs 188.3, 178.4 vs 181.0 at 8192 x 4096 x
# 2048 (one call). Chained 64 x 2 and 32 x 4 were 7-20% slower.
_PIPELINES = ((64, 4, True), (64, 3, False), (32, 6, False), (32, 5, False), (64, 2, False),
              (32, 4, False), (32, 3, False))


def select_gpu_config(
    m: int, k: int, n: int, dtype: jnp.dtype, *, kind: Kind, residual: bool = False,
    num_sms: int = 132,
) -> PostNormConfig:
    """The GPU's pick between a cluster ("dsmem") and a grid group ("semaphore").

    A group's statistics go through global memory and semaphores, a few
    microseconds more per row block than a cluster's DSMEM, but groups need
    not fit in a GPC: they use every SM where clusters of 4 or 8 leave 12 of
    the H200's 132 idle, and rows of 4096 keep 128 x 256 tiles. So a group is
    taken whenever it needs fewer rounds (row blocks per cluster or group).
    H200, K = 4096, RMS, one run: group vs cluster 434 vs 574 us (8192 x
    4096), 191 vs 230 (8192 x 2048), 96 vs 138 (8192 x 1024), 218 vs 309
    (4096 x 4096), 97 vs 138 (4096 x 2048), 51 vs 91 (4096 x 1024); at equal
    rounds the cluster: 51 vs 53 (8192 x 512).
    """
    cluster = select_config(m, k, n, dtype, kind=kind, residual=residual, transport="dsmem",
                            num_sms=num_sms)
    try:
        group = select_config(m, k, n, dtype, kind=kind, residual=residual,
                              transport="semaphore", num_sms=num_sms)
    except ValueError:
        return cluster
    rounds = [pl.cdiv(m // c.cta_m, grid_size(c, m // c.cta_m)) for c in (cluster, group)]
    return group if rounds[1] < rounds[0] else cluster


def select_config(
    m: int, k: int, n: int, dtype: jnp.dtype, *, kind: Kind, residual: bool = False,
    transport: Transport = "dsmem", max_cluster: int | None = None, num_sms: int = 132,
) -> PostNormConfig:
    """Tiles per shape; ValueError (with the reason) where the kernel does not serve it.

    A warpgroup holds tile_m x tile_n float32 accumulators in registers, so
    tile_m * tile_n <= 128 x 128 or 64 x 256 (128 registers per thread). Rows
    up to 8 x 256 columns take 128-row tiles; up to 8 x 512 columns, 64-row
    tiles with twice the width; wider rows need a bigger cluster than Hopper's
    portable 8. The "semaphore" transport groups CTAs of the grid instead of a
    cluster: 128-row CTA tiles for rows up to 16 x 256 columns, and as many
    groups as there are SMs for (every CTA must be resident); their MMA
    warpgroups stack (64 x 256 each, `split_rows`) for RMSNorm and for LayerNorm
    with a residual. The pipeline is the deepest that fits next to the
    epilogue's shared memory (`residual` stages whole tiles).
    """
    split_limit = _max_split(transport)
    max_cluster = min(max_cluster or split_limit, split_limit)
    if jnp.dtype(dtype) not in _SUPPORTED_DTYPES:
        raise ValueError(
            f"the post-norm kernel takes bfloat16 or float16 operands; got {jnp.dtype(dtype).name}"
            " (float32 would run the tensor cores in tf32, below the float32 contract)"
        )
    if n > max_cluster * _COMPUTE_WGS * 256:
        raise ValueError(
            f"N={n} > {max_cluster * _COMPUTE_WGS * 256}: a row must fit "
            f"{max_cluster} CTAs x 2 warpgroups x 256 columns"
        )
    # Grid groups stack their warpgroups (64 x 256 each) where they can: one partial a
    # row per CTA instead of two, which a LayerNorm row has three of. H200, one call, two
    # rounds each, stacked vs side by side (us): RMSNorm 362.6 vs 368.6 at 8192 x 4096 x
    # 4096, 177.2 vs 178.3 at x 2048, 89.5 vs 89.9 at x 1024, 182.0 vs 184.7 at 4096 x
    # 4096 x 4096; with a residual 392.8 vs 397.6 and 191.7 vs 192.3; LayerNorm with a
    # residual 405.8 vs 420.7, 199.2 vs 201.8, 100.0 vs 101.3 at 8192 x 4096 x {4096,
    # 2048, 1024}. (LayerNorm without a residual is unmeasured; our plain GEMM is as fast
    # either way.)
    stacked = transport != "dsmem" and (kind == "rms" or residual)
    tiles = [(64, 256, True)] if stacked else []
    for tile_m, tile_n, split_rows in tiles + [(tm, tn, False) for tm, tn in _TILES]:
        cta_m, cta_n = _cta_tile(tile_m, tile_n, split_rows)
        if n % cta_n or n // cta_n > max_cluster or m % cta_m:
            continue
        cluster_n = n // cta_n
        blocks = m // cta_m
        if transport == "semaphore":
            grid = num_sms // cluster_n  # groups need not fit a GPC, only the GPU
        else:
            grid = resident_clusters(cluster_n, num_sms)
        grid = min(blocks, grid)
        # LayerNorm with a residual loads it straight into registers (H200, grid groups,
        # one call: 442.6 vs 453.2 us at 8192 x 4096 x 4096, 211.1 vs 215.3 at x 2048,
        # 102.5 vs 107.7 at x 1024); RMSNorm keeps the staged tile (408.0 vs 403.6 us
        # even with the freed memory's fourth stage, chained).
        in_registers = residual and kind == "layer" and transport != "dsmem"
        for tile_k, stages, chained in _PIPELINES:
            stages = min(stages, k // tile_k)  # no more stages than K steps
            if k % tile_k or stages < 2:
                continue
            grid_clusters = grid
            if chained:
                if transport == "dsmem":
                    continue  # measured for grid groups (the GPU picks clusters at one round)
                # The same rounds over fewer groups, so each gets two or more blocks.
                grid_clusters = pl.cdiv(blocks, pl.cdiv(blocks, grid))
                if (k // tile_k) % stages or blocks < 2 * grid_clusters:
                    continue
            config = PostNormConfig(tile_m=tile_m, tile_n=tile_n, cluster_n=cluster_n,
                                    tile_k=tile_k, max_concurrent_steps=stages,
                                    transport=transport, grid_clusters=grid_clusters,
                                    chain_blocks=chained,
                                    residual_in_registers=in_registers,
                                    split_rows=split_rows,
                                    # Measured no faster with 128-row tiles
                                    # (230 vs 231 us, 8192x4096x2048) and
                                    # slower with 64-row ones (670 vs 572 us,
                                    # 8192x4096x4096): off by default.
                                    multicast=False)
            if smem_bytes(config, kind, residual=residual) <= _MAX_SMEM_BYTES:
                check_shape(m, k, n, config, kind, residual=residual)
                return config
    raise ValueError(
        f"no tiling serves M={m}, K={k}, N={n}: M must be a multiple of 64, K of 32 and N "
        f"of 128 with N / (2 tile_n) <= {max_cluster} CTAs"
    )


def _kernel(
    *refs,
    kind: Kind,
    has_bias: bool,
    has_scale: bool,
    has_norm_bias: bool,
    has_residual: bool,
    store_h: bool,
    eps: float,
    config: PostNormConfig,
    exchange: RowStatsExchange,
    k: int,
    num_blocks: int,
):
    refs = list(refs)
    x_gmem, w_gmem = refs.pop(0), refs.pop(0)
    bias_gmem = refs.pop(0) if has_bias else None
    scale_gmem = refs.pop(0) if has_scale else None
    norm_bias_gmem = refs.pop(0) if has_norm_bias else None
    residual_gmem = refs.pop(0) if has_residual else None
    y_gmem = refs.pop(0)
    h_gmem = refs.pop(0) if store_h else None
    stats_gmem = refs.pop(0) if refs else None
    assert not refs

    dtype = x_gmem.dtype
    tile_m, tile_n, tile_k = config.tile_m, config.tile_n, config.tile_k
    n_cluster = config.cluster_n
    swizzle = plgpu.find_swizzle(tile_k * jnp.dtype(dtype).itemsize * 8)
    swizzle_elems = swizzle // jnp.dtype(dtype).itemsize
    transforms = (plgpu.TilingTransform((8, swizzle_elems)), plgpu.SwizzleTransform(swizzle))
    whole_tiles = has_residual and not config.residual_in_registers
    io_swizzle = plgpu.find_swizzle((tile_n if whole_tiles else _PIECE)
                                    * jnp.dtype(dtype).itemsize * 8)
    io_transforms = (
        plgpu.TilingTransform((8, io_swizzle // jnp.dtype(dtype).itemsize)),
        plgpu.SwizzleTransform(io_swizzle),
    )
    # Per MMA warpgroup: a whole staged tile, or two 64-row pieces taking turns.
    io_shape = (tile_m, tile_n) if whole_tiles else (_PIECE_SLOTS, _PIECE, _PIECE)
    rank = lax.axis_index("n") if n_cluster > 1 else 0
    cta_cols = pl.ds(rank * config.cta_n, config.cta_n)
    # Copies of the epilogue vectors in shared memory: one per MMA warpgroup's columns.
    vec_copies = 1 if config.split_rows else _COMPUTE_WGS
    # Where MMA warpgroup `wg` sits in the CTA's tile (rows, columns).
    wg_offsets = ((lambda wg: (wg * tile_m, 0)) if config.split_rows
                  else (lambda wg: (0, wg * tile_n)))
    vectors = [(v, g) for v, g in ((bias_gmem, "bias"), (scale_gmem, "scale"),
                                   (norm_bias_gmem, "norm_bias")) if v is not None]
    # Every CTA of a cluster reads the same rows of x: one TMA multicast feeds them all.
    x_collective = ("n",) if config.multicast else ()

    def pipeline(body, compute_context, state=None):
        return plgpu.emit_pipeline_warp_specialized(
            body,
            grid=(k // tile_k,),
            memory_registers=40,
            in_specs=[
                plgpu.BlockSpec((config.cta_m, tile_k), lambda kk: (0, kk),
                                transforms=transforms,
                                collective_axes=x_collective,
                                delay_release=config.delay_release),
                plgpu.BlockSpec((tile_k, config.cta_n), lambda kk: (kk, 0), transforms=transforms,
                                delay_release=config.delay_release),
            ],
            wg_axis="wg",
            num_compute_wgs=_COMPUTE_WGS,
            max_concurrent_steps=config.max_concurrent_steps,
            compute_context=compute_context,
            pipeline_state=state,
        )

    ignore = lambda *_, **__: None  # noqa: E731  (allocations do not depend on the bodies)

    @functools.partial(
        pl.run_scoped,
        pipeline_allocs=pipeline(ignore, ignore).get_allocations(x_gmem, w_gmem),
        io_smem=plgpu.SMEM((_COMPUTE_WGS, *io_shape), dtype, transforms=io_transforms),
        vec_smem=[plgpu.SMEM((vec_copies, tile_n), v.dtype) for v, _ in vectors],
        io_barrier=plgpu.Barrier(num_barriers=_COMPUTE_WGS),
        vec_barrier=plgpu.Barrier(num_arrivals=max(len(vectors), 1), num_barriers=vec_copies),
        ex_scratch=exchange.smem_scratch(),
        collective_axes="wg",
    )
    def _scope(pipeline_allocs, io_smem, vec_smem, io_barrier, vec_barrier, ex_scratch):
        wg = lax.axis_index("wg")
        is_compute = wg < _COMPUTE_WGS
        grid = grid_size(config, num_blocks)
        semaphores = exchange.semaphores(grid)

        def wg_cols(wg) -> pl.Slice:
            """The output columns of MMA warpgroup `wg` of this CTA (the same every block)."""
            return pl.ds(rank * config.cta_n + wg_offsets(wg)[1], tile_n)

        def wg_rows(wg, m_idx) -> pl.Slice:
            """The output rows of MMA warpgroup `wg` in row block `m_idx`."""
            return pl.ds(m_idx * config.cta_m + wg_offsets(wg)[0], tile_m)

        def stage_residual(io, rows, cols, wg) -> None:
            # The previous block's y store must be done reading the staging tile.
            plgpu.wait_smem_to_gmem(0, wait_read_only=True)
            plgpu.copy_gmem_to_smem(residual_gmem.at[rows, cols], io, io_barrier.at[wg])

        # A CTA's columns are the same for every row block: its epilogue vectors
        # are loaded once, landing during the first K-loop (stacked warpgroups share them).
        @pl.when(wg < vec_copies)
        def _load_vectors():
            cols = wg_cols(wg)
            for (vec_gmem, _), smem in zip(vectors, vec_smem):
                plgpu.copy_gmem_to_smem(vec_gmem.at[cols], smem.at[wg], vec_barrier.at[wg],
                                        oob_mode=plgpu.OOBFillMode.PROMISE_IN_BOUNDS)

        layout = plgpu.Layout.WGMMA
        col_layout, row_layout = layout.reduce(0), layout.reduce(1)

        def bcast(v: jax.Array, shape: tuple[int, int], dim: int) -> jax.Array:
            return plgpu.layout_cast(lax.broadcast_in_dim(v, shape, [dim]), layout)

        def vector_loader(wg, rounds):
            """vector(name, first, width): columns [first, first + width) of an epilogue
            vector, loaded from shared memory where used; the first round waits for
            their copy."""
            copy = 0 if vec_copies == 1 else wg
            if vectors:
                pl.when(rounds == 0)(lambda: plgpu.barrier_wait(vec_barrier.at[copy]))
            smem = {name: ref.at[copy] for (_, name), ref in zip(vectors, vec_smem)}

            def vector(name: str, first: int, width: int) -> jax.Array:
                return plgpu.load(smem[name].at[pl.ds(first, width)],
                                  layout=col_layout).astype(jnp.float32)

            return vector

        # Column chunks of the epilogue's arithmetic: 256-wide warpgroup tiles would hold
        # 64 registers per thread for each whole vector next to the 128 accumulators, so
        # they take theirs 64 columns at a time.
        chunk = tile_n if tile_n <= 128 else _PIECE

        def by_columns(fn, value: jax.Array) -> jax.Array:
            """fn(columns [c, c + chunk) of value, c) for each chunk, side by side."""
            parts = [fn(value[:, c:c + chunk], c) for c in range(0, tile_n, chunk)]
            return parts[0] if len(parts) == 1 else jnp.concatenate(parts, axis=1)

        def pre_norm_sum(acc, vector, io, residual) -> jax.Array:
            """acc + bias (+ the residual: in registers, or staged in `io`), float32."""
            h = acc
            if has_bias:
                h = by_columns(lambda part, c: part + bcast(vector("bias", c, chunk),
                                                            part.shape, 1), h)
            if has_residual:
                if residual is None:
                    plgpu.barrier_wait(io_barrier.at[lax.axis_index("wg")])
                    residual = plgpu.load(io, layout=layout)
                h = h + residual.astype(jnp.float32)
            return h

        def row_partials(h) -> list[jax.Array]:
            if kind == "rms":
                return [jnp.sum(h * h, axis=1)]
            # Shift by the warpgroup's own mean, then the corrected two-pass sum
            # (Chan, Golub & LeVeque): exact enough that Chan's combine of the
            # partials keeps float32 precision, one operation an element fewer than
            # centring twice.
            inv_count = 1.0 / tile_n
            shift = jnp.sum(h, axis=1) * inv_count
            d = h - bcast(shift, h.shape, 0)
            sum_d = jnp.sum(d, axis=1)
            mean_d = sum_d * inv_count
            return [shift, mean_d, jnp.sum(d * d, axis=1) - sum_d * mean_d]

        def row_statistics(gathered) -> tuple[jax.Array, ...]:
            """The block's (row scale,) for RMSNorm or (shift, mean, 1/std) for LayerNorm,
            per row, from every party's partials."""
            row_count = n_cluster * config.cta_n
            if exchange.loads_as_matrix:
                stats = [exchange.load_partials_matrix(gathered, j)
                         for j in range(exchange.num_stats)]
                if kind == "rms":
                    return (combine_rms_matrix(stats[0], row_count, eps),)
                along_rows = lambda v: bcast(v, stats[0].shape, 0)  # noqa: E731
                return combine_layer_matrix(*stats, tile_n, eps, along_rows)

            partial = functools.partial(exchange.load_partial, gathered, tile_m, row_layout)
            if kind == "rms":
                return (combine_rms(partial, exchange.num_partials, row_count, eps),)
            return combine_layer(partial, exchange.num_partials, tile_n, eps)

        def normalize(h, gathered, vector) -> jax.Array:
            """Norm of the block's rows from the gathered partials, then gain and bias."""
            stats = row_statistics(gathered)

            def normalize_columns(part, c):
                along = lambda v: bcast(v, part.shape, 0)  # noqa: E731
                if kind == "rms":
                    y = part * along(stats[0])
                else:
                    shift0, mu, inv = stats
                    y = ((part - along(shift0)) - along(mu)) * along(inv)
                if has_scale:
                    y = y * bcast(vector("scale", c, chunk), part.shape, 1)
                if has_norm_bias:
                    y = y + bcast(vector("norm_bias", c, chunk), part.shape, 1)
                return y

            return by_columns(normalize_columns, h)

        def store_staged(io, out_gmem, rows, cols) -> None:
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(io, out_gmem.at[rows, cols])

        def store_tile(value, io, out_gmem, rows, cols, first_piece: int = 0) -> int:
            """Write a warpgroup's [tile_m, tile_n] float32 `value` to out_gmem[rows, cols]
            through `io`: whole, or piece by piece through its slots (numbering
            from `first_piece`, as the plain GEMM's epilogue). Returns the next piece."""
            if whole_tiles:
                # The previous store from the staging tile must be done reading it.
                plgpu.wait_smem_to_gmem(0, wait_read_only=True)
                io[...] = value.astype(dtype)
                store_staged(io, out_gmem, rows, cols)
                return first_piece
            if first_piece == 0:  # the previous block's last pieces must have been read
                plgpu.wait_smem_to_gmem(0, wait_read_only=True)
            piece = first_piece
            for r in range(0, tile_m, _PIECE):
                for c in range(0, tile_n, _PIECE):
                    slot = io.at[piece % _PIECE_SLOTS]
                    # The store issued _PIECE_SLOTS pieces ago read this slot; wait until it has.
                    plgpu.wait_smem_to_gmem(_PIECE_SLOTS - 1, wait_read_only=True)
                    slot[...] = value[r:r + _PIECE, c:c + _PIECE].astype(dtype)
                    store_staged(slot, out_gmem, pl.ds(rows.start + r, _PIECE),
                                 pl.ds(cols.start + c, _PIECE))
                    piece += 1
            return piece

        def exchange_site(wg, m_idx, rounds) -> Site:
            return Site(party=wg, cluster_id=m_idx, round_index=rounds, semaphores=semaphores,
                        group=lax.axis_index("m"))

        def epilogue(acc, wg, cols, io, m_idx, rows, rounds, residual):
            """Publish this block's partials, store h while the peers' arrive, collect
            them and normalize."""
            vector = vector_loader(wg, rounds)
            h = pre_norm_sum(acc, vector, io, residual)
            site = exchange_site(wg, m_idx, rounds)
            exchange.publish(row_partials(h), ex_scratch, stats_gmem, site)
            piece = 0
            if store_h:
                piece = store_tile(h, io, h_gmem, rows, cols)
            gathered = exchange.collect(ex_scratch, stats_gmem, site)
            y = normalize(h, gathered, vector)
            exchange.release(ex_scratch)
            store_tile(y, io, y_gmem, rows, cols, piece)

        # Persistent: the grid's clusters walk the row blocks, each cluster
        # exchanging once per block.
        @plgpu.nd_loop((num_blocks,), collective_axes="m", init_carry=jnp.int32(0))
        def _row_blocks(loop_info, carry):
            m_idx = loop_info.index[0]

            def compute_context(eval_pipeline):
                wg = lax.axis_index("wg")
                rows, cols = wg_rows(wg, m_idx), wg_cols(wg)
                io = io_smem.at[wg]
                residual = None
                if has_residual and config.residual_in_registers:
                    # Issued before the K-loop, which hides the loads' latency.
                    residual = plgpu.load(residual_gmem.at[rows, cols], layout=layout,
                                          optimized=False)
                elif has_residual:
                    stage_residual(io, rows, cols, wg)

                @functools.partial(pl.run_scoped, acc_ref=plgpu.ACC((tile_m, tile_n), jnp.float32))
                def _acc_scope(acc_ref):
                    eval_pipeline(acc_ref)
                    epilogue(acc_ref[...], wg, cols, io, m_idx, rows, carry, residual)

            def mma(_, a_smem, b_smem, acc_ref):
                wg = lax.axis_index("wg")
                if config.split_rows:
                    a_smem = a_smem.at[pl.ds(wg * tile_m, tile_m)]
                else:
                    b_smem = b_smem.at[:, pl.ds(wg * tile_n, tile_n)]
                plgpu.wgmma(acc_ref, a_smem, b_smem)
                plgpu.wgmma_wait(config.delay_release)
                return acc_ref

            # Chained: the first block starts the pipeline, the last stops it (every CTA
            # has two or more), so the TMA warpgroup never drains between blocks.
            state = None
            if config.chain_blocks:
                last = m_idx + grid_size(config, num_blocks) >= num_blocks
                state = jnp.where(carry == 0, int(plgpu.PipelinePipeline.START),
                                  jnp.where(last, int(plgpu.PipelinePipeline.STOP),
                                            int(plgpu.PipelinePipeline.STEADY)))
            cta_rows = pl.ds(m_idx * config.cta_m, config.cta_m)
            pipeline(mma, compute_context, state)(
                x_gmem.at[cta_rows, :], w_gmem.at[:, cta_cols], allocations=pipeline_allocs
            )
            return carry + 1

        @pl.when(is_compute)
        def _finish():
            exchange.finish(ex_scratch, _row_blocks)
            plgpu.wait_smem_to_gmem(0, wait_read_only=True)


def post_norm_matmul(
    x: jax.Array,
    w: jax.Array,
    bias: jax.Array | None,
    scale: jax.Array | None,
    norm_bias: jax.Array | None,
    residual: jax.Array | None,
    *,
    kind: Kind,
    eps: float,
    config: PostNormConfig,
    pre_norm_sum: bool = True,
    interpret: bool = False,
) -> tuple[jax.Array, jax.Array | None]:
    """(Norm(x @ w + bias [+ residual]) * scale [+ norm_bias], the pre-norm sum), both in x.dtype.

    x [M, K] and w [K, N] share a 16-bit dtype; residual is [M, N] in that dtype;
    bias, scale, norm_bias are [N] vectors of any float dtype (norm_bias only
    for LayerNorm). With pre_norm_sum=False the sum is not written (None): a
    kernel cannot drop an unused output the way XLA does, and h is as many
    bytes as y.
    """
    m, k = x.shape
    k2, n = w.shape
    if k != k2 or w.dtype != x.dtype:
        raise ValueError(f"x {x.shape} {x.dtype} and w {w.shape} {w.dtype} must share K and dtype")
    if residual is not None and (residual.shape != (m, n) or residual.dtype != x.dtype):
        raise ValueError(f"residual must be {(m, n)} {x.dtype}; "
                         f"got {residual.shape} {residual.dtype}")
    if kind == "rms" and norm_bias is not None:
        raise ValueError("RMSNorm takes no norm_bias")
    check_shape(m, k, n, config, kind, residual=residual is not None)
    if interpret and config.multicast:
        raise ValueError("the interpreter cannot run the multicast (cluster-collective barriers)")
    num_blocks = m // config.cta_m
    if config.transport == "semaphore":
        if interpret:
            raise ValueError("the interpreter cannot allocate global semaphores "
                             "(transport='semaphore'); use 'global'")
        ctas, sms = grid_size(config, num_blocks) * config.cluster_n, _gemm_core.num_sms(False)
        if ctas > sms:
            raise ValueError(f"transport='semaphore' needs every CTA resident: {ctas} CTAs "
                             f"> {sms} SMs (lower grid_clusters)")
    exchange = row_stats_exchange(config, kind, gpu_fences=not interpret)
    out_type = [jax.ShapeDtypeStruct((m, n), x.dtype)] * (2 if pre_norm_sum else 1)
    if (stats := exchange.gmem_scratch(num_blocks)) is not None:
        out_type.append(stats)
    body = functools.partial(
        _kernel,
        kind=kind,
        has_bias=bias is not None,
        has_scale=scale is not None,
        has_norm_bias=norm_bias is not None,
        has_residual=residual is not None,
        store_h=pre_norm_sum,
        eps=float(eps),
        config=config,
        exchange=exchange,
        k=k,
        num_blocks=num_blocks,
    )
    if config.transport == "semaphore":
        # Groups of the grid: (group, rank in group); no cluster.
        layout = dict(grid=(grid_size(config, num_blocks), config.cluster_n),
                      grid_names=("m", "n"))
    else:
        layout = dict(grid=(grid_size(config, num_blocks),), grid_names=("m",),
                      cluster=(config.cluster_n,), cluster_names=("n",))
    call = plgpu.kernel(
        body,
        out_type=tuple(out_type),
        **layout,
        num_threads=_COMPUTE_WGS + 1,
        thread_name="wg",
        # Row reductions stay inside each warp: no cross-warp reduction scratch (the
        # default reserves 2 KiB of shared memory for one).
        compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Lane,
                                             reduction_scratch_bytes=0),
        interpret=plgpu.InterpretGPUParams(detect_races=True) if interpret else False,
    )
    args = [a for a in (x, w, bias, scale, norm_bias, residual) if a is not None]
    outs = call(*args)
    return outs[0], outs[1] if pre_norm_sum else None
