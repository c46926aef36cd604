"""Standalone RMSNorm / LayerNorm over the last axis as Mosaic GPU kernels (Hopper+).

One HBM read and one HBM write per element: each CTA copies its rows (or, with
a cluster, its column block of those rows) into shared memory with one bulk
copy per row, makes its passes over shared memory in registers, writes the
normalized values back in place, and copies them out. Statistics are float32.

- One CTA per row block (`cluster_k == 1`) whenever a row fits in shared
  memory: on the H200 that was never slower, even with few rows.
- A row split across the `cluster_k` CTAs of a thread-block cluster when it is
  wider than one CTA stages (48 KiB): each CTA reduces its columns to per-row
  partials and the partials are exchanged (`row_stats`, docs/design.md,
  the statistics combine).

LayerNorm partials are shifted two-pass statistics, Chan-combined: CTA c takes
its first element s_c as a shift, md_c = mean(x - s_c) and
M2_c = sum((x - s_c - md_c)^2) over its columns. Relative to s_0 the CTA means
are a_c = (s_c - s_0) + md_c, the row mean is mu = mean_c(a_c) and
M2 = sum_c M2_c + K_c * sum_c (a_c - mu)^2. s_c - s_0 and x - s_0 are exact
when the values are within a factor 2 of each other (Sterbenz), which is the
|mean| >> std case where an unshifted E[x^2] - E[x]^2 has nothing left.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.experimental.pallas as pl
import jax.experimental.pallas.mosaic_gpu as plgpu
import jax.numpy as jnp
from jax import lax

from pallas_kernels.row_norm_config import (RowNormConfig, check_shape, make_config, row_layout,
                                            select_config)
from pallas_kernels.row_stats import (Kind, RowStatsExchange, Site, combine_layer, combine_rms,
                                      num_stats)

__all__ = ["Kind", "RowNormConfig", "check_shape", "make_config", "row_layout", "row_norm",
           "select_config"]


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
