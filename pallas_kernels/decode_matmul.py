"""The decode GEMM (M <= 64): diag(r) (X @ W_i) + b_i for several weights, streaming weights.

At decode a GEMM is a read of its weights, so what matters is that every SM
streams them at once. Work units are (weight, N tile, K split) over the
concatenated N of all weights (q/k/v or gate/up in one launch); with
`split_k` = S > 1 there are S times as many units as N tiles, each over 1/S of K.

    warpgroups 0..W-1  MMA: per K step wait `produced[slot]`, wgmma a [64, tile_n]
                       float32 accumulator, release the previous step's slot
                       (`consumed`, one wgmma left in flight). Per unit, S = 1:
                       the epilogue (row scale, bias, cast to x.dtype); S > 1: the
                       float32 partial into its own [s] plane of a [S, M, N_i]
                       output, so every element is written by one unit (race-free).
    warpgroup W        memory: TMA the row scale once and each unit's bias tile
                       (double-buffered, `vec_ready`/`vec_free`), and per K step the
                       [x_box, tile_k] x tile (M rounded up to 8 rows, `x_box_rows`;
                       rows past M: TMA zero-fill) and the
                       [tile_k, W * tile_n] weight tile into the next of `stages` slots.

A step counter runs across a CTA's units, so the pipeline never drains between
them. The partials are summed, scaled and biased in one XLA fusion (M*N*S
floats: small at decode). Knobs and selection: pallas_kernels/decode_config.py.
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
from pallas_kernels.decode_config import (MAX_ROWS, DecodeConfig, check_shapes, decode_config,
                                          epi_tile_n, split_bounds, units, x_box_rows)
from pallas_kernels.gemm_kernel import _swizzled, drain_releases, for_weight, grid_ctas
from pallas_kernels.lazy_norm_matmul import rms_row_scale

__all__ = ["MAX_ROWS", "DecodeConfig", "decode_config", "decode_rms_norm_dense",
           "lazy_rms_decode_matmul"]

Array = jax.Array


def _kernel(*refs, config: DecodeConfig, n_tiles: list[int], has_bias: bool, x_box: int):
    refs = list(refs)
    split = config.split_k
    num_weights = len(n_tiles)
    x_gmem = refs.pop(0)
    w_gmems = [refs.pop(0) for _ in range(num_weights)]
    row_gmem = refs.pop(0) if split == 1 else None
    bias_gmems = [refs.pop(0) for _ in range(num_weights)] if has_bias else None
    out_gmems = [refs.pop(0) for _ in range(num_weights)]
    assert not refs, refs

    dtype, out_dtype = x_gmem.dtype, out_gmems[0].dtype
    k_iters = x_gmem.shape[1] // config.tile_k
    tile_n, tile_k, cta_n = config.tile_n, config.tile_k, config.cta_tile_n
    stages, num_mma = config.stages, config.warpgroups
    epi_n = epi_tile_n(split, jnp.dtype(dtype).itemsize)
    n_units = units(config, [w.shape[1] for w in w_gmems])
    n_starts = [sum(n_tiles[:i]) for i in range(num_weights)]
    weights_n = [w.shape[1] for w in w_gmems]

    def unit_coords(u):
        """(global N tile, split, first K step, K steps) of unit u."""
        tile, s = lax.div(u, split), lax.rem(u, split)
        lo, hi = split_bounds(s, k_iters, split)
        return tile, s, lo, hi - lo

    owner = functools.partial(for_weight, n_starts, n_tiles)

    scratch = dict(
        a_smem=_swizzled((stages, MAX_ROWS, tile_k), dtype, tile_k),
        # Swizzled by the per-warpgroup width: each warpgroup's part is whole swizzle tiles.
        b_smem=_swizzled((stages, tile_k, cta_n), dtype, tile_n),
        out_smem=_swizzled((num_mma, 2, MAX_ROWS, epi_n), out_dtype, epi_n),
        produced=plgpu.Barrier(num_arrivals=2, num_barriers=stages),
        consumed=plgpu.Barrier(num_arrivals=num_mma, num_barriers=stages),
    )
    if split == 1:
        scratch["row_smem"] = plgpu.SMEM((MAX_ROWS,), jnp.float32)
        scratch["row_ready"] = plgpu.Barrier(num_arrivals=1)
    if has_bias:
        scratch["bias_smem"] = plgpu.SMEM((2, cta_n), jnp.float32)
        scratch["vec_ready"] = plgpu.Barrier(num_arrivals=1, num_barriers=2)
        scratch["vec_free"] = plgpu.Barrier(num_arrivals=num_mma, num_barriers=2)

    def body(a_smem, b_smem, out_smem, produced, consumed, row_smem=None, row_ready=None,
             bias_smem=None, vec_ready=None, vec_free=None):
        wg_idx = lax.axis_index("wg")

        def memory_warpgroup():
            plgpu.set_max_registers(40, action="decrease")
            if split == 1:
                plgpu.copy_gmem_to_smem(row_gmem.at[pl.ds(0, x_box)], row_smem.at[pl.ds(0, x_box)],
                                        row_ready)

            @plgpu.nd_loop((n_units,), collective_axes="sm",
                           init_carry=(jnp.int32(0), jnp.int32(0)))
            def totals(loop_info, carry):
                step0, _ = carry
                tile, _, k_lo, k_steps = unit_coords(loop_info.index[0])
                if has_bias:
                    parity = lax.rem(loop_info.local_index, 2)

                    # The MMA warpgroups must be done with what this buffer held two units ago.
                    @pl.when(loop_info.local_index >= 2)
                    def _():
                        plgpu.barrier_wait(vec_free.at[parity])

                    def load_bias(i, local_n):
                        plgpu.copy_gmem_to_smem(bias_gmems[i].at[pl.ds(local_n * cta_n, cta_n)],
                                                bias_smem.at[parity], vec_ready.at[parity])

                    owner(tile, load_bias)

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
                        plgpu.copy_gmem_to_smem(
                            w_gmems[i].at[k_slice, pl.ds(local_n * cta_n, cta_n)],
                            b_smem.at[slot], produced.at[slot])

                owner(tile, issue)
                return step0 + k_steps, loop_info.local_index + 1

            total_steps, local_units = totals

            drain_releases(consumed, total_steps, stages)
            if has_bias:
                drain_releases(vec_free, local_units, 2)

        def mma_warpgroup():
            # Registers per thread: at most 2 x 232 + 40 (memory) = 504 <= 512.
            plgpu.set_max_registers(232, action="increase")
            wg_n0 = wg_idx * tile_n
            if split == 1:
                plgpu.barrier_wait(row_ready)

            @plgpu.nd_loop((n_units,), collective_axes="sm", init_carry=jnp.int32(0))
            def _units(loop_info, carry):
                step0 = carry
                tile, s, _, k_steps = unit_coords(loop_info.index[0])
                parity = lax.rem(loop_info.local_index, 2)

                def k_loop(acc_ref):
                    def step_fn(j, acc_ref):
                        slot = lax.rem(step0 + j, stages)
                        plgpu.barrier_wait(produced.at[slot])
                        plgpu.wgmma(acc_ref, a_smem.at[slot],
                                    b_smem.at[slot, :, pl.ds(wg_n0, tile_n)])
                        # The previous step's wgmma is done: its slot may be refilled.
                        plgpu.wgmma_wait(1)

                        @pl.when(j > 0)
                        def _():
                            plgpu.barrier_arrive(consumed.at[lax.rem(step0 + j - 1, stages)])

                        return acc_ref

                    lax.fori_loop(0, k_steps, step_fn, acc_ref)
                    plgpu.wgmma_wait(0)
                    plgpu.barrier_arrive(consumed.at[lax.rem(step0 + k_steps - 1, stages)])
                    return acc_ref[...]

                acc = pl.run_scoped(k_loop, plgpu.ACC((MAX_ROWS, tile_n), jnp.float32))
                bias = None
                if has_bias:
                    plgpu.barrier_wait(vec_ready.at[parity])
                    bias = bias_smem.at[parity, pl.ds(wg_n0, tile_n)]

                def store(src, c):
                    def copy(i, local_n):
                        dst = out_gmems[i] if split == 1 else out_gmems[i].at[s]
                        plgpu.copy_smem_to_gmem(src.at[pl.ds(0, x_box)],
                                                dst.at[pl.ds(0, x_box),
                                                       pl.ds(local_n * cta_n + wg_n0 + c, epi_n)])

                    owner(tile, copy)

                # Columns of this tile inside its weight: pieces past them are skipped whole
                # (their TMA stores wrote over valid columns on the H200, docs/mosaic-notes.md).
                cols_left = sum(
                    jnp.where((tile >= lo) & (tile < lo + t), n - (tile - lo) * cta_n - wg_n0, 0)
                    for lo, t, n in zip(n_starts, n_tiles, weights_n))
                _epilogue(acc, out_smem.at[wg_idx], store, cols_left, row_smem=row_smem, bias=bias,
                          epi_n=epi_n, out_dtype=out_dtype)
                if has_bias:
                    # The fence orders the bias reads before the TMA that refills the buffer.
                    plgpu.commit_smem()
                    plgpu.barrier_arrive(vec_free.at[parity])
                return step0 + k_steps

        lax.cond(wg_idx == num_mma, memory_warpgroup, mma_warpgroup)
        plgpu.wait_smem_to_gmem(0, wait_read_only=True)

    pl.run_scoped(body, **scratch, collective_axes="wg")


def _epilogue(acc: Array, out_smem, store, cols_left: Array, *, row_smem, bias, epi_n: int,
              out_dtype) -> None:
    """y = r * acc + b (row_smem/bias given) or acc, stored in [64, epi_n] pieces
    double-buffered in out_smem; pieces at or past `cols_left` are skipped whole, so that
    every wait below counts only stores that were issued."""
    tile_n = acc.shape[1]
    row_layout = plgpu.Layout.WGMMA.reduce(1)
    col_layout = plgpu.Layout.WGMMA.reduce(0)
    scale = None if row_smem is None else plgpu.load(row_smem, layout=row_layout)
    # Drain any store still reading out_smem from the previous unit.
    plgpu.wait_smem_to_gmem(0, wait_read_only=True)
    for ni in range(tile_n // epi_n):

        @pl.when(ni * epi_n < cols_left)
        def _piece():
            cols = slice(ni * epi_n, (ni + 1) * epi_n)
            y = acc[:, cols]
            if scale is not None:
                y = y * lax.broadcast_in_dim(scale, y.shape, [0])
            if bias is not None:
                b = plgpu.load(bias.at[cols], layout=col_layout)
                y = y + lax.broadcast_in_dim(b, y.shape, [1])
            slot = ni % 2
            # The store issued two pieces ago read this slot; wait until it has.
            plgpu.wait_smem_to_gmem(1, wait_read_only=True)
            out_smem[slot] = y.astype(out_dtype)
            plgpu.commit_smem()
            store(out_smem.at[slot], ni * epi_n)


def _build(x: Array, weights: Sequence[Array], *, config: DecodeConfig, has_bias: bool,
           interpret: bool, x_box: int = MAX_ROWS):
    m = x.shape[0]
    n_tiles = [pl.cdiv(w.shape[1], config.cta_tile_n) for w in weights]
    if config.split_k == 1:
        out_types = [jax.ShapeDtypeStruct((m, w.shape[1]), x.dtype) for w in weights]
    else:
        out_types = [jax.ShapeDtypeStruct((config.split_k, m, w.shape[1]), jnp.float32)
                     for w in weights]
    n_units = units(config, [w.shape[1] for w in weights])
    return plgpu.kernel(
        functools.partial(_kernel, config=config, n_tiles=n_tiles, has_bias=has_bias,
                          x_box=x_box),
        out_type=tuple(out_types),
        grid=(min(grid_ctas(interpret), n_units),),
        grid_names=("sm",),
        num_threads=config.warpgroups + 1,
        thread_name="wg",
        compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
        interpret=plgpu.InterpretGPUParams(detect_races=True) if interpret else None,
    )


def lazy_rms_decode_matmul(
    x: Array,
    weights: Sequence[Array],
    *,
    row_scale: Array,
    biases: Sequence[Array | None] | None = None,
    config: DecodeConfig | None = None,
    interpret: bool = False,
) -> tuple[Array, ...]:
    """diag(row_scale) (x @ W_i) + b_i for every weight in one launch; outputs in x.dtype.

    x: [M, K] bf16/f16 with M <= 64; weights: [K, N_i] of x's dtype (the norm's
    gain folded into x or W); row_scale: [M] float32 (`rms_row_scale`).
    """
    weights = tuple(weights)
    biases = tuple(biases) if biases is not None else (None,) * len(weights)
    m, k = x.shape
    ns = [w.shape[1] for w in weights]
    if config is None:
        config = decode_config(m, k, ns, sms=hardware.num_sms())
    check_shapes(x, weights, config)
    if row_scale.shape != (m,):
        raise ValueError(f"row_scale must be [M={m}]; got {row_scale.shape}")
    if len(biases) != len(weights):
        raise ValueError(f"biases: {len(biases)} given for {len(weights)} weights")
    row_scale = row_scale.astype(jnp.float32)
    bias32 = [jnp.zeros((n,), jnp.float32) if b is None else b.astype(jnp.float32)
              for b, n in zip(biases, ns)]
    has_bias = any(b is not None for b in biases)
    # x and the outputs keep their M rows: TMA zero-fills the box's rows past M on loads and
    # drops them on stores.
    build = functools.partial(_build, x, weights, config=config, interpret=interpret,
                              x_box=x_box_rows(m))
    if config.split_k == 1:
        vectors = [row_scale] + (bias32 if has_bias else [])
        return build(has_bias=has_bias)(x, *weights, *vectors)
    partials = build(has_bias=False)(x, *weights)
    return tuple(
        (jnp.sum(p, axis=0) * row_scale[:, None] + b[None, :]).astype(x.dtype)
        for p, b in zip(partials, bias32)
    )


def decode_rms_norm_dense(
    x: Array,
    weights: Sequence[Array],
    *,
    eps: float,
    scale: Array | None,
    scale_offset: float,
    biases: Sequence[Array | None] | None,
    row_scale: Array | None = None,
    config: DecodeConfig | None = None,
    interpret: bool = False,
) -> tuple[Array, ...]:
    """RMSNorm(x; scale) @ W_i + b_i at decode: the gain scales x (M*K, the smaller operand)
    in the pass that takes the row statistics (unless `row_scale` gives them), then
    `lazy_rms_decode_matmul`."""
    if row_scale is None:
        row_scale = rms_row_scale(x, eps)
    if scale is not None:
        x = (x.astype(jnp.float32) * (scale.astype(jnp.float32) + scale_offset)).astype(x.dtype)
    return lazy_rms_decode_matmul(x, weights, row_scale=row_scale, biases=biases,
                                  config=config, interpret=interpret)
