"""Post-norm GEMM: Norm(x @ W + b [+ residual]) with the norm fused into the epilogue (Hopper+).

docs/design.md, the post-norm identity. A norm over output rows needs whole rows, which are
wider than one CTA's tile, so a thread-block cluster of `cluster_n` CTAs
covers whole rows: CTA r of the cluster owns columns [r * cta_n, (r + 1) *
cta_n) of the same rows, its two MMA warpgroups one column half each (or,
with `split_rows`, one row half each, so a row has one partial per CTA).
After the K-loop every warpgroup adds the bias (and residual), writes the
pre-norm sum h, reduces its [tile_m, tile_n] part of h to per-row partial
statistics, and the partials (not the tiles) are all-gathered across the
cluster (`row_stats`). Each warpgroup then normalizes its own tile in
registers and writes y (`post_norm_epilogue`). HBM sees x and W once per row block, h and y once.
With `residual_after` the residual is added to y after the gain instead
(r + Norm(x @ W + b): Gemma 2/3's and OLMo 2's post-sublayer norms), read
through the same staging tile or registers.

Partials are those of `row_stats` (float32): RMSNorm a sum of squares;
LayerNorm (shift, shifted mean, M2) with the warpgroup's own mean as shift,
Chan-combined, so rows with |mean| >> std keep their digits.

Kernel shape (after jax's `ops/gpu/hopper_matmul_mgpu.py`): persistent, the
grid's `grid_clusters` clusters walking the row blocks (`plgpu.nd_loop`), so
the TMA warpgroup fetches the next block's first K steps while the MMA
warpgroups run this block's epilogue; `plgpu.emit_pipeline_warp_specialized`
with two MMA warpgroups and a TMA warpgroup for the K-loop, chained across a
CTA's blocks where the stages allow (`chain_blocks`), so it does not drain
between them. The grid holds no more clusters than the GPU runs at once
(`hardware.resident_clusters`). With a residual, each MMA warpgroup stages one
[tile_m, tile_n] tile in shared memory that carries, in turn, the residual
in, h out and y out (or, with `residual_in_registers`, loads the residual
into registers before the K-loop); otherwise h and y leave in
double-buffered 64-row pieces as in the plain GEMM, which leaves the
pipeline the shared memory for its stages. h is written only when asked for
(`pre_norm_sum`): the residual stream and autodiff need it, inference does not.

With `transport="semaphore"` (GPU only) the CTAs that share a row are a group
of the grid (axes "m" x "n") rather than a cluster, so rows of 4096 take
128 x 256 CTA tiles in groups of 16 and every SM can work; the statistics then
go through global memory and semaphores (`row_stats`).
`select_gpu_config` takes a group wherever it needs fewer rounds than clusters.
Configs and selection: `post_norm_config`.
"""

from __future__ import annotations

import functools

import jax
import jax.experimental.pallas as pl
import jax.experimental.pallas.mosaic_gpu as plgpu
import jax.numpy as jnp
from jax import lax

from pallas_kernels import hardware
from pallas_kernels.errors import Unsupported
from pallas_kernels.post_norm_config import (COMPUTE_WGS, PIECE, PIECE_SLOTS, PostNormConfig,
                                             check_shape, grid_size, max_n, row_stats_exchange,
                                             select_config, select_gpu_config, smem_bytes)
from pallas_kernels.post_norm_epilogue import LAYOUT, EpilogueRefs, epilogue
from pallas_kernels.row_stats import Kind, RowStatsExchange

__all__ = ["PostNormConfig", "check_shape", "grid_size", "max_n", "post_norm_matmul",
           "row_stats_exchange", "select_config", "select_gpu_config", "smem_bytes"]

def _kernel(
    *refs,
    kind: Kind,
    has_bias: bool,
    has_scale: bool,
    has_norm_bias: bool,
    has_residual: bool,
    residual_after: bool,
    store_h: bool,
    output_stats: bool,
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
    stats_gmem = refs.pop(0) if exchange.gathered_in_global else None
    y_stats_gmem = (refs.pop(0), refs.pop(0)) if output_stats else None
    assert not refs

    dtype = x_gmem.dtype
    tile_m, tile_n, tile_k = config.tile_m, config.tile_n, config.tile_k
    n_cluster = config.cluster_n
    swizzle = plgpu.find_swizzle(tile_k * jnp.dtype(dtype).itemsize * 8)
    swizzle_elems = swizzle // jnp.dtype(dtype).itemsize
    transforms = (plgpu.TilingTransform((8, swizzle_elems)), plgpu.SwizzleTransform(swizzle))
    whole_tiles = has_residual and not config.residual_in_registers
    io_swizzle = plgpu.find_swizzle((tile_n if whole_tiles else PIECE)
                                    * jnp.dtype(dtype).itemsize * 8)
    io_transforms = (
        plgpu.TilingTransform((8, io_swizzle // jnp.dtype(dtype).itemsize)),
        plgpu.SwizzleTransform(io_swizzle),
    )
    # Per MMA warpgroup: a whole staged tile, or two 64-row pieces taking turns.
    io_shape = (tile_m, tile_n) if whole_tiles else (PIECE_SLOTS, PIECE, PIECE)
    rank = lax.axis_index("n") if n_cluster > 1 else 0
    cta_cols = pl.ds(rank * config.cta_n, config.cta_n)
    # Copies of the epilogue vectors in shared memory: one per MMA warpgroup's columns.
    vec_copies = 1 if config.split_rows else COMPUTE_WGS
    # Where MMA warpgroup `wg` sits in the CTA's tile (rows, columns).
    wg_offsets = ((lambda wg: (wg * tile_m, 0)) if config.split_rows
                  else (lambda wg: (0, wg * tile_n)))
    vectors = [(v, g) for v, g in ((bias_gmem, "bias"), (scale_gmem, "scale"),
                                   (norm_bias_gmem, "norm_bias")) if v is not None]

    def pipeline(body, compute_context, state=None):
        return plgpu.emit_pipeline_warp_specialized(
            body,
            grid=(k // tile_k,),
            memory_registers=40,
            in_specs=[
                plgpu.BlockSpec((config.cta_m, tile_k), lambda kk: (0, kk),
                                transforms=transforms),
                plgpu.BlockSpec((tile_k, config.cta_n), lambda kk: (kk, 0), transforms=transforms),
            ],
            wg_axis="wg",
            num_compute_wgs=COMPUTE_WGS,
            max_concurrent_steps=config.max_concurrent_steps,
            compute_context=compute_context,
            pipeline_state=state,
        )

    ignore = lambda *_, **__: None  # noqa: E731  (allocations do not depend on the bodies)

    @functools.partial(
        pl.run_scoped,
        pipeline_allocs=pipeline(ignore, ignore).get_allocations(x_gmem, w_gmem),
        io_smem=plgpu.SMEM((COMPUTE_WGS, *io_shape), dtype, transforms=io_transforms),
        vec_smem=[plgpu.SMEM((vec_copies, tile_n), v.dtype) for v, _ in vectors],
        io_barrier=plgpu.Barrier(num_barriers=COMPUTE_WGS),
        vec_barrier=plgpu.Barrier(num_arrivals=max(len(vectors), 1), num_barriers=vec_copies),
        ex_scratch=exchange.smem_scratch(),
        collective_axes="wg",
    )
    def _scope(pipeline_allocs, io_smem, vec_smem, io_barrier, vec_barrier, ex_scratch):
        wg = lax.axis_index("wg")
        is_compute = wg < COMPUTE_WGS
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

        refs = EpilogueRefs(
            kind=kind, eps=eps, config=config, exchange=exchange, has_bias=has_bias,
            has_scale=has_scale, has_norm_bias=has_norm_bias, has_residual=has_residual,
            residual_after=residual_after, whole_tiles=whole_tiles, dtype=dtype,
            vec_names=[name for _, name in vectors], vec_smem=vec_smem, vec_copies=vec_copies,
            vec_barrier=vec_barrier,
            io_barrier=io_barrier, ex_scratch=ex_scratch, stats_gmem=stats_gmem,
            h_gmem=h_gmem, y_gmem=y_gmem, y_stats_gmem=y_stats_gmem, semaphores=semaphores)

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
                    residual = plgpu.load(residual_gmem.at[rows, cols], layout=LAYOUT,
                                          optimized=False)
                elif has_residual:
                    stage_residual(io, rows, cols, wg)

                @functools.partial(pl.run_scoped, acc_ref=plgpu.ACC((tile_m, tile_n), jnp.float32))
                def _acc_scope(acc_ref):
                    eval_pipeline(acc_ref)
                    # y's tile_n-column block among the row's (its row statistics' slot).
                    part = None
                    if output_stats:
                        part = rank * (config.cta_n // tile_n) + (0 if config.split_rows else wg)
                    epilogue(refs, acc_ref[...], wg, cols, io, m_idx, rows, carry, residual,
                             part)

            def mma(_, a_smem, b_smem, acc_ref):
                wg = lax.axis_index("wg")
                if config.split_rows:
                    a_smem = a_smem.at[pl.ds(wg * tile_m, tile_m)]
                else:
                    b_smem = b_smem.at[:, pl.ds(wg * tile_n, tile_n)]
                plgpu.wgmma(acc_ref, a_smem, b_smem)
                plgpu.wgmma_wait(0)
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
    residual_after: bool = False,
    output_stats: bool = False,
    interpret: bool = False,
) -> tuple:
    """(Norm(x @ w + bias [+ residual]) * scale [+ norm_bias], the pre-norm sum), both in x.dtype.

    x [M, K] and w [K, N] share a 16-bit dtype; residual is [M, N] in that dtype;
    bias, scale, norm_bias are [N] vectors of any float dtype (norm_bias only
    for LayerNorm). With pre_norm_sum=False the sum is not written (None): a
    kernel cannot drop an unused output the way XLA does, and h is as many
    bytes as y. With `residual_after` the output is residual + Norm(x @ w + bias)
    * scale [+ norm_bias] (Gemma 2/3, OLMo 2), the add in float32 before the one
    rounding; it needs a residual and pre_norm_sum=False (the staged residual
    tile is read after the norm, where h would have overwritten it).

    With `output_stats`, (y, h, (sum_parts, m2_parts)): float32 [N / tile_n, M] partials of
    the float32 y before its rounding, per warpgroup tile of tile_n columns, the sum and
    the M2 about the block's own mean, as `residual_matmul` writes them (combine with
    `jaxnorm.row_stats.from_partials`): the next pre-norm's statistics of
    r + Norm(x @ w + b).
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
    if residual_after and (residual is None or pre_norm_sum):
        raise ValueError("residual_after needs a residual and pre_norm_sum=False; got "
                         f"residual={'None' if residual is None else 'given'}, "
                         f"pre_norm_sum={pre_norm_sum}")
    check_shape(m, k, n, config, kind, residual=residual is not None)
    num_blocks = m // config.cta_m
    if config.transport == "semaphore":
        if interpret:
            raise Unsupported("the interpreter cannot allocate global semaphores "
                             "(transport='semaphore'); use 'global'")
        ctas, sms = grid_size(config, num_blocks) * config.cluster_n, hardware.num_sms()
        if ctas > sms:
            raise Unsupported(f"transport='semaphore' needs every CTA resident: {ctas} CTAs "
                             f"> {sms} SMs (lower grid_clusters)")
    exchange = row_stats_exchange(config, kind, gpu_fences=not interpret)
    out_type = [jax.ShapeDtypeStruct((m, n), x.dtype)] * (2 if pre_norm_sum else 1)
    if (stats := exchange.gmem_scratch(num_blocks)) is not None:
        out_type.append(stats)
    if output_stats:
        out_type += [jax.ShapeDtypeStruct((n // config.tile_n, m), jnp.float32)] * 2
    body = functools.partial(
        _kernel,
        kind=kind,
        has_bias=bias is not None,
        has_scale=scale is not None,
        has_norm_bias=norm_bias is not None,
        has_residual=residual is not None,
        residual_after=residual_after,
        store_h=pre_norm_sum,
        output_stats=output_stats,
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
        num_threads=COMPUTE_WGS + 1,
        thread_name="wg",
        # Row reductions stay inside each warp: no cross-warp reduction scratch (the
        # default reserves 2 KiB of shared memory for one).
        compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Lane,
                                             reduction_scratch_bytes=0),
        interpret=plgpu.InterpretGPUParams(detect_races=True) if interpret else False,
    )
    args = [a for a in (x, w, bias, scale, norm_bias, residual) if a is not None]
    outs = call(*args)
    y, h = outs[0], outs[1] if pre_norm_sum else None
    return (y, h, (outs[-2], outs[-1])) if output_stats else (y, h)
