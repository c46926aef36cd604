"""The decode kernel (M <= 64): one weight-streaming mainloop, the epilogue a parameter.

At decode a GEMM is a read of its weights, so what matters is that every SM
streams them at once. Work units are (output, N tile, K split) over the
concatenated N of all outputs (q/k/v in one launch); with `split_k` = S > 1
there are S times as many units as N tiles, each over 1/S of K. Each output
has `streams` weights multiplied by the same x tile: 1 for a plain product,
2 for the gated MLP input (gate and up of one N tile in one unit).

    warpgroups 0..W-1  MMA: per K step wait `produced[slot]`, one wgmma per stream
                       into its [64, tile_n] float32 accumulator, release the previous
                       step's slot (`consumed`, one step's wgmmas left in flight). With
                       the statistic in-kernel, also the x tile's squares (float32) into
                       a [64, 64] register sum. Per unit, S = 1: the epilogue (row
                       scale, bias, `combine` of the streams, cast to x.dtype); S > 1:
                       the float32 partial into its own [s] plane of a [S, M, N_i]
                       output, so every element is written by one unit (race-free).
    warpgroup W        memory: TMA the row scale once (when given) and each unit's bias
                       tiles (double-buffered, `vec_ready`/`vec_free`), and per K step the
                       [x_box, tile_k] x tile (M rounded up to 8 rows, `x_box_rows`;
                       rows past M: TMA zero-fill) and each stream's
                       [tile_k, W * tile_n] weight tile into the next of `stages` slots.

With `reduction="cluster"` the S splits of a tile are the S CTAs of one cluster:
the grid's clusters walk the N tiles, rank s streams K split s, ranks 1..S-1 leave
their float32 accumulators in shared memory, and rank 0 adds them (read through
DSMEM; under the interpreter, which has no DSMEM, through a global scratch) and runs
the epilogue, so the sum needs no second kernel (`_publish_partial`,
`_add_peer_partials`). Where the splits are summed in the kernel, the epilogue can also
add a residual and write the rows' statistics of the sum (`Plan.residual`): the residual
stream's GEMM at decode in one launch.

A step counter runs across a CTA's units, so the pipeline never drains between
them. The row statistic in-kernel (S = 1, where a unit sees all of K, or a cluster
whose ranks' sums of squares rank 0 adds with the partials): the x tile is read from
shared memory in the WGMMA layout, the one Mosaic loads a 128-byte-swizzled tile into
and reduces along rows inside a warp; it needs 64 rows, so rows past the box (never
written) are read too and reach only output rows that are never stored. Knobs and
selection: pallas_kernels/decode_config.py.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any, Literal, NamedTuple

import jax
import jax.experimental.pallas as pl
import jax.experimental.pallas.mosaic_gpu as plgpu
import jax.numpy as jnp
from jax import lax
from jax.experimental.mosaic import gpu as mgpu
from jax.experimental.mosaic.gpu import utils as mgpu_utils
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import gpu

from pallas_kernels import hardware
from pallas_kernels.decode_config import (MAX_ROWS, DecodeConfig, epi_tile_n, split_bounds,
                                          units)
from pallas_kernels.errors import Unsupported
from pallas_kernels.gemm_epilogue import chan_combine, piece_stats
from pallas_kernels.gemm_kernel import (_swizzled, drain_releases, for_weight, grid_ctas,
                                        release_done_slot, release_last_slot)
from pallas_kernels.lazy_norm_matmul import rms_row_scale
from pallas_kernels.padding import round_up
from pallas_kernels.row_stats import ptx_fence, safe_rsqrt, warpgroup_barrier

Array = jax.Array
# y of one output piece from its streams' r * acc + b (float32): None keeps the one stream.
Combine = Callable[[list[Array]], Array] | None


class Unit(NamedTuple):
    """One work unit as a custom epilogue (`Plan.epilogue`) sees it, for the output that owns
    its N tile: the streams' float32 accumulators, which output (static) and its N tile, the
    MMA warpgroup, the row scale ([64], WGMMA.reduce(1); None without one), the SMEM copies
    of `Plan.constants`, this warpgroup's [2, 64, epi_n] staging buffer, the output's GMEM
    ref and the store box's rows. It stages and stores its own pieces."""

    accs: list[Array]
    output: int
    local_n: Array
    wg: Array
    scale: Array | None
    constants: list[Any]
    out_smem: Any
    out_gmem: Any
    x_box: int


def scaled_input(x: Array, *, scale: Array | None, scale_offset: float,
                 row_scale: Array | None, eps: float) -> tuple[Array, list[Array]]:
    """(x, the row-scale input: [] to take the statistic in the kernel, else [r] float32) of a
    split_k = 1 decode kernel with an input RMSNorm. A gain that is not folded scales x in
    one XLA pass (M*K, the smaller operand), which also takes r of the unscaled x unless
    `row_scale` ([M]) gives it."""
    m = x.shape[0]
    if row_scale is not None and row_scale.shape != (m,):
        raise ValueError(f"row_scale must be [M={m}]; got {row_scale.shape}")
    if scale is not None:
        if row_scale is None:
            row_scale = rms_row_scale(x, eps)
        x = (x.astype(jnp.float32) * (scale.astype(jnp.float32) + scale_offset)).astype(x.dtype)
    return x, [] if row_scale is None else [row_scale.astype(jnp.float32)]


def x_box_rows(m: int) -> int:
    """Rows of x's TMA box and of the output stores: M rounded up to the 8-row swizzle
    atom. The wgmma still multiplies 64 rows; rows past the box hold stale SMEM and only
    reach output rows that are never stored."""
    return min(MAX_ROWS, round_up(m, 8))


@dataclasses.dataclass(frozen=True)
class Plan:
    """What one launch computes besides its tiles. `row_scale`: "given" (an [M] float32
    input), "in_kernel" (from the x tiles, with `eps`; split_k = 1 or a cluster) or None
    (split-K partials); `n_tiles`: each output's N tiles; `combine`: the streams' epilogue.
    `constants`: shapes of float32 inputs staged into SMEM once per CTA (an [M, C] one as
    x's box of rows), read only by `epilogue`, which replaces the built-in epilogue (split_k
    = 1): called once per unit with its `Unit`. `head_halves` (two streams, one warpgroup):
    an output's one weight is passed as both streams, and stream s of N tile t reads its
    columns [(2t + s) tile_n, (2t + s + 1) tile_n): the halves of head t when tile_n is
    head_dim / 2, with no re-layout of the weight. `residual` (one output and stream, whole
    tiles): h = y + r for an [M, N] input r added in float32 before the one rounding, and
    per warpgroup tile the rows' (sum, M2) of h as stored into two [N / tile_n, x_box]
    float32 outputs after h (`jaxnorm.row_stats.from_partials` combines them)."""

    n_tiles: tuple[int, ...]
    x_box: int
    has_bias: bool
    row_scale: Literal["given", "in_kernel"] | None
    streams: int = 1
    combine: Combine = None
    eps: float = 0.0
    constants: tuple[tuple[int, ...], ...] = ()
    epilogue: Callable[[Unit], None] | None = None
    head_halves: bool = False
    residual: bool = False

    @property
    def per_unit_inputs(self) -> bool:
        """Bias or residual tiles arrive per unit, double-buffered (`vec_ready`/`vec_free`)."""
        return self.has_bias or self.residual

    @property
    def columns_per_tile_column(self) -> int:
        """Weight columns behind each column of an output's N tiles (2 with head_halves)."""
        return 2 if self.head_halves else 1


def _kernel(*refs, config: DecodeConfig, plan: Plan, via_global: bool):
    refs = list(refs)
    split, streams, n_tiles = config.split_k, plan.streams, list(plan.n_tiles)
    cluster = config.cluster_splits
    num_outputs = len(n_tiles)
    x_gmem = refs.pop(0)
    w_gmems = [refs.pop(0) for _ in range(num_outputs * streams)]
    row_gmem = refs.pop(0) if plan.row_scale == "given" else None
    const_gmems = [refs.pop(0) for _ in plan.constants]
    bias_gmems = [refs.pop(0) for _ in range(num_outputs * streams)] if plan.has_bias else None
    residual_gmem = refs.pop(0) if plan.residual else None
    out_gmems = [refs.pop(0) for _ in range(num_outputs)]
    stats_gmems = [refs.pop(0), refs.pop(0)] if plan.residual else None
    partials_gmem = refs.pop(0) if cluster and via_global else None
    in_kernel = plan.row_scale == "in_kernel"
    ssq_gmem = refs.pop(0) if cluster and via_global and in_kernel else None
    assert not refs, refs

    dtype, out_dtype = x_gmem.dtype, out_gmems[0].dtype
    k = x_gmem.shape[1]
    k_iters = k // config.tile_k
    tile_n, tile_k, cta_n = config.tile_n, config.tile_k, config.cta_tile_n
    stages, num_mma, x_box = config.stages, config.warpgroups, plan.x_box
    epi_n = epi_tile_n(config, jnp.dtype(dtype).itemsize)
    weights_n = [w.shape[1] // plan.columns_per_tile_column for w in w_gmems[::streams]]
    # The persistent loop's work items: (tile, split) units, or tiles when a cluster's
    # ranks take a tile's splits together.
    n_units = sum(n_tiles) if cluster else units(config, weights_n)
    n_starts = [sum(n_tiles[:i]) for i in range(num_outputs)]

    def unit_coords(u):
        """(global N tile, split, first K step, K steps) of unit u."""
        if cluster:
            tile, s = u, lax.axis_index("split")
        else:
            tile, s = lax.div(u, split), lax.rem(u, split)
        lo, hi = split_bounds(s, k_iters, split)
        return tile, s, lo, hi - lo

    owner = functools.partial(for_weight, n_starts, n_tiles)

    scratch = dict(
        a_smem=_swizzled((stages, MAX_ROWS, tile_k), dtype, tile_k),
        # Swizzled by the per-warpgroup width: each warpgroup's part is whole swizzle tiles.
        # One buffer per stream (b_smem, b1_smem, ...): one stream allocates what it always did.
        b_smem=_swizzled((stages, tile_k, cta_n), dtype, tile_n),
        **{f"b{j}_smem": _swizzled((stages, tile_k, cta_n), dtype, tile_n)
           for j in range(1, streams)},
        out_smem=_swizzled((num_mma, 2, MAX_ROWS, epi_n), out_dtype, epi_n),
        # x and every stream's weight tile arrive on one produced barrier.
        produced=plgpu.Barrier(num_arrivals=1 + streams, num_barriers=stages),
        consumed=plgpu.Barrier(num_arrivals=num_mma, num_barriers=stages),
    )
    if row_gmem is not None:
        scratch["row_smem"] = plgpu.SMEM((MAX_ROWS,), jnp.float32)
        scratch["row_ready"] = plgpu.Barrier(num_arrivals=1)
    # In a cluster through DSMEM, only rank 0 reads the constants and only ranks 1..S-1 hold
    # partials: one region serves both (`smem_bytes`' `constants`).
    shared_region = cluster and not via_global and bool(plan.constants)
    const_refs = [_constant_smem(shape) for shape in plan.constants]
    if plan.constants:
        if not shared_region:
            scratch.update({f"const{j}_smem": ref for j, ref in enumerate(const_refs)})
        scratch["const_ready"] = plgpu.Barrier(num_arrivals=len(plan.constants))
    if cluster:
        if not via_global:
            partial_refs = [plgpu.SMEM((streams, num_mma, MAX_ROWS, tile_n), jnp.float32)]
            if in_kernel:  # each split's rows' sum of squares of its x tiles
                partial_refs.append(plgpu.SMEM((num_mma, MAX_ROWS), jnp.float32))
            if shared_region:
                scratch["partials_or_constants"] = plgpu.RefUnion(partial_refs, const_refs)
            else:
                scratch["partial_smem"] = partial_refs[0]
                if in_kernel:
                    scratch["partial_ssq_smem"] = partial_refs[1]
        # Every rank's partials are published / rank 0 is done reading them.
        scratch["partial_ready"] = plgpu.ClusterBarrier(collective_axes=("split",),
                                                        num_arrivals=num_mma)
        scratch["partial_free"] = plgpu.ClusterBarrier(collective_axes=("split",),
                                                       num_arrivals=num_mma)
    if plan.has_bias:
        scratch["bias_smem"] = plgpu.SMEM((2, cta_n), jnp.float32)
        scratch.update({f"bias{j}_smem": plgpu.SMEM((2, cta_n), jnp.float32)
                        for j in range(1, streams)})
    if plan.residual:
        # Per unit and MMA warpgroup: its [x_box, tile_n] residual tile (staged like the
        # output pieces), and its rows' (sum, M2) on their way to global memory.
        scratch["res_smem"] = _swizzled((2, num_mma, MAX_ROWS, tile_n), dtype, epi_n)
        scratch["stats_smem"] = plgpu.SMEM((num_mma, 2, MAX_ROWS), jnp.float32)
    if plan.per_unit_inputs:
        arrivals = streams * plan.has_bias + num_mma * plan.residual
        scratch["vec_ready"] = plgpu.Barrier(num_arrivals=arrivals, num_barriers=2)
        scratch["vec_free"] = plgpu.Barrier(num_arrivals=num_mma, num_barriers=2)

    def body(a_smem, out_smem, produced, consumed, row_smem=None, row_ready=None,
             vec_ready=None, vec_free=None, const_ready=None, partial_smem=None,
             partial_ready=None, partial_free=None, partial_ssq_smem=None, res_smem=None,
             stats_smem=None, partials_or_constants=None, **streamed):
        b_smems = [streamed[f"b{j or ''}_smem"] for j in range(streams)]
        bias_smems = ([streamed[f"bias{j or ''}_smem"] for j in range(streams)]
                      if plan.has_bias else None)
        if partials_or_constants is not None:
            partial_group, const_smems = partials_or_constants  # one tree per group
            partial_smem = partial_group[0]
            partial_ssq_smem = partial_group[1] if in_kernel else None
        else:
            const_smems = [streamed[f"const{j}_smem"] for j in range(len(plan.constants))]
        wg_idx = lax.axis_index("wg")

        def on_rank_0(fn):
            """fn where this CTA holds the constants: everywhere, or rank 0 of a cluster
            whose constants share their memory with the partials."""
            if shared_region:
                pl.when(lax.axis_index("split") == 0)(fn)
            else:
                fn()

        def memory_warpgroup():
            plgpu.set_max_registers(40, action="decrease")
            if row_gmem is not None:
                plgpu.copy_gmem_to_smem(row_gmem.at[pl.ds(0, x_box)], row_smem.at[pl.ds(0, x_box)],
                                        row_ready)
            def load_constants():
                for gmem, smem in zip(const_gmems, const_smems):
                    rows = pl.ds(0, x_box) if gmem.ndim == 2 else slice(None)
                    plgpu.copy_gmem_to_smem(gmem.at[rows], smem.at[rows], const_ready)

            on_rank_0(load_constants)

            @plgpu.nd_loop((n_units,), collective_axes="sm",
                           init_carry=(jnp.int32(0), jnp.int32(0)))
            def totals(loop_info, carry):
                step0, _ = carry
                tile, _, k_lo, k_steps = unit_coords(loop_info.index[0])
                if plan.per_unit_inputs:
                    parity = lax.rem(loop_info.local_index, 2)

                    # The MMA warpgroups must be done with what this buffer held two units ago.
                    @pl.when(loop_info.local_index >= 2)
                    def _():
                        plgpu.barrier_wait(vec_free.at[parity])

                def load_bias(i, local_n):
                    for j, bias_smem in enumerate(bias_smems):
                        plgpu.copy_gmem_to_smem(
                            bias_gmems[i * streams + j].at[pl.ds(local_n * cta_n, cta_n)],
                            bias_smem.at[parity], vec_ready.at[parity])

                if plan.has_bias:
                    owner(tile, load_bias)
                if plan.residual:  # one output: its local tile is the tile
                    for w in range(num_mma):
                        plgpu.copy_gmem_to_smem(
                            residual_gmem.at[pl.ds(0, x_box), pl.ds(tile * cta_n + w * tile_n,
                                                                    tile_n)],
                            res_smem.at[parity, w, pl.ds(0, x_box)], vec_ready.at[parity])

                def issue(i, local_n):
                    @pl.loop(0, k_steps)
                    def _k(j):
                        step = step0 + j
                        slot = lax.rem(step, stages)

                        @pl.when(step >= stages)
                        def _():
                            plgpu.barrier_wait(consumed.at[slot])

                        k_slice = pl.ds((k_lo + j) * tile_k, tile_k)
                        plgpu.copy_gmem_to_smem(x_gmem.at[pl.ds(0, x_box), k_slice],
                                                a_smem.at[slot, pl.ds(0, x_box)],
                                                produced.at[slot])
                        for s_, b_smem in enumerate(b_smems):
                            first = 2 * local_n + s_ if plan.head_halves else local_n
                            plgpu.copy_gmem_to_smem(
                                w_gmems[i * streams + s_].at[k_slice,
                                                             pl.ds(first * cta_n, cta_n)],
                                b_smem.at[slot], produced.at[slot])

                owner(tile, issue)
                return step0 + k_steps, loop_info.local_index + 1

            total_steps, local_units = totals

            drain_releases(consumed, total_steps, stages)
            if plan.per_unit_inputs:
                drain_releases(vec_free, local_units, 2)

        def mma_warpgroup():
            # Registers per thread: at most 2 x 232 + 40 (memory) = 504 <= 512.
            plgpu.set_max_registers(232, action="increase")
            wg_n0 = wg_idx * tile_n
            exchange = PartialExchange(
                smem=partial_smem, gmem=partials_gmem, ready=partial_ready, free=partial_free,
                wg=wg_idx, cluster=lax.axis_index("sm"), splits=split,
                gpu_fences=not via_global, ssq_smem=partial_ssq_smem,
                ssq_gmem=ssq_gmem, rows=x_box,
                own_buffer_free=not shared_region) if cluster else None
            if row_gmem is not None:
                plgpu.barrier_wait(row_ready)
            if plan.constants:
                on_rank_0(lambda: plgpu.barrier_wait(const_ready))

            @plgpu.nd_loop((n_units,), collective_axes="sm", init_carry=jnp.int32(0))
            def _units(loop_info, carry):
                step0 = carry
                tile, s, _, k_steps = unit_coords(loop_info.index[0])
                parity = lax.rem(loop_info.local_index, 2)

                def k_loop(*acc_refs):
                    def step_fn(j, carry):
                        slot = lax.rem(step0 + j, stages)
                        plgpu.barrier_wait(produced.at[slot])
                        for acc_ref, b_smem in zip(carry[0] if in_kernel else carry, b_smems):
                            plgpu.wgmma(acc_ref, a_smem.at[slot],
                                        b_smem.at[slot, :, pl.ds(wg_n0, tile_n)])
                        if in_kernel:
                            carry = carry[0], _add_squares(carry[1], a_smem.at[slot])
                        # The previous step's wgmmas are done: its slot may be refilled.
                        release_done_slot(consumed, step0, j, stages, 1, groups=streams)
                        return carry

                    init = ((acc_refs, jnp.zeros((MAX_ROWS, tile_k), jnp.float32)) if in_kernel
                            else acc_refs)
                    carry = lax.fori_loop(0, k_steps, step_fn, init)
                    release_last_slot(consumed, step0, k_steps, stages, 1)
                    return [acc_ref[...] for acc_ref in acc_refs], carry[1] if in_kernel else None

                acc_type = plgpu.ACC((MAX_ROWS, tile_n), jnp.float32)
                accs, squares = pl.run_scoped(k_loop, *[acc_type] * streams)
                # The rows' sum of squares of the x tiles this unit streamed (all of K, or its
                # split's share until the cluster's are added).
                row_ssq = jnp.sum(squares, axis=1) if in_kernel else None
                if cluster:
                    _publish_partial(accs, exchange, loop_info.local_index, row_ssq)
                biases = None
                if plan.per_unit_inputs:
                    plgpu.barrier_wait(vec_ready.at[parity])
                if plan.has_bias:
                    biases = [b.at[parity, pl.ds(wg_n0, tile_n)] for b in bias_smems]
                residual = row_stats = None
                if plan.residual:
                    residual = res_smem.at[parity, wg_idx]
                    part = tile * num_mma + wg_idx  # this warpgroup's tile_n-column block

                    def row_stats(sums, m2s):
                        for j, v in enumerate((sums, m2s)):
                            stats_smem[wg_idx, j] = v
                        plgpu.commit_smem()
                        for j in range(2):
                            plgpu.copy_smem_to_gmem(
                                stats_smem.at[wg_idx, j, pl.ds(0, x_box)],
                                stats_gmems[j].at[part, pl.ds(0, x_box)])

                def store(src, c):
                    def copy(i, local_n):
                        dst = out_gmems[i].at[s] if config.partials_out else out_gmems[i]
                        plgpu.copy_smem_to_gmem(src.at[pl.ds(0, x_box)],
                                                dst.at[pl.ds(0, x_box),
                                                       pl.ds(local_n * cta_n + wg_n0 + c, epi_n)])

                    owner(tile, copy)

                # Columns of this tile inside its weight: pieces past them are skipped whole
                # (their TMA stores wrote over valid columns on the H200, docs/mosaic-notes.md).
                cols_left = sum(
                    jnp.where((tile >= lo) & (tile < lo + t), n - (tile - lo) * cta_n - wg_n0, 0)
                    for lo, t, n in zip(n_starts, n_tiles, weights_n))
                def finish_unit():
                    nonlocal accs, row_ssq
                    if cluster:
                        accs, row_ssq = _add_peer_partials(accs, exchange, row_ssq)
                    scale_of = None
                    if row_smem is not None:
                        def scale_of():
                            return plgpu.load(row_smem, layout=plgpu.Layout.WGMMA.reduce(1))
                    elif in_kernel:
                        def scale_of():
                            return safe_rsqrt(row_ssq * (1.0 / k) + plan.eps)
                    if plan.epilogue is not None:
                        scale = None if scale_of is None else scale_of()

                        def custom(i, local_n):
                            plan.epilogue(Unit(accs, i, local_n, wg_idx, scale, const_smems,
                                               out_smem.at[wg_idx], out_gmems[i], x_box))

                        owner(tile, custom)
                    else:
                        _epilogue(accs, out_smem.at[wg_idx], store, cols_left,
                                  scale_of=scale_of, biases=biases, combine=plan.combine,
                                  epi_n=epi_n, out_dtype=out_dtype, residual=residual,
                                  row_stats=row_stats)

                # In a cluster only rank 0 holds the sum; the other ranks' part is done.
                pl.when(s == 0)(finish_unit) if cluster else finish_unit()
                if plan.per_unit_inputs:
                    # The fence orders the tiles' reads before the TMA that refills the buffer.
                    plgpu.commit_smem()
                    plgpu.barrier_arrive(vec_free.at[parity])
                return step0 + k_steps

            if cluster:
                # The last round's release: rank 0 is done reading this CTA's partial.
                pl.when(lax.axis_index("split") > 0)(functools.partial(_wait_free, exchange))

        lax.cond(wg_idx == num_mma, memory_warpgroup, mma_warpgroup)
        plgpu.wait_smem_to_gmem(0, wait_read_only=True)

    pl.run_scoped(body, **scratch, collective_axes="wg")


class PartialExchange(NamedTuple):
    """One MMA warpgroup's split-K exchange in a cluster (`reduction="cluster"`): its
    [64, tile_n] float32 partial per stream in this CTA's `smem` ([streams, warpgroups, 64,
    tile_n]; rank 0 reads them through DSMEM) or, under the interpreter, in the global
    scratch `gmem` ([clusters, splits, streams, warpgroups, 64, tile_n]); the `ready` and
    `free` cluster barriers; the warpgroup, the cluster's index in the grid, the split
    count, and whether to emit the GPU's memory fences."""

    smem: Any
    gmem: Any
    ready: Any
    free: Any
    wg: Array
    cluster: Array
    splits: int
    gpu_fences: bool
    # With the row statistic in the kernel: the rows' sum of squares of each split's x tiles,
    # [warpgroups, 64] in SMEM or [clusters, splits, warpgroups, 64] in the global scratch.
    ssq_smem: Any = None
    ssq_gmem: Any = None
    # Rows of x's tile (`x_box_rows`): the partials' rows that hold data. Where rank 0's own
    # partial buffer is free (it does not share its region with the constants), rank 0
    # reads only these rows of its peers' (`_plus_dsmem_partial_rows`).
    rows: int = MAX_ROWS
    own_buffer_free: bool = False


def _cluster_fence(ex: PartialExchange) -> None:
    """Order this thread's partial-tile accesses against its peers' at cluster scope: a
    cluster barrier's remote arrive releases at CTA scope only (docs/mosaic-notes.md)."""
    if ex.gpu_fences:
        ptx_fence("fence.acq_rel.cluster;")


def _release_to_cluster(ex: PartialExchange) -> None:
    """Before an arrival that hands the partial buffers over (`ready`: ranks 1..S-1's stores;
    `free`: rank 0's DSMEM reads): the cluster fence, then a warpgroup barrier. A cluster
    barrier's arrival is one thread per peer CTA (thread 8p on rank p's barrier, warps 0 and 1;
    `mgpu.CollectiveBarrierRef.arrive`), so without the barrier a peer could see the phase
    complete while warps 2 and 3 still store or read, and after the last round exit while
    rank 0 still reads its shared memory (tests/test_cuda_lowering_cluster_exchange.py)."""
    _cluster_fence(ex)
    if ex.gpu_fences:
        warpgroup_barrier()


def _wait_free(ex: PartialExchange) -> None:
    plgpu.barrier_wait(ex.free)
    _cluster_fence(ex)


def _publish_partial(accs: list[Array], ex: PartialExchange, round_index: Array,
                     row_ssq: Array | None = None) -> None:
    """Every rank's part of one round of the exchange, before rank 0 reads: ranks 1..S-1 store
    their partials (and `row_ssq`, [64]) once rank 0 has read the previous ones (`free`),
    then every rank arrives on and waits for `ready`. Each rank arrives on and waits for
    every phase of both barriers, so none exits while a peer's arrival on it may still be
    on its way."""
    rank = lax.axis_index("split")

    @pl.when(rank > 0)
    def _store():
        pl.when(round_index > 0)(functools.partial(_wait_free, ex))
        for j, acc in enumerate(accs):
            if ex.gmem is not None:
                ex.gmem[ex.cluster, rank, j, ex.wg] = acc
            else:
                ex.smem[j, ex.wg] = acc
        if row_ssq is not None:
            if ex.ssq_gmem is not None:
                ex.ssq_gmem[ex.cluster, rank, ex.wg] = row_ssq
            else:
                ex.ssq_smem[ex.wg] = row_ssq
        _release_to_cluster(ex)

    plgpu.barrier_arrive(ex.ready)
    plgpu.barrier_wait(ex.ready)
    _cluster_fence(ex)

    @pl.when(rank > 0)
    def _done():  # nothing more to read here: rank 0's arrival completes the phase
        plgpu.barrier_arrive(ex.free)


def _add_peer_partials(accs: list[Array], ex: PartialExchange,
                       row_ssq: Array | None = None) -> tuple[list[Array], Array | None]:
    """Rank 0: its partials (and `row_ssq`) plus ranks 1..S-1's, then `free` for them to
    reuse their buffers."""
    row = plgpu.Layout.WGMMA.reduce(1)
    totals = []
    for j, acc in enumerate(accs):
        if ex.gmem is None:
            totals.append(
                _plus_dsmem_partial_rows(acc, ex.smem.at[j, ex.wg], ex.splits, ex.rows)
                if ex.own_buffer_free else
                _plus_dsmem_partials(acc, ex.smem.at[j, ex.wg], ex.splits,
                                     plgpu.Layout.WGMMA, mgpu.WGMMA_LAYOUT))
            continue
        for peer in range(1, ex.splits):
            acc = acc + plgpu.load(ex.gmem.at[ex.cluster, peer, j, ex.wg],
                                   layout=plgpu.Layout.WGMMA, optimized=False)
        totals.append(acc)
    if row_ssq is not None:
        if ex.ssq_gmem is None:
            row_ssq = _plus_dsmem_partials(row_ssq, ex.ssq_smem.at[ex.wg], ex.splits, row,
                                           mgpu.WGMMA_ROW_LAYOUT)
        else:
            for peer in range(1, ex.splits):
                row_ssq = row_ssq + plgpu.load(ex.ssq_gmem.at[ex.cluster, peer, ex.wg],
                                               layout=row, optimized=False)
    _release_to_cluster(ex)
    plgpu.barrier_arrive(ex.free)
    _wait_free(ex)
    return totals, row_ssq


def _plus_dsmem_partials(acc: Array, partial_smem, splits: int, layout,
                         mgpu_layout) -> Array:
    """acc + the same SMEM buffer (acc's shape, float32, in `layout`: Mosaic GPU's
    `mgpu_layout`) of cluster ranks 1..splits-1, read through DSMEM.

    Written against Mosaic GPU directly: `plgpu.cluster_ref` of a scratch buffer (which has
    an offset in shared memory) does not lower under warpgroup semantics in jax 0.11.2 (the
    peer ref's type loses the offset the load expects)."""

    @plgpu.inline_mgpu(arg_types=(plgpu.RefType(), layout),
                       return_type=plgpu.ShapeDtypeStruct(acc.shape, jnp.float32, layout=layout))
    def emit(_ctx, ref, total):
        for peer in range(1, splits):
            total = total + mgpu.FragmentedArray.load_untiled(
                _peer_ref(ref, peer), layout=mgpu_layout, optimized=False)
        return total

    return emit(partial_smem, acc)


def _peer_ref(ref, peer: int):
    """Mosaic GPU: the same SMEM buffer of cluster rank `peer` (DSMEM)."""
    return mgpu_utils.get_cluster_ref(ref, gpu.Dimension.x,
                                      mgpu_utils.c(peer, ir.IndexType.get()))


def _plus_dsmem_partial_rows(acc: Array, partial_smem, splits: int, rows: int) -> Array:
    """acc ([64, tile_n] float32, WGMMA layout) + rows [0, rows) of the same SMEM buffer of
    cluster ranks 1..splits-1, read through DSMEM into this CTA's own copy of the buffer
    (rank 0 publishes none). Only x's tile rows hold data, and rows past them reach output
    rows that are never stored (`x_box_rows`): at M <= 8 this reads 1/8 of the tile, in
    16-byte vectors that a thread issues back to back, where the whole tile in the WGMMA
    layout paid a remote round trip per 8 bytes (bench/results/2026-12-05-decode-cold)."""
    layout = plgpu.Layout.WGMMA
    tile_n = acc.shape[1]
    vec = next(v for v in (4, 2, 1) if rows * tile_n % (v * 128) == 0)

    @plgpu.inline_mgpu(arg_types=(plgpu.RefType(), layout),
                       return_type=plgpu.ShapeDtypeStruct(acc.shape, jnp.float32, layout=layout))
    def emit(_ctx, ref, total):
        mgpu_utils.warpgroup_barrier()  # the last round's reads of this buffer are done
        summed = None
        for peer in range(1, splits):
            part = mgpu.FragmentedArray.load_strided(
                mgpu_utils.memref_slice(_peer_ref(ref, peer), slice(0, rows)), vec_size=vec)
            summed = part if summed is None else summed + part
        summed.store_untiled(mgpu_utils.memref_slice(ref, slice(0, rows)))
        mgpu_utils.warpgroup_barrier()  # every thread's rows are in before any reads them
        return total + mgpu.FragmentedArray.load_untiled(ref, layout=mgpu.WGMMA_LAYOUT,
                                                         optimized=False)

    return emit(partial_smem, acc)


def _constant_smem(shape: tuple[int, ...]) -> plgpu.SMEM:
    """SMEM for one of `Plan.constants`: an [M, C] table swizzled as a float32 tile (so that
    it loads in the WGMMA layout), a vector as it is."""
    if len(shape) == 2:
        return _swizzled((MAX_ROWS, shape[1]), jnp.float32, shape[1])
    return plgpu.SMEM(shape, jnp.float32)


def _add_squares(squares: Array, x_tile) -> Array:
    """squares + x^2 (float32) of one [64, tile_k] x tile, read in the WGMMA layout. The proxy
    fence orders the read before the TMA that refills the slot once it is released."""
    x = plgpu.load(x_tile, layout=plgpu.Layout.WGMMA).astype(jnp.float32)
    plgpu.commit_smem()
    return squares + x * x


def _epilogue(accs: list[Array], out_smem, store, cols_left: Array, *, scale_of, biases,
              combine: Combine, epi_n: int, out_dtype, residual=None, row_stats=None) -> None:
    """y = combine(r * acc_j + b_j over the streams j) (r, b where given) [+ the residual
    tile, `residual`: [64, tile_n] in SMEM], stored in [64, epi_n] pieces double-buffered in
    out_smem; pieces at or past `cols_left` are skipped whole, so that every wait below counts
    only stores that were issued. With `row_stats` (a residual's whole tiles: every piece
    is stored), the rows' (sum, M2) of y as stored, pieces Chan-combined, go to
    row_stats(sums, m2s)."""
    tile_n = accs[0].shape[1]
    col_layout = plgpu.Layout.WGMMA.reduce(0)
    scale = None if scale_of is None else scale_of()
    stats = None
    # Drain any store still reading out_smem (or the row statistics) from the previous unit.
    plgpu.wait_smem_to_gmem(0, wait_read_only=True)
    for ni in range(tile_n // epi_n):

        def _piece():
            nonlocal stats
            cols = slice(ni * epi_n, (ni + 1) * epi_n)
            values = []
            for j, acc in enumerate(accs):
                y = acc[:, cols]
                if scale is not None:
                    y = y * lax.broadcast_in_dim(scale, y.shape, [0])
                if biases is not None:
                    b = plgpu.load(biases[j].at[cols], layout=col_layout)
                    y = y + lax.broadcast_in_dim(b, y.shape, [1])
                values.append(y)
            y = values[0] if combine is None else combine(values)
            if residual is not None:
                y = y + plgpu.load(residual.at[:, cols], layout=plgpu.Layout.WGMMA).astype(
                    jnp.float32)
            y = y.astype(out_dtype)
            if row_stats is not None:  # of h as stored, as a reader of h would take them
                piece = piece_stats(y.astype(jnp.float32))
                stats = piece if stats is None else chan_combine(stats, piece, ni * epi_n, epi_n)
            slot = ni % 2
            # The store issued two pieces ago read this slot; wait until it has.
            plgpu.wait_smem_to_gmem(1, wait_read_only=True)
            out_smem[slot] = y
            plgpu.commit_smem()
            store(out_smem.at[slot], ni * epi_n)

        if row_stats is None:
            pl.when(ni * epi_n < cols_left)(_piece)
        else:
            _piece()
    if row_stats is not None:
        row_stats(*stats)


def build(x: Array, weights: Sequence[Array], out_types: Sequence[jax.ShapeDtypeStruct], *,
          config: DecodeConfig, plan: Plan, interpret: bool):
    """The launch: `weights` output-major (each output's `plan.streams` weights together)."""
    if plan.head_halves and (plan.streams != 2 or config.warpgroups != 1):
        raise ValueError("head_halves needs two streams and one MMA warpgroup")
    if plan.residual and (len(weights) != 1 or config.partials_out
                          or weights[0].shape[1] % config.cta_tile_n):
        raise Unsupported(f"a residual epilogue takes one weight whose N is whole CTA tiles "
                          f"({config.cta_tile_n} columns) and the sum of the K splits in the "
                          f"kernel (split_k = 1 or reduction='cluster'); got {config}")
    n_units = units(config, [w.shape[1] // plan.columns_per_tile_column
                             for w in weights[::plan.streams]])
    layout = dict(grid=(min(grid_ctas(interpret), n_units),), grid_names=("sm",))
    out_types = list(out_types)
    via_global = False
    if config.cluster_splits:
        # A cluster per tile at a time: as many as the GPU holds at once, at most one per tile.
        splits, tiles = config.split_k, sum(plan.n_tiles)
        if interpret and splits > hardware.INTERPRET_MAX_CLUSTER:
            raise Unsupported(f"split_k={splits}: the interpreter runs clusters of at most "
                              f"{hardware.INTERPRET_MAX_CLUSTER} CTAs")
        clusters = min(tiles, hardware.INTERPRET_GRID_CTAS // splits if interpret
                       else hardware.resident_clusters(splits, hardware.num_sms()))
        layout = dict(grid=(clusters,), grid_names=("sm",), cluster=(splits,),
                      cluster_names=("split",))
        via_global = interpret  # the interpreter has no DSMEM (plgpu.cluster_ref)
        if via_global:
            out_types.append(jax.ShapeDtypeStruct(
                (clusters, splits, plan.streams, config.warpgroups, MAX_ROWS, config.tile_n),
                jnp.float32))
            if plan.row_scale == "in_kernel":
                out_types.append(jax.ShapeDtypeStruct(
                    (clusters, splits, config.warpgroups, MAX_ROWS), jnp.float32))
    params = dict(lowering_semantics=plgpu.LoweringSemantics.Warpgroup)
    if plan.row_scale == "in_kernel":
        # The row sum of squares stays inside each warp (WGMMA layout): no SMEM scratch.
        params["reduction_scratch_bytes"] = 0
    call = plgpu.kernel(
        functools.partial(_kernel, config=config, plan=plan, via_global=via_global),
        out_type=tuple(out_types),
        **layout,
        num_threads=config.warpgroups + 1,
        thread_name="wg",
        compiler_params=plgpu.CompilerParams(**params),
        interpret=plgpu.InterpretGPUParams(detect_races=True) if interpret else None,
    )
    if not via_global:
        return call
    scratches = 1 + (plan.row_scale == "in_kernel")  # the interpreter's exchange scratch
    return lambda *args: call(*args)[:-scratches]
