"""RMSNorm's backward as one Mosaic GPU kernel (Hopper+): x and the cotangent read once.

For y = x r gamma with r = rsqrt(mean(x^2) + eps) and gamma = scale + offset,
given G = dL/dy (docs/backward.md, the row rule):

    dx     = r (G gamma - (r^2 / K) rowsum(G gamma x) x)
    dscale = colsum(G x r)

XLA's autodiff of the stock norm runs this as three passes over G and x (the row
sum, dx, the column sum for the gain), each reading both [M, K] arrays. Here
each CTA copies its rows of x and G into shared memory once, recomputes r from x
(as the stock backward does, so nothing is saved per row), takes both row sums
in one pass over registers, writes dx over its copy of G in place and copies it
out, and leaves the gain's column sum as one float32 partial per row block
([M / block_m, K], which XLA sums: a read of 1 / block_m of G's bytes).

Rows must fit one CTA (no cluster split): the K of every model preset does.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.experimental.pallas as pl
import jax.experimental.pallas.mosaic_gpu as plgpu
import jax.numpy as jnp
from jax import lax

from pallas_kernels.errors import Unsupported
from pallas_kernels.row_norm_config import RowNormConfig, make_config, row_layout, select_config
from pallas_kernels.row_stats import safe_rsqrt

__all__ = ["BackwardConfig", "select_backward_config", "rms_norm_backward"]

# x and G tiles, the gain and the column partial staged together (H200: 227 KiB per CTA).
_MAX_SMEM_BYTES = 200 * 1024
# The column sum crosses the warps that hold a chunk's rows, through shared memory, one
# register at a time: Mosaic takes float32 vectors of at most 4 lanes' elements there
# (16 bytes a store), so x's vectors hold at most 4 elements, and the scratch is 4 warps
# x 32 lanes x 4 float32 (the Pallas default).
_MAX_VECTOR_ELEMS = 4
_REDUCTION_SCRATCH_BYTES = 4 * 32 * _MAX_VECTOR_ELEMS * 4


@dataclasses.dataclass(frozen=True)
class BackwardConfig:
    """The row-norm layout knobs (`RowNormConfig`, never a cluster) of the backward kernel."""

    rows: RowNormConfig

    def __post_init__(self) -> None:
        if self.rows.cluster_k != 1:
            raise ValueError("the backward kernel stages whole rows: cluster_k must be 1")

    def smem_bytes(self, k: int, dtype: jnp.dtype) -> int:
        tiles = 2 * self.rows.block_m * k * jnp.dtype(dtype).itemsize
        return tiles + 2 * 4 * k + _REDUCTION_SCRATCH_BYTES


def select_backward_config(m: int, k: int, dtype: jnp.dtype, *, num_sms: int) -> BackwardConfig:
    """The forward row norm's rows per CTA (whole rows), with vectors of at most 4 elements,
    or Unsupported."""
    block_m = select_config(m, k, dtype, num_sms=num_sms, max_cluster=1).block_m
    itemsize = jnp.dtype(dtype).itemsize
    widths = [b for b in (16, 8, 4) if b // itemsize <= _MAX_VECTOR_ELEMS]
    for vector_bytes in widths:
        try:
            rows = make_config(m, k, dtype, block_m=block_m, cluster_k=1,
                               vector_bytes=vector_bytes)
            break
        except Unsupported:
            if vector_bytes == widths[-1]:
                raise
    config = BackwardConfig(rows)
    if config.smem_bytes(k, dtype) > _MAX_SMEM_BYTES:
        raise Unsupported(
            f"{config.rows.block_m} rows of K={k} {jnp.dtype(dtype).name} (x and its cotangent) "
            f"need {config.smem_bytes(k, dtype)} bytes of shared memory; at most "
            f"{_MAX_SMEM_BYTES} fit one CTA")
    return config


def _kernel(*refs, has_scale: bool, eps: float, scale_offset: float, k: int,
            config: BackwardConfig):
    refs = list(refs)
    x_gmem, g_gmem = refs.pop(0), refs.pop(0)
    scale_gmem = refs.pop(0) if has_scale else None
    dx_gmem = refs.pop(0)
    colsum_gmem = refs.pop(0) if has_scale else None
    x_smem, g_smem, scale_smem, colsum_smem, barrier = refs
    rows = config.rows
    bm, chunk = rows.block_m, rows.chunk_k
    num_chunks = k // chunk
    layout = row_layout(x_smem.dtype, rows.warps_per_row, rows.vector_bytes)
    col_layout = layout.reduce(0)
    block = lax.axis_index("m")
    in_bounds = plgpu.OOBFillMode.PROMISE_IN_BOUNDS

    plgpu.copy_gmem_to_smem(x_gmem.at[pl.ds(block * bm, bm)], x_smem, barrier, oob_mode=in_bounds)
    plgpu.copy_gmem_to_smem(g_gmem.at[pl.ds(block * bm, bm)], g_smem, barrier, oob_mode=in_bounds)
    if has_scale:
        plgpu.copy_gmem_to_smem(scale_gmem, scale_smem, barrier, oob_mode=in_bounds)

    def load(ref, c) -> jax.Array:
        return plgpu.load(ref.at[:, pl.ds(c * chunk, chunk)], layout=layout).astype(jnp.float32)

    def rows_of(v: jax.Array) -> jax.Array:
        return plgpu.layout_cast(lax.broadcast_in_dim(v, (bm, chunk), [0]), layout)

    def gain(c) -> jax.Array | float:
        if not has_scale:
            return 1.0 + scale_offset
        # A float32 gain is wider than bf16 x's vectors: the plain (unoptimized) load path.
        wider = scale_smem.dtype.itemsize > x_smem.dtype.itemsize
        value = plgpu.load(scale_smem.at[pl.ds(c * chunk, chunk)], layout=col_layout,
                           optimized=not wider).astype(jnp.float32) + scale_offset
        return plgpu.layout_cast(lax.broadcast_in_dim(value, (bm, chunk), [1]), layout)

    plgpu.barrier_wait(barrier)

    # Both row sums in one pass: sum(x^2) and sum(G gamma x), accumulated
    # elementwise and reduced once (one shuffle tree per row, not per chunk).
    def accumulate(c, acc):
        x, g = load(x_smem, c), load(g_smem, c)
        return acc[0] + x * x, acc[1] + g * gain(c) * x

    zero = plgpu.layout_cast(jnp.zeros((bm, chunk), jnp.float32), layout)
    squares, projections = lax.fori_loop(0, num_chunks, accumulate, (zero, zero))
    r = safe_rsqrt(jnp.sum(squares, axis=1) * (1.0 / k) + eps)
    correction = jnp.sum(projections, axis=1) * r * r * (1.0 / k)

    @pl.loop(0, num_chunks)
    def _dx(c):
        x, g = load(x_smem, c), load(g_smem, c)
        span = pl.ds(c * chunk, chunk)
        if has_scale:
            colsum_smem[span] = jnp.sum(g * x * rows_of(r), axis=0)
        dx = rows_of(r) * (g * gain(c) - rows_of(correction) * x)
        # In place: each thread overwrites exactly the elements it just read.
        g_smem[:, span] = dx.astype(g_smem.dtype)

    plgpu.commit_smem()  # the generic-proxy stores, visible to the TMA engine
    plgpu.copy_smem_to_gmem(g_smem, dx_gmem.at[pl.ds(block * bm, bm)])
    if has_scale:
        plgpu.copy_smem_to_gmem(colsum_smem, colsum_gmem.at[block])
    plgpu.wait_smem_to_gmem(0, wait_read_only=True)  # shared memory outlives the copies


def rms_norm_backward(
    x: jax.Array,
    g: jax.Array,
    scale: jax.Array | None,
    *,
    eps: float,
    scale_offset: float,
    config: BackwardConfig,
    interpret: bool = False,
) -> tuple[jax.Array, jax.Array | None]:
    """(dx in x.dtype, d scale in float32 or None) of y = RMSNorm(x) (scale + offset) for the
    cotangent g of y; x and g are [M, K] with M a multiple of the config's block_m."""
    if x.ndim != 2 or g.shape != x.shape or g.dtype != x.dtype:
        raise ValueError(f"x and g must be [M, K] of one dtype; got {x.shape} {x.dtype} and "
                         f"{g.shape} {g.dtype}")
    m, k = x.shape
    bm = config.rows.block_m
    if m % bm or k % config.rows.chunk_k:
        raise Unsupported(f"{m} x {k} does not split into {bm}-row blocks of "
                          f"{config.rows.chunk_k}-column chunks")
    num_blocks = m // bm
    has_scale = scale is not None
    out_type = [jax.ShapeDtypeStruct((m, k), x.dtype)]
    if has_scale:
        out_type.append(jax.ShapeDtypeStruct((num_blocks, k), jnp.float32))
    scratch = (
        plgpu.SMEM((bm, k), x.dtype),
        plgpu.SMEM((bm, k), x.dtype),
        plgpu.SMEM((k,), scale.dtype) if has_scale else None,
        plgpu.SMEM((k,), jnp.float32) if has_scale else None,
        plgpu.Barrier(num_arrivals=2 + has_scale),
    )
    body = functools.partial(_kernel, has_scale=has_scale, eps=float(eps),
                             scale_offset=float(scale_offset), k=k, config=config)
    call = plgpu.kernel(
        body,
        out_type=tuple(out_type),
        grid=(num_blocks,),
        grid_names=("m",),
        scratch_types=scratch,
        compiler_params=plgpu.CompilerParams(
            lowering_semantics=plgpu.LoweringSemantics.Lane,
            reduction_scratch_bytes=_REDUCTION_SCRATCH_BYTES),
        interpret=plgpu.InterpretGPUParams(detect_races=True) if interpret else False,
    )
    if not has_scale:
        return call(x, g)[0], None
    dx, colsum = call(x, g, scale)
    return dx, jnp.sum(colsum, axis=0)
