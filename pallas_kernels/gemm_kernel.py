"""The warp-specialized persistent Hopper GEMM shared by `plain_matmul` and `lazy_norm_matmul`.

Shape of the kernel (after jax's `ops/gpu/hopper_matmul_mgpu.py`, with its own
pipeline so that one launch can serve several weight matrices):

    warpgroup 0, 1   MMA: wait `produced[slot]`, wgmma, arrive `consumed[slot]`;
                     after the K-loop the epilogue (`gemm_epilogue`: row scale,
                     column-sum correction, bias, residual, row statistics of Y) writes
                     x.dtype through SMEM and TMA, then arrives `vec_free`
                     for the tile's vectors.
    warpgroup 2      memory: per tile, wait `vec_free` (two tiles back) and TMA
                     the epilogue vectors (row scale/shift, column sums, bias)
                     into SMEM, arriving on `vec_ready`; per K step, wait
                     `consumed[slot]` and TMA the next A and B tiles into
                     `slot`, arriving on `produced[slot]`.

Every hand-off is an mbarrier; every SMEM buffer read by generic loads and
then refilled by TMA is released only after `commit_smem` (the proxy fence).
The interpreter's race detector runs the kernel (tests/test_lazy_norm_matmul.py).

The grid is persistent (one CTA per SM); tiles are (M tile, N tile) pairs over
the concatenated N of all weights, so [wq, wk, wv] cost one launch and no copy.
With `TuningConfig.cluster_dimension`, 2-CTA clusters walk pairs of neighbouring tiles;
each CTA loads half of the operand tile they share, multicast to both, and `consumed` is
a cluster barrier (a slot is refilled once both CTAs' consumers are done with it).
A global step counter runs across tiles, so the TMA producer never drains the
pipeline between tiles. TMA zero-fills out-of-bounds rows and columns on load
and drops them on store, so M and the vectors need no padding to whole tiles
(only to 8 rows, see `TMA_ROW_TILE`).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
import jax.experimental.pallas as pl
import jax.experimental.pallas.mosaic_gpu as plgpu
import jax.numpy as jnp
from jax import lax

from pallas_kernels import hardware
from pallas_kernels.gemm_config import (Epilogue, MatmulDimension, TuningConfig, check_epilogue,
                                        check_shapes, padded_rows, residual_slots)
from pallas_kernels.gemm_epilogue import ResidualPieces
from pallas_kernels.gemm_epilogue import epilogue as _epilogue
from pallas_kernels.padding import crop_rows, pad_rows

Array = jax.Array


def grid_ctas(interpret: bool) -> int:
    """CTAs of the persistent grid at most: one per SM (a few under the interpreter)."""
    return hardware.INTERPRET_GRID_CTAS if interpret else hardware.num_sms()


def _n_tiles(weights: Sequence[jax.ShapeDtypeStruct | Array], cta_tile_n: int) -> list[int]:
    return [pl.cdiv(w.shape[1], cta_tile_n) for w in weights]


def for_weight(n_starts: Sequence[int], n_tiles: Sequence[int], tile, fn) -> None:
    """Run fn(weight index, local N tile) for the weight that owns global N tile `tile` (the
    weights' tiles concatenated: weight i owns [n_starts[i], n_starts[i] + n_tiles[i]))."""
    if len(n_tiles) == 1:
        fn(0, tile)
        return
    for i, (lo, count) in enumerate(zip(n_starts, n_tiles)):
        pl.when((tile >= lo) & (tile < lo + count))(functools.partial(fn, i, tile - lo))


def drain_releases(barriers, total: Array, depth: int) -> None:
    """Wait on the last `depth` releases of a ring of `depth` barriers, so that no barrier
    phase is left unobserved when the CTA exits (`total` releases issued so far)."""

    @pl.loop(jnp.maximum(total - depth, 0), total)
    def _drain(i):
        plgpu.barrier_wait(barriers.at[lax.rem(i, depth)])


def release_done_slot(consumed, carry: Array, ki: Array, steps: int, in_flight: int,
                      groups: int = 1) -> None:
    """After K step `ki`'s wgmmas (`groups` of them) are issued: wait until at most
    `in_flight` steps' wgmmas still run, then release the slot of the step that finished
    (this one, or with one in flight the one before)."""
    plgpu.wgmma_wait(in_flight * groups)
    if not in_flight:
        plgpu.barrier_arrive(consumed.at[lax.rem(carry + ki, steps)])
        return

    @pl.when(ki > 0)
    def _():
        plgpu.barrier_arrive(consumed.at[lax.rem(carry + ki - 1, steps)])


def release_last_slot(consumed, carry: Array, k_iters: int | Array, steps: int,
                      in_flight: int) -> None:
    """After a tile's K-loop: with a step in flight, finish it and release its slot."""
    if in_flight:
        plgpu.wgmma_wait(0)
        plgpu.barrier_arrive(consumed.at[lax.rem(carry + k_iters - 1, steps)])


def _swizzled(shape: tuple[int, ...], dtype: jnp.dtype, width: int) -> plgpu.SMEM:
    """SMEM tile with the widest swizzle that `width` columns allow (what wgmma and TMA want)."""
    swizzle = plgpu.find_swizzle(width * jnp.dtype(dtype).itemsize * 8)
    swizzle_elems = swizzle // jnp.dtype(dtype).itemsize
    return plgpu.SMEM(
        shape,
        dtype,
        transforms=(plgpu.TilingTransform((8, swizzle_elems)), plgpu.SwizzleTransform(swizzle)),
    )


def _gained(a_tile, gain_tile, staging=None):
    """x's [tile_m, tile_k] tile times the gain's [tile_k] slice: wgmma's A operand, in
    registers (the WGMMA layout). The proxy fence orders these reads before the TMA that
    refills the slot once it is released. The interpreter takes no register operand for
    wgmma: there the product goes through this warpgroup's `staging` tile in SMEM."""
    a = plgpu.load(a_tile, layout=plgpu.Layout.WGMMA)
    g = plgpu.load(gain_tile, layout=plgpu.Layout.WGMMA.reduce(0))
    a = a * lax.broadcast_in_dim(g, a.shape, [1])
    if staging is not None:
        staging[...] = a
    plgpu.commit_smem()
    return a if staging is None else staging


def _kernel(*refs, num_weights: int, config: TuningConfig, epilogue: Epilogue, n_tiles: list[int],
            interpret: bool):
    refs = list(refs)
    x_gmem = refs.pop(0)
    w_gmems = [refs.pop(0) for _ in range(num_weights)]
    gain_gmem = refs.pop(0) if epilogue.column_gain else None
    # Vectors the memory warpgroup stages into SMEM for each tile's epilogue.
    row_names = [n for n in ("row_scale", "row_shift") if getattr(epilogue, n)]
    col_names = [n for n in ("col_sums", "col_bias") if getattr(epilogue, n)]
    row_gmems = {n: refs.pop(0) for n in row_names}
    # One column vector per weight: no per-call concatenation.
    col_gmems = {n: [refs.pop(0) for _ in range(num_weights)] for n in col_names}
    residual_gmem = refs.pop(0) if epilogue.residual else None
    out_gmems = [refs.pop(0) for _ in range(num_weights)]
    stats_out_gmems = (refs.pop(0), refs.pop(0)) if epilogue.row_stats_out else None
    assert not refs, refs

    dtype = x_gmem.dtype
    out_dtype = out_gmems[0].dtype
    m, k = x_gmem.shape
    tile_m, tile_n, tile_k = config.tile_m, config.tile_n, config.tile_k
    cta_tile_m, cta_tile_n = config.cta_tile_m, config.cta_tile_n
    epi_m, epi_n = config.epi_tile_m, config.epi_tile_n
    m_iters = pl.cdiv(m, cta_tile_m)
    k_iters = k // tile_k
    n_iters = sum(n_tiles)
    n_starts = [sum(n_tiles[:i]) for i in range(num_weights)]
    weights_n = [w.shape[1] for w in w_gmems]
    steps = config.max_concurrent_steps
    num_mma_wgs, memory_wg = 2, 2
    # Who releases a slot (and a tile's vectors): both MMA warpgroups, or its tile's owner.
    releasers = 1 if config.pingpong else num_mma_wgs
    # Pingpong: one ring of slots, filled in tile order, but a set of fill barriers per
    # owner, so each warpgroup waits on every phase of its own barriers (Pallas tracks a
    # barrier's phase by counting the waiting warpgroup's own waits).
    fill_sets = num_mma_wgs if config.pingpong else 1
    in_flight = config.wgmma_in_flight
    staging_slots = (residual_slots(config, jnp.dtype(dtype).itemsize) if epilogue.residual
                     else 2)
    num_vectors = len(row_names) + len(col_names)
    wg_parts = cta_tile_n // tile_n  # row-statistics parts per CTA tile

    # With a cluster the grid walks tile pairs; both CTAs of a cluster see the same pair.
    cluster = config.cluster_dimension
    walk = (m_iters // (2 if cluster == MatmulDimension.M else 1),
            n_iters // (2 if cluster == MatmulDimension.N else 1))

    def tile_coords(lin_idx):
        m_idx, n_idx = plgpu.planar_snake(
            lin_idx, walk, config.grid_minor_dim, config.grid_tile_width
        )
        if cluster == MatmulDimension.M:
            m_idx = 2 * m_idx + lax.axis_index("cluster")
        elif cluster == MatmulDimension.N:
            n_idx = 2 * n_idx + lax.axis_index("cluster")
        return m_idx, n_idx

    def shared(dimension):
        """An operand load's collective axes: the cluster's if it lies along `dimension`."""
        return ("cluster",) if cluster == dimension else None

    owner = functools.partial(for_weight, n_starts, n_tiles)

    def filled(produced, local_index, slot):
        """The barrier a slot's fill arrives on: with pingpong, the tile owner's set."""
        if fill_sets == 1:
            return produced.at[slot]
        return produced.at[lax.rem(local_index, fill_sets) * steps + slot]

    scratch = dict(
        a_smem=_swizzled((steps, cta_tile_m, tile_k), dtype, tile_k),
        # Swizzled by the per-warpgroup width, so each warpgroup's half is a whole swizzle tile.
        b_smem=_swizzled((steps, tile_k, cta_tile_n), dtype, tile_n),
        # Output staging; with a residual, the slots each piece's residual lands in by TMA
        # and its y leaves from (`gemm_config.residual_slots`).
        out_smem=_swizzled((num_mma_wgs, staging_slots, epi_m, epi_n), out_dtype, epi_n),
        # Two TMA copies (A and B, and the gain's slice with one) arrive on each produced barrier.
        produced=plgpu.Barrier(num_arrivals=2 + (gain_gmem is not None),
                               num_barriers=fill_sets * steps),
        consumed=plgpu.Barrier(num_arrivals=releasers, num_barriers=steps),
    )
    if cluster is not None:
        # A slot is refilled (by both CTAs' multicasts) once both CTAs' consumers are done.
        scratch["consumed"] = plgpu.ClusterBarrier(
            collective_axes=("cluster",), num_arrivals=num_mma_wgs, num_barriers=steps
        )
    if num_vectors:
        # Epilogue vectors of a tile, double-buffered by the CTA's tile parity.
        scratch["row_smem"] = plgpu.SMEM((2, max(len(row_names), 1), cta_tile_m), jnp.float32)
        scratch["col_smem"] = plgpu.SMEM((2, max(len(col_names), 1), cta_tile_n), jnp.float32)
        scratch["vec_ready"] = plgpu.Barrier(num_arrivals=num_vectors, num_barriers=2)
        scratch["vec_free"] = plgpu.Barrier(num_arrivals=releasers, num_barriers=2)
    if gain_gmem is not None:
        scratch["gain_smem"] = plgpu.SMEM((steps, tile_k), dtype)
        if interpret:
            scratch["gained_smem"] = _swizzled((num_mma_wgs, tile_m, tile_k), dtype, tile_k)
    if stats_out_gmems is not None:
        scratch["stats_out_smem"] = plgpu.SMEM((num_mma_wgs, 2, tile_m), jnp.float32)
    if residual_gmem is not None:
        scratch["residual_ready"] = plgpu.Barrier(num_barriers=num_mma_wgs * staging_slots)

    def body(a_smem, b_smem, out_smem, produced, consumed, row_smem=None, col_smem=None,
             vec_ready=None, vec_free=None, stats_out_smem=None, residual_ready=None,
             gain_smem=None, gained_smem=None):
        wg_idx = lax.axis_index("wg")

        def memory_warpgroup():
            plgpu.set_max_registers(40, action="decrease")

            @plgpu.nd_loop((walk[0] * walk[1],), collective_axes="sm", init_carry=jnp.int32(0))
            def total_steps(loop_info, carry):
                m_idx, n_idx = tile_coords(loop_info.index[0])
                if num_vectors:
                    parity = lax.rem(loop_info.local_index, 2)

                    # The MMA warpgroups must be done with what this buffer held two tiles ago.
                    @pl.when(loop_info.local_index >= 2)
                    def _():
                        plgpu.barrier_wait(vec_free.at[parity])

                    # Vectors are not padded: TMA zero-fills past M (or N_i).
                    for j, name in enumerate(row_names):
                        plgpu.copy_gmem_to_smem(
                            row_gmems[name].at[pl.ds(m_idx * cta_tile_m, cta_tile_m)],
                            row_smem.at[parity, j],
                            vec_ready.at[parity],
                        )

                    def load_columns(i, local_n):
                        for j, name in enumerate(col_names):
                            plgpu.copy_gmem_to_smem(
                                col_gmems[name][i].at[pl.ds(local_n * cta_tile_n, cta_tile_n)],
                                col_smem.at[parity, j],
                                vec_ready.at[parity],
                            )

                    owner(n_idx, load_columns)

                def issue(i, local_n):
                    @pl.loop(0, k_iters)
                    def _k(ki):
                        step = carry + ki
                        slot = lax.rem(step, steps)
                        fill = filled(produced, loop_info.local_index, slot)

                        # The slot is free once every consumer of its previous
                        # fill has arrived (the first `steps` fills need no wait).
                        @pl.when(step >= steps)
                        def _():
                            plgpu.barrier_wait(consumed.at[slot])

                        k_slice = pl.ds(ki * tile_k, tile_k)
                        # The operand both CTAs of a cluster share: each loads half, multicast.
                        plgpu.copy_gmem_to_smem(
                            x_gmem.at[pl.ds(m_idx * cta_tile_m, cta_tile_m), k_slice],
                            a_smem.at[slot],
                            fill,
                            collective_axes=shared(MatmulDimension.N),
                        )
                        plgpu.copy_gmem_to_smem(
                            w_gmems[i].at[k_slice, pl.ds(local_n * cta_tile_n, cta_tile_n)],
                            b_smem.at[slot],
                            fill,
                            collective_axes=shared(MatmulDimension.M),
                        )
                        if gain_gmem is not None:
                            plgpu.copy_gmem_to_smem(gain_gmem.at[k_slice], gain_smem.at[slot], fill)

                owner(n_idx, issue)
                return carry + k_iters

            drain_releases(consumed, total_steps, steps)
            if num_vectors:
                drain_releases(vec_free, total_steps // k_iters, 2)

        def mma_warpgroup():
            # Registers per thread: 2 x 232 + 40 (memory) = 504 <= 512.
            plgpu.set_max_registers(232, action="increase")
            if config.pingpong:
                wg_m0, wg_n0 = 0, 0
            elif config.wg_dimension == MatmulDimension.M:
                wg_m0, wg_n0 = wg_idx * tile_m, 0
            else:
                wg_m0, wg_n0 = 0, wg_idx * tile_n

            @plgpu.nd_loop((walk[0] * walk[1],), collective_axes="sm", init_carry=jnp.int32(0))
            def _tiles(loop_info, carry):
                m_idx, n_idx = tile_coords(loop_info.index[0])
                parity = lax.rem(loop_info.local_index, 2)
                # With pingpong this warpgroup owns every other tile (parity == wg_idx).

                def tile():
                    def k_loop(acc_ref):
                        def step_fn(ki, acc_ref):
                            slot = lax.rem(carry + ki, steps)
                            plgpu.barrier_wait(filled(produced, loop_info.local_index, slot))
                            a = a_smem.at[slot, pl.ds(wg_m0, tile_m)]
                            if gain_smem is not None:
                                a = _gained(a, gain_smem.at[slot],
                                            None if gained_smem is None else gained_smem.at[wg_idx])
                            plgpu.wgmma(acc_ref, a, b_smem.at[slot, :, pl.ds(wg_n0, tile_n)])
                            # A slot may be refilled only after the wgmma reading it is done.
                            release_done_slot(consumed, carry, ki, steps, in_flight)
                            return acc_ref

                        lax.fori_loop(0, k_iters, step_fn, acc_ref)
                        release_last_slot(consumed, carry, k_iters, steps, in_flight)
                        return acc_ref[...]

                    residual = None
                    if residual_gmem is not None:
                        residual = ResidualPieces(
                            residual_gmem, out_smem.at[wg_idx], residual_ready, wg_idx, config,
                            slots=staging_slots, row0=m_idx * cta_tile_m + wg_m0,
                            col0=n_idx * cta_tile_n + wg_n0)
                        residual.prefetch()
                    acc = pl.run_scoped(k_loop, plgpu.ACC((tile_m, tile_n), jnp.float32))

                    rows = pl.ds(wg_m0, tile_m)
                    cols = pl.ds(wg_n0, tile_n)
                    vectors = {}
                    if num_vectors:
                        plgpu.barrier_wait(vec_ready.at[parity])
                        for j, name in enumerate(row_names):
                            vectors[name] = row_smem.at[parity, j, rows]
                        for j, name in enumerate(col_names):
                            vectors[name] = col_smem.at[parity, j, cols]

                    def store(src, r, c):
                        def copy(i, local_n):
                            col = local_n * cta_tile_n + wg_n0 + c

                            # A piece wholly past N_i is not stored: such a TMA store wrote over
                            # the weight's valid columns on the H200 (docs/mosaic-notes.md).
                            @pl.when(col < weights_n[i])
                            def _():
                                plgpu.copy_smem_to_gmem(
                                    src,
                                    out_gmems[i].at[
                                        pl.ds(m_idx * cta_tile_m + wg_m0 + r, epi_m),
                                        pl.ds(col, epi_n),
                                    ],
                                )

                        owner(n_idx, copy)

                    row_stats = None
                    if stats_out_gmems is not None:
                        part = n_idx * wg_parts + (wg_idx if wg_parts == 2 else 0)
                        row_stats = (
                            stats_out_smem.at[wg_idx],
                            [g.at[part, pl.ds(m_idx * cta_tile_m + wg_m0, tile_m)]
                             for g in stats_out_gmems],
                        )
                    _epilogue(
                        acc,
                        wg_idx=wg_idx,
                        out_smem=out_smem,
                        store=store,
                        vectors=vectors,
                        row_stats=row_stats,
                        residual=residual,
                        config=config,
                        out_dtype=out_dtype,
                        ragged=any(n % cta_tile_n for n in weights_n),
                    )
                    # Release this tile's vectors; the fence orders the reads above
                    # before the TMA writes that will refill the buffer.
                    if num_vectors:
                        plgpu.commit_smem()
                        plgpu.barrier_arrive(vec_free.at[parity])

                if config.pingpong:
                    pl.when(parity == wg_idx)(tile)
                else:
                    tile()
                return carry + k_iters

        lax.cond(wg_idx == memory_wg, memory_warpgroup, mma_warpgroup)
        # Await all output copies before the CTA exits.
        plgpu.wait_smem_to_gmem(0, wait_read_only=True)

    pl.run_scoped(body, **scratch, collective_axes="wg")


def run(
    x: Array,
    weights: Sequence[Array],
    vectors: Sequence[Array],
    *,
    config: TuningConfig,
    epilogue: Epilogue,
    interpret: bool,
    residual: Array | None = None,
) -> tuple[Array, ...]:
    """Run the kernel: (x, *weights, *vectors[, residual]) -> (*outputs[, row_sum, row_m2]).

    vectors, in this order, those the epilogue uses: the column gain [K] (x's dtype), then
    float32 row_scale [M],
    row_shift [M], col_sums [N_i] for every weight, col_bias [N_i] for every weight.
    residual (with `epilogue.residual`): [M, N] of x's dtype, added to y in float32.
    """
    check_shapes(x, weights, config)
    check_epilogue(x, weights, config, epilogue, residual)
    m = x.shape[0]
    m_rows = padded_rows(m)
    x = pad_rows(x, m_rows)
    extra = () if residual is None else (pad_rows(residual, m_rows),)
    results = _build(x, weights, config=config, epilogue=epilogue, interpret=interpret)(
        x, *weights, *vectors, *extra
    )
    outs = tuple(crop_rows(y, m) for y in results[: len(weights)])
    return outs + tuple(results[len(weights):])


def _build(
    x: Array,
    weights: Sequence[Array],
    *,
    config: TuningConfig,
    epilogue: Epilogue,
    interpret: bool,
):
    m, _ = x.shape
    n_tiles = _n_tiles(weights, config.cta_tile_n)
    out_types = [jax.ShapeDtypeStruct((m, w.shape[1]), x.dtype) for w in weights]
    if epilogue.row_stats_out:
        parts = sum(n_tiles) * (config.cta_tile_n // config.tile_n)
        m_pad = pl.cdiv(m, config.cta_tile_m) * config.cta_tile_m
        out_types += [jax.ShapeDtypeStruct((parts, m_pad), jnp.float32)] * 2
    tiles = pl.cdiv(m, config.cta_tile_m) * sum(n_tiles)
    interpret_params = plgpu.InterpretGPUParams(detect_races=True) if interpret else None
    grid = min(grid_ctas(interpret), tiles)
    cluster = {}
    if config.cluster_dimension is not None:
        # Persistent clusters of 2, no more than the GPU holds at once (hardware.py).
        clusters = (grid_ctas(interpret) // 2 if interpret
                    else hardware.resident_clusters(2, hardware.num_sms()))
        grid = min(clusters, tiles // 2)
        cluster = dict(cluster=(2,), cluster_names=("cluster",))
    return plgpu.kernel(
        functools.partial(
            _kernel, num_weights=len(weights), config=config, epilogue=epilogue, n_tiles=n_tiles,
            interpret=interpret,
        ),
        out_type=tuple(out_types),
        grid=(grid,),
        grid_names=("sm",),
        **cluster,
        num_threads=3,
        thread_name="wg",
        compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
        interpret=interpret_params,
    )
