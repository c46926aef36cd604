"""The post-norm GEMM's tuning knobs, shared-memory model and per-shape selection.

`select_config` picks tiles, pipeline and grid for one transport; `select_gpu_config`
picks between a cluster and a grid group on the GPU. The kernel is
`pallas_kernels.post_norm_matmul`; the measurements behind the picks are in
docs/post-norm.md, measured picks.
"""

from __future__ import annotations

import dataclasses

import jax.experimental.pallas as pl
import jax.numpy as jnp

from pallas_kernels import hardware
from pallas_kernels.errors import Unsupported
from pallas_kernels.row_stats import Kind, RowStatsExchange, Transport, num_stats

# CTAs of a grid group ("semaphore" transport): 16 x 256 columns = rows of 4096.
_MAX_GROUP = 16
COMPUTE_WGS = 2
PIECE = 64  # output pieces are PIECE x PIECE (rows x columns)
# Shared-memory slots per warpgroup that pieces take turns in: one is filled while the
# other's store drains (one slot measured slower on the H200: docs/post-norm.md).
PIECE_SLOTS = 2
_SUPPORTED_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
# (tile_m, tile_n) per MMA warpgroup in order of preference: 128 x 128 (the
# 128 x 256 CTA tile of the jax Hopper matmul) reuses W best; 64 x 256 reaches
# rows of 8 x 512 columns; the rest serve small M or N. Each keeps the float32
# accumulator at <= 128 registers per thread.
_TILES = ((128, 128), (64, 256), (128, 64), (64, 128), (64, 64))


def _max_split(transport: Transport) -> int:
    """CTAs that may share a row: a cluster's, or a grid group's (semaphore transport)."""
    return _MAX_GROUP if transport == "semaphore" else hardware.MAX_CLUSTER


def _cta_tile(tile_m: int, tile_n: int, split_rows: bool) -> tuple[int, int]:
    """A CTA's tile: its two MMA warpgroups' tiles stacked (`split_rows`) or side by side."""
    if split_rows:
        return COMPUTE_WGS * tile_m, tile_n
    return tile_m, COMPUTE_WGS * tile_n


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
      chain_blocks: run a CTA's row blocks as one chained pipeline (jax's
        `pipeline_state`), so the TMA warpgroup fetches the next block's first K
        steps as soon as slots free up instead of after the block's last step;
        needs (K / tile_k) % max_concurrent_steps == 0.
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
    # pieces, as in the plain GEMM.
    if residual and not config.residual_in_registers:
        staging = COMPUTE_WGS * config.tile_m * config.tile_n * itemsize
    else:
        staging = COMPUTE_WGS * PIECE_SLOTS * PIECE * PIECE * itemsize
    vectors = (2 if kind == "rms" else 3) * config.cta_n * 4  # bias, gain (, beta)
    rows = -(-config.cta_m // 32) * 32
    # Partials gathered in shared memory (DSMEM); through global memory they are read in place.
    partials = 0
    if config.transport == "dsmem" or config.cluster_n == 1:
        partials = config.cluster_n * COMPUTE_WGS * num_stats(kind) * rows * 4
    barriers = 64 + 16 * config.max_concurrent_steps
    return config.max_concurrent_steps * stage + staging + vectors + partials + barriers


def check_shape(m: int, k: int, n: int, config: PostNormConfig, kind: Kind = "layer", *,
                residual: bool = False) -> None:
    """Raise Unsupported naming the dimension that does not divide the tile."""
    if m % config.cta_m:
        raise Unsupported(f"M={m} must be divisible by the CTA's {config.cta_m} rows")
    if k % config.tile_k:
        raise Unsupported(f"K={k} must be divisible by tile_k={config.tile_k}")
    if n != config.cluster_n * config.cta_n:
        raise Unsupported(
            f"N={n} must equal cluster_n={config.cluster_n} x the CTA's "
            f"{config.cta_n} columns: a cluster covers whole output rows"
        )
    if config.chain_blocks:
        if (k // config.tile_k) % config.max_concurrent_steps:
            raise Unsupported(f"chain_blocks needs K / tile_k = {k // config.tile_k} steps "
                             f"divisible by max_concurrent_steps={config.max_concurrent_steps}")
        blocks = m // config.cta_m
        if blocks < 2 * grid_size(config, blocks):
            raise Unsupported(f"chain_blocks needs two or more row blocks per cluster: {blocks} "
                             f"blocks for {grid_size(config, blocks)} clusters")
    needed = smem_bytes(config, kind, residual=residual)
    if needed > hardware.SMEM_BYTES_PER_CTA:
        raise Unsupported(f"{config} needs {needed} bytes of shared memory"
                         f"{' (with a residual)' if residual else ''}")


def row_stats_exchange(config: PostNormConfig, kind: Kind, *,
                       gpu_fences: bool = True) -> RowStatsExchange:
    """How the kernel under `config` exchanges its rows' partials: one per MMA warpgroup
    that covers a row (two per CTA, or one with `split_rows`), once per row block."""
    return RowStatsExchange(axis="n", cluster_size=config.cluster_n, parties=COMPUTE_WGS,
                            num_stats=num_stats(kind), rows=config.tile_m,
                            transport=config.transport, gpu_fences=gpu_fences, repeated=True,
                            row_split=config.split_rows)


def max_n() -> int:
    """The widest output row one cluster can cover (8 CTAs x 2 warpgroups x 256 columns)."""
    return hardware.MAX_CLUSTER * COMPUTE_WGS * 256


def grid_size(config: PostNormConfig, num_blocks: int) -> int:
    """Clusters (or grid groups) launched: each walks row blocks."""
    return min(config.grid_clusters or num_blocks, num_blocks)


# (tile_k, stages, chain_blocks): 64-wide K steps first, then by bytes in flight; four
# 64-wide stages only with the blocks chained, where they measured faster than three
# (docs/post-norm.md, measured picks).
_PIPELINES = ((64, 4, True), (64, 3, False), (32, 6, False), (32, 5, False), (64, 2, False),
              (32, 4, False), (32, 3, False))


def select_gpu_config(
    m: int, k: int, n: int, dtype: jnp.dtype, *, kind: Kind, residual: bool = False,
    num_sms: int = hardware.H200_SMS,
) -> PostNormConfig:
    """The GPU's pick between a cluster ("dsmem") and a grid group ("semaphore").

    A group's statistics go through global memory and semaphores, a few
    microseconds more per row block than a cluster's DSMEM, but groups need
    not fit in a GPC: they use every SM where clusters of 4 or 8 leave 12 of
    the H200's 132 idle, and rows of 4096 keep 128 x 256 tiles. So a group is
    taken whenever it needs fewer rounds (row blocks per cluster or group), as
    measured on the H200 (docs/post-norm.md, measured picks). A row no cluster of
    <= 8 CTAs covers evenly (Gemma-3-1B's 1152 columns: 9 CTAs of 128) takes a group;
    rows wider than a cluster's `max_n` stay unserved, as the op's rules say.
    """
    try:
        cluster = select_config(m, k, n, dtype, kind=kind, residual=residual,
                                transport="dsmem", num_sms=num_sms)
    except Unsupported as no_cluster:
        if n > max_n():
            raise
        try:
            return select_config(m, k, n, dtype, kind=kind, residual=residual,
                                 transport="semaphore", num_sms=num_sms)
        except Unsupported:
            raise no_cluster from None
    try:
        group = select_config(m, k, n, dtype, kind=kind, residual=residual,
                              transport="semaphore", num_sms=num_sms)
    except Unsupported:
        return cluster
    rounds = [pl.cdiv(m // c.cta_m, grid_size(c, m // c.cta_m)) for c in (cluster, group)]
    return group if rounds[1] < rounds[0] else cluster


def select_config(
    m: int, k: int, n: int, dtype: jnp.dtype, *, kind: Kind, residual: bool = False,
    transport: Transport = "dsmem", max_cluster: int | None = None,
    num_sms: int = hardware.H200_SMS,
) -> PostNormConfig:
    """Tiles per shape; Unsupported (with the reason) where the kernel does not serve it.

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
        raise Unsupported(
            f"the post-norm kernel takes bfloat16 or float16 operands; got {jnp.dtype(dtype).name}"
            " (float32 would run the tensor cores in tf32, below the float32 contract)"
        )
    if n > max_cluster * COMPUTE_WGS * 256:
        raise Unsupported(
            f"N={n} > {max_cluster * COMPUTE_WGS * 256}: a row must fit "
            f"{max_cluster} CTAs x 2 warpgroups x 256 columns"
        )
    # Grid groups stack their warpgroups (64 x 256 each) where they measured faster: one
    # partial a row per CTA instead of two, which a LayerNorm row has three of
    # (docs/post-norm.md, measured picks; LayerNorm without a residual is unmeasured).
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
            grid = hardware.resident_clusters(cluster_n, num_sms)
        grid = min(blocks, grid)
        # LayerNorm with a residual loads it straight into registers, RMSNorm keeps the
        # staged tile: what measured faster for each (docs/post-norm.md, measured picks).
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
                                    split_rows=split_rows)
            if smem_bytes(config, kind, residual=residual) <= hardware.SMEM_BYTES_PER_CTA:
                check_shape(m, k, n, config, kind, residual=residual)
                return config
    raise Unsupported(
        f"no tiling serves M={m}, K={k}, N={n}: M must be a multiple of 64, K of 32 and N "
        f"of 128 with N / (2 tile_n) <= {max_cluster} CTAs"
    )
