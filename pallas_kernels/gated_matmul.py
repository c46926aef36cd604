"""Gated MLP input on Hopper: act(RMSNorm(x) @ W_gate + b_g) * (RMSNorm(x) @ W_up + b_u), one GEMM.

The warp-specialized persistent structure of `pallas_kernels.gemm_kernel`, with a
second weight streamed beside the first:

    warpgroup 0, 1   MMA: per K step two wgmmas (gate and up) into two float32
                     accumulators of [tile_m, tile_n] each; after the K-loop the
                     epilogue g = r acc_g + b_g, u = r acc_u + b_u, act(g) * u in
                     float32, cast to x.dtype, SMEM, TMA store.
    warpgroup 2      memory: per tile the epilogue vectors (row scale r, the two
                     biases); per K step A, W_gate[:, block] and W_up[:, block]
                     into one pipeline slot, three TMA copies on one `produced`
                     barrier.

Per CTA the output block is [cta_tile_m, cta_tile_n]; its B operand is two
[tile_k, cta_tile_n] SMEM tiles, so one CTA does the flops of a plain GEMM tile
twice as wide while writing one output instead of two (no [M, d_ff] gate and up
in HBM, no separate activation pass). Two accumulators per warpgroup halve the
columns a warpgroup owns against the plain GEMM (2 x 64 float32 columns at
tile_m = 128: the register budget of the plain 128 x 128 tile).

The row scale r = rsqrt(mean(x^2) + eps) comes from outside the kernel (one XLA
row reduction, `lazy_norm_matmul.rms_row_scale`, or passed in); the gain is folded
into x or into both weights, whichever is smaller, as in `lazy_norm_matmul`.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.experimental.pallas as pl
import jax.experimental.pallas.mosaic_gpu as plgpu
import jax.numpy as jnp
from jax import lax

from pallas_kernels import hardware
from pallas_kernels.errors import Unsupported
from pallas_kernels.gemm_config import (MatmulDimension, TuningConfig, check_shapes,
                                        default_config, padded_rows)
from pallas_kernels.gemm_kernel import (_swizzled, drain_releases, grid_ctas, release_done_slot,
                                        release_last_slot)
from pallas_kernels.lazy_norm_matmul import rms_row_scale
from pallas_kernels.padding import crop_rows, pad_rows

__all__ = ["ACTIVATIONS", "gated_config", "gated_rms_matmul", "smem_bytes"]

Array = jax.Array
_SQRT_HALF = math.sqrt(0.5)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _silu(g: Array) -> Array:
    return g * (1.0 / (1.0 + jnp.exp(-g)))


def _gelu_tanh(g: Array) -> Array:
    return 0.5 * g * (1.0 + jnp.tanh(_SQRT_2_OVER_PI * (g + 0.044715 * (g * g * g))))


# erf(x) = x P(x^2) / Q(x^2) on [-4, 4] (+-1 beyond, in float32): Eigen's float erf, which
# XLA uses too; error within a few float32 ulps. Highest power first.
_ERF_P = (-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06,
          -5.69250639462346e-05, -7.34990630326855e-04, -2.95459980854025e-03,
          -1.60960333262415e-02)
_ERF_Q = (-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03,
          -7.37332916720468e-03, -1.42647390514189e-02)


def _polynomial(x: Array, coefficients: tuple[float, ...]) -> Array:
    p = jnp.full_like(x, coefficients[0])
    for c in coefficients[1:]:
        p = p * x + c
    return p


def erf(x: Array) -> Array:
    """erf in float32 from multiplies, adds and one divide (Mosaic GPU lowers no math.erf)."""
    x = jnp.minimum(jnp.maximum(x, -4.0), 4.0)
    x2 = x * x
    return x * _polynomial(x2, _ERF_P) / _polynomial(x2, _ERF_Q)


def _gelu(g: Array) -> Array:
    return 0.5 * g * (1.0 + erf(g * _SQRT_HALF))


# The gate's activation in float32, written with what Mosaic GPU lowers (exp, tanh; not erf).
ACTIVATIONS = {"silu": _silu, "gelu_tanh": _gelu_tanh, "gelu": _gelu}


def smem_bytes(config: TuningConfig, itemsize: int) -> int:
    """SMEM of the gated kernel: pipeline slots (A, and B for gate and up), output staging,
    the double-buffered row scale and two bias vectors, and barriers."""
    stage = (config.cta_tile_m + 2 * config.cta_tile_n) * config.tile_k * itemsize
    out = 2 * 2 * config.epi_tile_m * config.epi_tile_n * itemsize
    vectors = 4 * 2 * (config.cta_tile_m + 2 * config.cta_tile_n)
    return stage * config.max_concurrent_steps + out + vectors + 512


def gated_config(m: int, k: int, n: int, *, sms: int = hardware.H200_SMS,
                 itemsize: int = 2) -> TuningConfig:
    """Tiles per shape: `gemm_config.default_config` for the plain GEMM of [W_gate, W_up]
    (the same flops and B bytes per CTA), with each warpgroup's columns halved for its two
    accumulators (never below 64), and the deepest pipeline that fits the SMEM."""
    plain = default_config(m, k, (n, n), sms=sms, itemsize=itemsize)
    config = dataclasses.replace(plain, tile_n=max(64, plain.tile_n // 2))
    config = dataclasses.replace(config, epi_tile_n=min(config.epi_tile_n, config.tile_n))
    fitted = deepest_pipeline(config, itemsize, max(plain.max_concurrent_steps, 2))
    if fitted is None:
        raise Unsupported(f"no pipeline of {config} fits the SMEM")
    return fitted


def deepest_pipeline(config: TuningConfig, itemsize: int, max_steps: int) -> TuningConfig | None:
    """`config` with the deepest pipeline (max_steps down to 2) whose SMEM fits, or None."""
    for steps in range(max_steps, 1, -1):
        fitted = dataclasses.replace(config, max_concurrent_steps=steps)
        if smem_bytes(fitted, itemsize) <= hardware.SMEM_BYTES_PER_CTA:
            return fitted
    return None


def check_gated_shapes(x, w_gate, w_up, config: TuningConfig) -> None:
    """Unsupported for what the kernel does not serve (gemm_config's rules, plus equal weights)."""
    check_shapes(x, [w_gate, w_up], config)
    if config.pingpong:
        raise Unsupported("the gated kernel's warpgroups split one CTA tile: no pingpong")
    if w_gate.shape != w_up.shape:
        raise Unsupported(f"W_gate {w_gate.shape} and W_up {w_up.shape} must have one shape")
    if config.tile_m == 128 and config.tile_n > 64:
        raise Unsupported(f"tile_n={config.tile_n} at tile_m=128: two accumulators of more "
                          "than 64 float32 columns exceed the MMA warpgroups' registers")


def _kernel(x_gmem, wg_gmem, wu_gmem, row_gmem, *refs, config: TuningConfig, activation: str,
            has_bias: bool):
    refs = list(refs)
    bias_gmems = (refs.pop(0), refs.pop(0)) if has_bias else ()
    (out_gmem,) = refs
    dtype, out_dtype = x_gmem.dtype, out_gmem.dtype
    m, k = x_gmem.shape
    n = wg_gmem.shape[1]
    tile_m, tile_n, tile_k = config.tile_m, config.tile_n, config.tile_k
    cta_tile_m, cta_tile_n = config.cta_tile_m, config.cta_tile_n
    epi_m, epi_n = config.epi_tile_m, config.epi_tile_n
    m_iters, n_iters, k_iters = pl.cdiv(m, cta_tile_m), pl.cdiv(n, cta_tile_n), k // tile_k
    steps = config.max_concurrent_steps
    in_flight = config.wgmma_in_flight
    num_mma_wgs, memory_wg = 2, 2
    num_vectors = 1 + len(bias_gmems)
    act = ACTIVATIONS[activation]

    def tile_coords(lin_idx):
        return plgpu.planar_snake(
            lin_idx, (m_iters, n_iters), config.grid_minor_dim, config.grid_tile_width
        )

    scratch = dict(
        a_smem=_swizzled((steps, cta_tile_m, tile_k), dtype, tile_k),
        # Swizzled by the per-warpgroup width, so each warpgroup's part is a whole swizzle tile.
        bg_smem=_swizzled((steps, tile_k, cta_tile_n), dtype, tile_n),
        bu_smem=_swizzled((steps, tile_k, cta_tile_n), dtype, tile_n),
        out_smem=_swizzled((num_mma_wgs, 2, epi_m, epi_n), out_dtype, epi_n),
        # A, W_gate and W_up arrive on each produced barrier.
        produced=plgpu.Barrier(num_arrivals=3, num_barriers=steps),
        consumed=plgpu.Barrier(num_arrivals=num_mma_wgs, num_barriers=steps),
        # The row scale and the biases of a tile, double-buffered by the CTA's tile parity.
        row_smem=plgpu.SMEM((2, cta_tile_m), jnp.float32),
        col_smem=plgpu.SMEM((2, 2, cta_tile_n), jnp.float32),
        vec_ready=plgpu.Barrier(num_arrivals=num_vectors, num_barriers=2),
        vec_free=plgpu.Barrier(num_arrivals=num_mma_wgs, num_barriers=2),
    )

    def body(a_smem, bg_smem, bu_smem, out_smem, produced, consumed, row_smem, col_smem,
             vec_ready, vec_free):
        wg_idx = lax.axis_index("wg")

        def memory_warpgroup():
            plgpu.set_max_registers(40, action="decrease")

            @plgpu.nd_loop((m_iters * n_iters,), collective_axes="sm", init_carry=jnp.int32(0))
            def total_steps(loop_info, carry):
                m_idx, n_idx = tile_coords(loop_info.index[0])
                parity = lax.rem(loop_info.local_index, 2)

                # The MMA warpgroups must be done with what this buffer held two tiles ago.
                @pl.when(loop_info.local_index >= 2)
                def _():
                    plgpu.barrier_wait(vec_free.at[parity])

                # Vectors are not padded: TMA zero-fills past M (or N).
                plgpu.copy_gmem_to_smem(row_gmem.at[pl.ds(m_idx * cta_tile_m, cta_tile_m)],
                                        row_smem.at[parity], vec_ready.at[parity])
                for j, bias in enumerate(bias_gmems):
                    plgpu.copy_gmem_to_smem(bias.at[pl.ds(n_idx * cta_tile_n, cta_tile_n)],
                                            col_smem.at[parity, j], vec_ready.at[parity])

                @pl.loop(0, k_iters)
                def _k(ki):
                    step = carry + ki
                    slot = lax.rem(step, steps)

                    # The slot is free once every consumer of its previous fill has arrived.
                    @pl.when(step >= steps)
                    def _():
                        plgpu.barrier_wait(consumed.at[slot])

                    k_slice = pl.ds(ki * tile_k, tile_k)
                    n_slice = pl.ds(n_idx * cta_tile_n, cta_tile_n)
                    plgpu.copy_gmem_to_smem(x_gmem.at[pl.ds(m_idx * cta_tile_m, cta_tile_m),
                                                      k_slice],
                                            a_smem.at[slot], produced.at[slot])
                    plgpu.copy_gmem_to_smem(wg_gmem.at[k_slice, n_slice], bg_smem.at[slot],
                                            produced.at[slot])
                    plgpu.copy_gmem_to_smem(wu_gmem.at[k_slice, n_slice], bu_smem.at[slot],
                                            produced.at[slot])

                return carry + k_iters

            drain_releases(consumed, total_steps, steps)
            drain_releases(vec_free, total_steps // k_iters, 2)

        def mma_warpgroup():
            # Registers per thread: 2 x 232 + 40 (memory) = 504 <= 512.
            plgpu.set_max_registers(232, action="increase")
            if config.wg_dimension == MatmulDimension.M:
                wg_m0, wg_n0 = wg_idx * tile_m, 0
            else:
                wg_m0, wg_n0 = 0, wg_idx * tile_n

            @plgpu.nd_loop((m_iters * n_iters,), collective_axes="sm", init_carry=jnp.int32(0))
            def _tiles(loop_info, carry):
                m_idx, n_idx = tile_coords(loop_info.index[0])
                parity = lax.rem(loop_info.local_index, 2)

                def k_loop(acc_g, acc_u):
                    def step_fn(ki, accs):
                        slot = lax.rem(carry + ki, steps)
                        plgpu.barrier_wait(produced.at[slot])
                        a = a_smem.at[slot, pl.ds(wg_m0, tile_m)]
                        cols = pl.ds(wg_n0, tile_n)
                        plgpu.wgmma(accs[0], a, bg_smem.at[slot, :, cols])
                        plgpu.wgmma(accs[1], a, bu_smem.at[slot, :, cols])
                        # A slot may be refilled only after the wgmmas reading it are done.
                        release_done_slot(consumed, carry, ki, steps, in_flight, groups=2)
                        return accs

                    lax.fori_loop(0, k_iters, step_fn, (acc_g, acc_u))
                    release_last_slot(consumed, carry, k_iters, steps, in_flight)
                    return acc_g[...], acc_u[...]

                acc_shape = plgpu.ACC((tile_m, tile_n), jnp.float32)
                acc_g, acc_u = pl.run_scoped(k_loop, acc_shape, acc_shape)

                plgpu.barrier_wait(vec_ready.at[parity])
                row_scale = row_smem.at[parity, pl.ds(wg_m0, tile_m)]
                biases = [col_smem.at[parity, j, pl.ds(wg_n0, tile_n)]
                          for j in range(len(bias_gmems))]

                def store(src, r, c):
                    col = n_idx * cta_tile_n + wg_n0 + c

                    # A piece wholly past N is not stored: such a TMA store wrote over valid
                    # columns on the H200 (docs/mosaic-notes.md).
                    @pl.when(col < n)
                    def _():
                        plgpu.copy_smem_to_gmem(
                            src,
                            out_gmem.at[pl.ds(m_idx * cta_tile_m + wg_m0 + r, epi_m),
                                        pl.ds(col, epi_n)],
                        )

                _epilogue(acc_g, acc_u, wg_idx=wg_idx, out_smem=out_smem, store=store,
                          row_scale=row_scale, biases=biases, act=act, config=config,
                          out_dtype=out_dtype, ragged=n % cta_tile_n != 0)
                # Release this tile's vectors; the fence orders the reads above before the
                # TMA writes that will refill the buffer.
                plgpu.commit_smem()
                plgpu.barrier_arrive(vec_free.at[parity])
                return carry + k_iters

        lax.cond(wg_idx == memory_wg, memory_warpgroup, mma_warpgroup)
        # Await all output copies before the CTA exits.
        plgpu.wait_smem_to_gmem(0, wait_read_only=True)

    pl.run_scoped(body, **scratch, collective_axes="wg")


def _epilogue(acc_g: Array, acc_u: Array, *, wg_idx, out_smem, store, row_scale, biases: list,
              act, config: TuningConfig, out_dtype, ragged: bool) -> None:
    """y = act(r acc_g + b_g) * (r acc_u + b_u) in float32 on one warpgroup's tile, stored
    in (epi_m x epi_n) pieces through two alternating SMEM slots. `ragged`: pieces past N
    are skipped, so each piece waits for every earlier store (not just the one before)."""
    tile_m, tile_n = config.tile_m, config.tile_n
    epi_m, epi_n = config.epi_tile_m, config.epi_tile_n
    row_layout = plgpu.Layout.WGMMA.reduce(1)
    col_layout = plgpu.Layout.WGMMA.reduce(0)
    n_pieces = tile_n // epi_n
    # Drain any store still reading out_smem from the previous tile.
    plgpu.wait_smem_to_gmem(0, wait_read_only=True)
    for mi in range(tile_m // epi_m):
        rows = slice(mi * epi_m, (mi + 1) * epi_m)
        r = plgpu.load(row_scale.at[rows], layout=row_layout)
        for ni in range(n_pieces):
            cols = slice(ni * epi_n, (ni + 1) * epi_n)
            g, u = acc_g[rows, cols], acc_u[rows, cols]
            r_b = lax.broadcast_in_dim(r, g.shape, [0])
            g, u = g * r_b, u * r_b
            if biases:
                b_g = plgpu.load(biases[0].at[cols], layout=col_layout)
                b_u = plgpu.load(biases[1].at[cols], layout=col_layout)
                g = g + lax.broadcast_in_dim(b_g, g.shape, [1])
                u = u + lax.broadcast_in_dim(b_u, u.shape, [1])
            y = act(g) * u
            slot = (mi * n_pieces + ni) % 2
            # The store issued two pieces ago read this slot; wait until it has.
            plgpu.wait_smem_to_gmem(0 if ragged else 1, wait_read_only=True)
            out_smem[wg_idx, slot] = y.astype(out_dtype)
            # Make the generic-proxy SMEM writes visible to the TMA engine.
            plgpu.commit_smem()
            store(out_smem.at[wg_idx, slot], mi * epi_m, ni * epi_n)


def _build(x: Array, n: int, *, config: TuningConfig, activation: str, has_bias: bool,
           interpret: bool):
    m = x.shape[0]
    tiles = pl.cdiv(m, config.cta_tile_m) * pl.cdiv(n, config.cta_tile_n)
    interpret_params = plgpu.InterpretGPUParams(detect_races=True) if interpret else None
    return plgpu.kernel(
        functools.partial(_kernel, config=config, activation=activation, has_bias=has_bias),
        out_type=jax.ShapeDtypeStruct((m, n), x.dtype),
        grid=(min(grid_ctas(interpret), tiles),),
        grid_names=("sm",),
        num_threads=3,
        thread_name="wg",
        compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
        interpret=interpret_params,
    )


def gated_rms_matmul(
    x: Array,
    w_gate: Array,
    w_up: Array,
    *,
    activation: str = "silu",
    eps: float = 1e-6,
    scale: Array | None = None,
    scale_offset: float = 0.0,
    gate_bias: Array | None = None,
    up_bias: Array | None = None,
    row_scale: Array | None = None,
    config: TuningConfig | None = None,
    interpret: bool = False,
) -> Array:
    """act(RMSNorm(x; scale) @ W_gate + b_g) * (RMSNorm(x; scale) @ W_up + b_u) in x.dtype.

    x: [M, K] bf16/f16; weights [K, N] of x's dtype (folded W* when scale is None);
    `row_scale` ([M] float32 r) skips the statistics pass. activation: a key of ACTIVATIONS.
    """
    if activation not in ACTIVATIONS:
        raise Unsupported(f"activation {activation!r} not served; one of {tuple(ACTIVATIONS)}")
    if x.ndim != 2 or w_gate.ndim != 2:
        raise Unsupported(f"x [M, K] and W_gate [K, N] must be 2-D; got {x.shape}, "
                          f"{w_gate.shape}")
    (m, k), n = x.shape, w_gate.shape[1]
    if config is None:
        config = gated_config(m, k, n, itemsize=jnp.dtype(x.dtype).itemsize)
    check_gated_shapes(x, w_gate, w_up, config)
    weights = (w_gate, w_up)
    if scale is not None:
        gain = scale.astype(jnp.float32) + scale_offset
        if m <= 4 * n:
            # One pass over x yields both the statistic and the scaled operand.
            if row_scale is None:
                row_scale = rms_row_scale(x, eps)
            x = (x.astype(jnp.float32) * gain).astype(x.dtype)
        else:
            weights = tuple((gain[:, None] * w.astype(jnp.float32)).astype(w.dtype)
                            for w in weights)
    if row_scale is None:
        row_scale = rms_row_scale(x, eps)
    has_bias = gate_bias is not None or up_bias is not None
    biases = [jnp.zeros((n,), jnp.float32) if b is None else b.astype(jnp.float32)
              for b in (gate_bias, up_bias)] if has_bias else []
    m_rows = padded_rows(m)
    x = pad_rows(x, m_rows)
    y = _build(x, n, config=config, activation=activation, has_bias=has_bias,
               interpret=interpret)(x, *weights, row_scale, *biases)
    return crop_rows(y, m)
