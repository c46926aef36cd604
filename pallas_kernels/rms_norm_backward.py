"""RMSNorm's backward as one Mosaic GPU kernel (Hopper+): x and the cotangent read once.

For y = x r gamma with r = rsqrt(mean(x^2) + eps) and gamma = scale + offset,
given G = dL/dy (docs/backward.md, the row rule):

    dx     = r (G gamma - (r^2 / K) rowsum(G gamma x) x)
    dscale = colsum(G x r)

JAX's autodiff of the stock norm gives XLA a row sum, dx and the gain's column sum
to form: a row reduction and a column reduction cannot share a fusion, so G and x
are read once for each. Here
each CTA takes row blocks in turn (the next block's copy into shared memory in
flight while it works), recomputes r from x (as the stock backward does, so
nothing is saved per row), takes both row sums in one pass over registers,
writes dx over its copy of G in place and copies it out, and keeps the gain's
column sum running in shared memory, one float32 row per row of the block, each
element only ever touched by the thread that owns it (no synchronization per
step); at the end the block's rows fold into one partial per CTA ([CTAs, K], a
few per SM, which XLA sums). G may come as the cotangents of y's n consumers (q, k and v;
gate and up: `BackwardConfig.cotangents`), n tiles summed in float32 as they load, so
no pass before the kernel forms their sum (docs/backward.md, "One cotangent per
consumer"); dx then overwrites the first one's tile.

Rows must fit one CTA (no cluster split): the K of every model preset does.
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

from pallas_kernels import rms_norm_backward_configs as backward_configs
from pallas_kernels.errors import Unsupported
from pallas_kernels.row_norm_config import RowNormConfig, make_config, row_layout, select_config
from pallas_kernels.row_stats import safe_rsqrt

__all__ = ["BackwardConfig", "backward_candidates", "select_backward_config", "rms_norm_backward"]

# x and G tiles, the gain and the column partial staged together (H200: 227 KiB per CTA).
_MAX_SMEM_BYTES = 200 * 1024
# Row blocks per CTA: the fewest that let every CTA be resident at once (one wave), each SM
# holding as many CTAs as its shared memory does (at most 8): fewer CTAs, fewer column
# partials for XLA to sum, and no tail wave.
_SMEM_PER_SM_BYTES = 227 * 1024
_MAX_CTAS_PER_SM = 8
# The column sum crosses the warps that hold a chunk's rows, through shared memory, one
# register at a time: Mosaic takes float32 vectors of at most 4 elements there (16 bytes a
# store), so x's vectors hold at most 4 elements (8-byte loads of bf16, where the forward
# uses 16), and the scratch is 4 warps x 32 lanes x 4 float32 (the Pallas default).
_MAX_VECTOR_ELEMS = 4
_REDUCTION_SCRATCH_BYTES = 4 * 32 * _MAX_VECTOR_ELEMS * 4


@dataclasses.dataclass(frozen=True)
class BackwardConfig:
    """The row-norm layout knobs (`RowNormConfig`, never a cluster) of the backward kernel,
    and how many row blocks each CTA takes in turn (`steps`), the next one's copy in flight
    while it works on one: the gain's column partials are one row per CTA."""

    rows: RowNormConfig
    steps: int = 1
    addend: bool = False  # a third [M, K] input added to dx (the residual stream's cotangent)
    # G as this many [M, K] inputs summed in float32: y's cotangents from its consumers (the
    # gate and up GEMMs of a gated MLP), which XLA would otherwise add in a pass of its own.
    cotangents: int = 1

    def __post_init__(self) -> None:
        if self.rows.cluster_k != 1:
            raise ValueError("the backward kernel stages whole rows: cluster_k must be 1")
        if self.steps < 1:
            raise ValueError(f"steps must be >= 1; got {self.steps}")
        if self.cotangents < 1:
            raise ValueError(f"cotangents must be >= 1; got {self.cotangents}")

    def ctas(self, m: int) -> int:
        """The grid over m rows: one CTA per `steps` blocks of `block_m` rows."""
        return m // self.rows.block_m // self.steps

    def smem_bytes(self, k: int, dtype: jnp.dtype) -> int:
        buffers = 2 if self.steps > 1 else 1
        inputs = 1 + self.cotangents + self.addend
        tiles = inputs * buffers * self.rows.block_m * k * jnp.dtype(dtype).itemsize
        column_partials = self.rows.block_m * 4 * k  # per row of the block, folded into row 0
        return tiles + 4 * k + column_partials + _REDUCTION_SCRATCH_BYTES


def _rows(m: int, k: int, dtype: jnp.dtype, block_m: int) -> RowNormConfig | None:
    """The row layout of `block_m`-row blocks with the widest vectors the column sum's
    cross-warp reduction takes (at most 4 elements), or None where none splits the row."""
    itemsize = jnp.dtype(dtype).itemsize
    for vector_bytes in (b for b in (16, 8, 4) if b // itemsize <= _MAX_VECTOR_ELEMS):
        try:
            return make_config(m, k, dtype, block_m=block_m, cluster_k=1,
                               vector_bytes=vector_bytes)
        except Unsupported:
            continue
    return None


def _with_grid(m: int, k: int, dtype: jnp.dtype, block_m: int, ctas: int,
               addend: bool, cotangents: int = 1) -> BackwardConfig | None:
    """`block_m`-row blocks, each CTA taking the fewest in turn that bring the grid to at
    most `ctas` CTAs; None where the blocks do not split M or their tiles do not fit."""
    rows = _rows(m, k, dtype, block_m) if m % block_m == 0 else None
    if rows is None:
        return None
    blocks = m // block_m
    steps = next(s for s in range(1, blocks + 1) if blocks % s == 0 and blocks // s <= ctas)
    config = BackwardConfig(rows, steps, addend, cotangents)
    return config if config.smem_bytes(k, dtype) <= _MAX_SMEM_BYTES else None


def _measured_config(m: int, k: int, dtype: jnp.dtype, *, num_sms: int,
                     addend: bool, cotangents: int = 1) -> BackwardConfig | None:
    """The config measured fastest at the nearest shape of the same K and dtype, M within a
    factor of 2, on a GPU of this SM count (pallas_kernels/rms_norm_backward_configs.py):
    its rows per block and its CTA count."""
    if backward_configs.PROVENANCE.get("sms") != num_sms:
        return None
    name = jnp.dtype(dtype).name
    near = [(abs(math.log(em / m)), bm, em // bm // steps)
            for (em, ek), ename, bm, steps, _, _ in backward_configs.ENTRIES
            if ek == k and ename == name and max(em, m) <= 2 * min(em, m)]
    if not near:
        return None
    _, block_m, ctas = min(near)
    return _with_grid(m, k, dtype, block_m, ctas, addend, cotangents)


def select_backward_config(m: int, k: int, dtype: jnp.dtype, *, num_sms: int,
                           addend: bool = False, cotangents: int = 1) -> BackwardConfig:
    """The measured pick near (m, k) (`_measured_config`), else the one-wave heuristic
    (`_one_wave_config`); Unsupported where a row does not split or a block of x and G does
    not fit shared memory. `cotangents`: G's inputs (`BackwardConfig.cotangents`); a measured
    pick whose tiles no longer fit with them gives way to the heuristic."""
    measured = _measured_config(m, k, dtype, num_sms=num_sms, addend=addend,
                                cotangents=cotangents)
    return measured or _one_wave_config(m, k, dtype, num_sms=num_sms, addend=addend,
                                        cotangents=cotangents)


def _one_wave_config(m: int, k: int, dtype: jnp.dtype, *, num_sms: int,
                     addend: bool, cotangents: int = 1) -> BackwardConfig:
    """The forward row norm's rows per CTA (whole rows), with vectors of at most 4 elements,
    and the fewest row blocks per CTA that make the grid one wave; Unsupported where a row
    does not split or a block of x and G does not fit shared memory."""
    block_m = select_config(m, k, dtype, num_sms=num_sms, max_cluster=1).block_m
    itemsize = jnp.dtype(dtype).itemsize
    widths = [b for b in (16, 8, 4) if b // itemsize <= _MAX_VECTOR_ELEMS]
    rows = _rows(m, k, dtype, block_m)
    if rows is None:
        make_config(m, k, dtype, block_m=block_m, cluster_k=1,
                    vector_bytes=widths[-1])  # raises Unsupported with the reason
    blocks = m // block_m
    config = BackwardConfig(rows, 1, addend, cotangents)
    for steps in (s for s in range(1, blocks + 1) if blocks % s == 0):
        candidate = BackwardConfig(rows, steps, addend, cotangents)
        smem = candidate.smem_bytes(k, dtype)
        resident = min(_MAX_CTAS_PER_SM, _SMEM_PER_SM_BYTES // smem) if smem <= _MAX_SMEM_BYTES else 0
        if blocks // steps <= resident * num_sms:  # one wave: every CTA resident at once
            config = candidate
            break
    if config.smem_bytes(k, dtype) > _MAX_SMEM_BYTES:
        raise Unsupported(
            f"{block_m} rows of K={k} {jnp.dtype(dtype).name} (x and its cotangent) "
            f"need {config.smem_bytes(k, dtype)} bytes of shared memory; at most "
            f"{_MAX_SMEM_BYTES} fit one CTA")
    return config


def backward_candidates(m: int, k: int, dtype: jnp.dtype, *, num_sms: int,
                        addend: bool = False, cotangents: int = 1) -> list[BackwardConfig]:
    """The configs a tuning sweep times at (m, k) (bench/norm_backward.py --configs): blocks
    of 1-16 whole rows, each with the fewest row blocks per CTA that bring the grid down to
    8, 4, 2 and 1 CTAs per SM, the ones whose tiles fit shared memory; the selected config
    first. Fewer CTAs write fewer column partials for XLA to sum, more hide the copy's
    latency behind other CTAs' work."""
    candidates = [select_backward_config(m, k, dtype, num_sms=num_sms, addend=addend,
                                         cotangents=cotangents)]
    for block_m in (1, 2, 4, 8, 16):
        for per_sm in (8, 4, 2, 1):
            config = _with_grid(m, k, dtype, block_m, per_sm * num_sms, addend, cotangents)
            if config is not None and config not in candidates:
                candidates.append(config)
    return candidates


def _kernel(*refs, has_scale: bool, eps: float, scale_offset: float, k: int,
            config: BackwardConfig):
    refs = list(refs)
    x_gmem = refs.pop(0)
    g_gmems = [refs.pop(0) for _ in range(config.cotangents)]
    addend_gmem = refs.pop(0) if config.addend else None
    scale_gmem = refs.pop(0) if has_scale else None
    dx_gmem = refs.pop(0)
    colsum_gmem = refs.pop(0) if has_scale else None
    x_smem, g_smem, addend_smem, scale_smem, row_partials, loaded, vec_loaded = refs
    # g_smem holds each cotangent's tiles; dx is written over the first one's.
    rows, steps = config.rows, config.steps
    bm, chunk = rows.block_m, rows.chunk_k
    num_chunks = k // chunk
    layout = row_layout(x_smem.dtype, rows.warps_per_row, rows.vector_bytes)
    col_layout = layout.reduce(0)
    cta, num_ctas = lax.axis_index("m"), lax.axis_size("m")
    in_bounds = plgpu.OOBFillMode.PROMISE_IN_BOUNDS
    buffers = x_smem.shape[0]

    def block_rows(step):  # CTA c takes blocks c, c + num_ctas, ...: neighbours stream together
        return pl.ds((cta + step * num_ctas) * bm, bm)

    def fetch(step, slot) -> None:
        pairs = [(x_gmem, x_smem.at[slot])]
        pairs += [(g, g_smem.at[i, slot]) for i, g in enumerate(g_gmems)]
        pairs += [(addend_gmem, addend_smem.at[slot])] if config.addend else []
        for src, dst in pairs:
            plgpu.copy_gmem_to_smem(src.at[block_rows(step)], dst, loaded.at[slot],
                                    oob_mode=in_bounds)

    fetch(0, 0)
    if has_scale:
        plgpu.copy_gmem_to_smem(scale_gmem, scale_smem, vec_loaded, oob_mode=in_bounds)

    def rows_of(v: jax.Array) -> jax.Array:
        return plgpu.layout_cast(lax.broadcast_in_dim(v, (bm, chunk), [0]), layout)

    def gain(c) -> jax.Array | float:
        if not has_scale:
            return 1.0  # no gain (or one folded into the weights): the offset goes with it
        # A float32 gain is wider than bf16 x's vectors: the plain (unoptimized) load path.
        wider = scale_smem.dtype.itemsize > x_smem.dtype.itemsize
        value = plgpu.load(scale_smem.at[pl.ds(c * chunk, chunk)], layout=col_layout,
                           optimized=not wider).astype(jnp.float32) + scale_offset
        return plgpu.layout_cast(lax.broadcast_in_dim(value, (bm, chunk), [1]), layout)

    if has_scale:
        plgpu.barrier_wait(vec_loaded)

        @pl.loop(0, num_chunks)
        def _zero(c):
            row_partials[:, pl.ds(c * chunk, chunk)] = plgpu.layout_cast(
                jnp.zeros((bm, chunk), jnp.float32), layout)

    @pl.loop(0, steps)
    def _step(step):
        slot = lax.rem(step, buffers)
        if steps > 1:
            @pl.when(step + 1 < steps)
            def _prefetch():
                # The other buffer's dx (the last step's) must be read out before it refills.
                plgpu.wait_smem_to_gmem(0, wait_read_only=True)
                fetch(step + 1, 1 - slot)

        x_tile, g_tile = x_smem.at[slot], g_smem.at[0, slot]

        def load(ref, c) -> jax.Array:
            return plgpu.load(ref.at[:, pl.ds(c * chunk, chunk)],
                              layout=layout).astype(jnp.float32)

        def load_g(c) -> jax.Array:  # G: the cotangents' sum, in float32
            g = load(g_tile, c)
            for i in range(1, config.cotangents):
                g = g + load(g_smem.at[i, slot], c)
            return g

        plgpu.barrier_wait(loaded.at[slot])

        # Both row sums in one pass: sum(x^2) and sum(G gamma x), accumulated
        # elementwise and reduced once (one shuffle tree per row, not per chunk).
        def accumulate(c, acc):
            x, g = load(x_tile, c), load_g(c)
            return acc[0] + x * x, acc[1] + g * gain(c) * x

        zero = plgpu.layout_cast(jnp.zeros((bm, chunk), jnp.float32), layout)
        squares, projections = lax.fori_loop(0, num_chunks, accumulate, (zero, zero))
        r = safe_rsqrt(jnp.sum(squares, axis=1) * (1.0 / k) + eps)
        correction = jnp.sum(projections, axis=1) * r * r * (1.0 / k)

        @pl.loop(0, num_chunks)
        def _dx(c):
            x, g = load(x_tile, c), load_g(c)
            span = pl.ds(c * chunk, chunk)
            if has_scale:
                # Each thread adds to the elements it owns, the same ones every step.
                before = plgpu.load(row_partials.at[:, span], layout=layout)
                row_partials[:, span] = before + g * x * rows_of(r)
            dx = rows_of(r) * (g * gain(c) - rows_of(correction) * x)
            if config.addend:
                dx = dx + load(addend_smem.at[slot], c)
            # In place: each thread overwrites exactly the elements it just read.
            g_tile[:, span] = dx.astype(g_tile.dtype)

        plgpu.commit_smem()  # the generic-proxy stores, visible to the TMA engine
        plgpu.copy_smem_to_gmem(g_tile, dx_gmem.at[block_rows(step)])

    if has_scale:
        @pl.loop(0, num_chunks)
        def _fold(c):
            # The block's rows into row 0, one cross-warp reduction a chunk: every warp has
            # read its rows before the reduction synchronizes them, then stores the same sum.
            span = pl.ds(c * chunk, chunk)
            row_partials[0, span] = jnp.sum(
                plgpu.load(row_partials.at[:, span], layout=layout), axis=0)

        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(row_partials.at[0], colsum_gmem.at[cta])
    plgpu.wait_smem_to_gmem(0, wait_read_only=True)  # shared memory outlives the copies


def cotangents_of(g: jax.Array | tuple[jax.Array, ...]) -> tuple[jax.Array, ...]:
    """The cotangents of RMSNorm(x) as given: one array, or one per consumer of the
    normalized x (a tuple), which the kernel sums as it reads them."""
    return tuple(g) if isinstance(g, (tuple, list)) else (g,)


def rms_norm_backward(
    x: jax.Array,
    g: jax.Array | tuple[jax.Array, ...],
    scale: jax.Array | None,
    addend: jax.Array | None = None,
    *,
    eps: float,
    scale_offset: float,
    config: BackwardConfig,
    interpret: bool = False,
    sum_partials: bool = True,
) -> tuple[jax.Array, jax.Array | None]:
    """(dx in x.dtype, d scale in float32 or None) of y = RMSNorm(x) (scale + offset) for the
    cotangent g of y (or a tuple of y's cotangents from its consumers, summed in float32, as
    many as `config.cotangents`), with `addend` (x's other cotangent, as the config says)
    added to dx before its rounding; x, g and addend are [M, K] of one dtype, M whole row
    blocks. With `sum_partials=False`, d scale is the kernel's [CTAs, K] column partials,
    unsummed (to time the kernel without XLA's sum)."""
    gs = cotangents_of(g)
    if x.ndim != 2 or any(a is not None and (a.shape, a.dtype) != (x.shape, x.dtype)
                          for a in (*gs, addend)):
        raise ValueError(f"x, g (and addend) must be [M, K] of one dtype; got "
                         f"{[(a.shape, a.dtype) for a in (x, *gs, addend) if a is not None]}")
    if config.addend != (addend is not None):
        raise ValueError(f"config.addend={config.addend} but addend is "
                         f"{'given' if addend is not None else 'None'}")
    if config.cotangents != len(gs):
        raise ValueError(f"config.cotangents={config.cotangents} but {len(gs)} given")
    m, k = x.shape
    bm = config.rows.block_m
    if m % bm or k % config.rows.chunk_k:
        raise Unsupported(f"{m} x {k} does not split into {bm}-row blocks of "
                          f"{config.rows.chunk_k}-column chunks")
    num_ctas = config.ctas(m)
    if num_ctas * config.steps * bm != m:
        raise Unsupported(f"M={m} is not {config.steps} steps of {bm}-row blocks per CTA")
    has_scale = scale is not None
    out_type = [jax.ShapeDtypeStruct((m, k), x.dtype)]
    if has_scale:
        out_type.append(jax.ShapeDtypeStruct((num_ctas, k), jnp.float32))
    buffers = 2 if config.steps > 1 else 1
    scratch = (
        plgpu.SMEM((buffers, bm, k), x.dtype),
        plgpu.SMEM((len(gs), buffers, bm, k), x.dtype),
        plgpu.SMEM((buffers, bm, k), x.dtype) if config.addend else None,
        plgpu.SMEM((k,), scale.dtype) if has_scale else None,
        plgpu.SMEM((bm, k), jnp.float32) if has_scale else None,
        plgpu.Barrier(num_arrivals=1 + len(gs) + config.addend, num_barriers=buffers),
        plgpu.Barrier(num_arrivals=1) if has_scale else None,
    )
    body = functools.partial(_kernel, has_scale=has_scale, eps=float(eps),
                             scale_offset=float(scale_offset), k=k, config=config)
    call = plgpu.kernel(
        body,
        out_type=tuple(out_type),
        grid=(num_ctas,),
        grid_names=("m",),
        scratch_types=scratch,
        compiler_params=plgpu.CompilerParams(
            lowering_semantics=plgpu.LoweringSemantics.Lane,
            reduction_scratch_bytes=_REDUCTION_SCRATCH_BYTES),
        interpret=plgpu.InterpretGPUParams(detect_races=True) if interpret else False,
    )
    args = [a for a in (x, *gs, addend, scale) if a is not None]
    if not has_scale:
        return call(*args)[0], None
    dx, colsum = call(*args)
    return dx, jnp.sum(colsum, axis=0) if sum_partials else colsum
