"""Cross-lowering of the row-norm and post-norm kernels for "cuda" on a machine without a GPU.

`jax.jit(f).trace(*avals).lower(lowering_platforms=("cuda",))` runs the Pallas
-> Mosaic GPU lowering (layouts, bulk/TMA copies, cluster barriers, DSMEM
stores, the shared-memory budget) at real sizes; it does not run ptxas, so
register pressure and the PTX of the inline fences are only checked on the GPU.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import pytest

from pallas_kernels import hardware
from pallas_kernels import post_norm_matmul as pn
from pallas_kernels import row_norm as rn

S = jax.ShapeDtypeStruct
BF16 = jnp.bfloat16
H200_SMS = hardware.H200_SMS


def _lower(fn, *avals) -> str:
    lowered = jax.jit(fn).trace(*avals).lower(lowering_platforms=("cuda",))
    text = lowered.as_text()
    assert "mosaic_gpu" in text
    return text


# The sizes, the cluster split at a few widths, and rows that need
# narrower vectors (K = 1152, 320) or blocks of 4 rows (K = 64).
NORM_SHAPES = [(8192, 4096), (16, 8192), (4096, 16384), (64, 65536), (3, 12288), (1, 4096),
               (2, 1152), (16, 320), (4, 64)]


@pytest.mark.parametrize("m, k", NORM_SHAPES)
@pytest.mark.parametrize("dtype", [BF16, jnp.float32], ids=["bf16", "f32"])
@pytest.mark.parametrize("kind", ["rms", "layer"])
def test_row_norm_lowers(m, k, dtype, kind):
    config = rn.select_config(m, k, dtype, num_sms=H200_SMS)
    norm = functools.partial(rn.row_norm, kind=kind, eps=1e-6, scale_offset=0.0, config=config)
    bias = S((k,), jnp.float32) if kind == "layer" else None
    _lower(norm, S((m, k), dtype), S((k,), dtype), bias)


@pytest.mark.parametrize("transport", ["dsmem", "global"])
@pytest.mark.parametrize(
    "config",
    [
        rn.RowNormConfig(block_m=1, warps_per_row=4, cluster_k=8, chunk_k=1024),
        rn.RowNormConfig(block_m=4, cluster_k=2, chunk_k=1024),
        rn.RowNormConfig(block_m=2, warps_per_row=2, cluster_k=4, chunk_k=1024),
    ],
    ids=["1row-cluster8", "4rows-cluster2", "2rows-cluster4"],
)
def test_cluster_transports_lower(transport, config):
    """Both exchanges compile for the GPU; the GPU script runs both and compares them."""
    config = rn.RowNormConfig(**{**config.__dict__, "transport": transport})
    norm = functools.partial(rn.row_norm, kind="layer", eps=1e-6, scale_offset=0.0, config=config)
    _lower(norm, S((256, 8192), BF16), None, None)


def test_no_gain_no_bias_lowers():
    config = rn.select_config(4096, 4096, BF16, num_sms=H200_SMS)
    norm = functools.partial(rn.row_norm, kind="rms", eps=1e-6, scale_offset=0.0, config=config)
    _lower(norm, S((4096, 4096), BF16), None, None)


# (M, K, N): the sizes, a 64-row-tile width and a single-CTA row.
POST_NORM_SHAPES = [(8192, 4096, 4096), (4096, 4096, 2048), (2048, 4096, 3072), (256, 1024, 256)]


@pytest.mark.parametrize("m, k, n", POST_NORM_SHAPES)
@pytest.mark.parametrize("kind", ["rms", "layer"])
@pytest.mark.parametrize("transport", ["dsmem", "global", "semaphore"])
def test_post_norm_matmul_lowers(m, k, n, kind, transport):
    """With a residual, and h written: whole staged tiles, or (LayerNorm in grid groups
    and under "global") the residual loaded straight into registers."""
    config = pn.select_config(m, k, n, BF16, kind=kind, residual=True, transport=transport)
    fn = functools.partial(pn.post_norm_matmul, kind=kind, eps=1e-6, config=config)
    vec = S((n,), jnp.float32)
    norm_bias = vec if kind == "layer" else None
    _lower(fn, S((m, k), BF16), S((k, n), BF16), vec, vec, norm_bias, S((m, n), BF16))


@pytest.mark.parametrize("m, k, n", [(8192, 4096, 4096), (8192, 4096, 2048), (8192, 4096, 1024),
                                     (8192, 4096, 512)])
@pytest.mark.parametrize("kind", ["rms", "layer"])
def test_post_norm_gpu_pick_in_pieces_lowers(m, k, n, kind):
    """What impl="mosaic" runs outside autodiff without a residual: 64-row output pieces, no
    h, and the deepest pipeline the smem model allows, which the lowering's budget confirms."""
    config = pn.select_gpu_config(m, k, n, BF16, kind=kind)
    fn = functools.partial(pn.post_norm_matmul, kind=kind, eps=1e-6, config=config,
                           pre_norm_sum=False)
    vec = S((n,), jnp.float32)
    _lower(fn, S((m, k), BF16), S((k, n), BF16), vec, vec, vec if kind == "layer" else None, None)


@pytest.mark.parametrize("kind, residual, stages", [("rms", False, 4), ("layer", True, 2)])
def test_post_norm_chained_blocks_lower(kind, residual, stages):
    """A grid group's row blocks as one chained pipeline (jax's pipeline_state)."""
    import dataclasses

    m, k, n = 8192, 4096, 2048
    config = dataclasses.replace(
        pn.select_gpu_config(m, k, n, BF16, kind=kind, residual=residual),
        max_concurrent_steps=stages, chain_blocks=True)
    fn = functools.partial(pn.post_norm_matmul, kind=kind, eps=1e-6, config=config)
    vec = S((n,), jnp.float32)
    _lower(fn, S((m, k), BF16), S((k, n), BF16), vec, vec, vec if kind == "layer" else None,
           S((m, n), BF16) if residual else None)


@pytest.mark.parametrize("kind, residual, n", [("rms", False, 4096), ("layer", True, 2048)])
def test_post_norm_split_rows_lower(kind, residual, n):
    """Stacked warpgroups (64 x 256 each, split_rows) over the GPU pick's grid group."""
    import dataclasses

    m, k = 8192, 4096
    config = dataclasses.replace(
        pn.select_gpu_config(m, k, n, BF16, kind=kind, residual=residual),
        tile_m=64, tile_n=256, split_rows=True)
    fn = functools.partial(pn.post_norm_matmul, kind=kind, eps=1e-6, config=config)
    vec = S((n,), jnp.float32)
    _lower(fn, S((m, k), BF16), S((k, n), BF16), vec, vec, vec if kind == "layer" else None,
           S((m, n), BF16) if residual else None)


def test_post_norm_without_vectors_or_residual_lowers():
    config = pn.select_config(4096, 4096, 4096, BF16, kind="rms")
    fn = functools.partial(pn.post_norm_matmul, kind="rms", eps=1e-6, config=config)
    _lower(fn, S((4096, 4096), BF16), S((4096, 4096), BF16), None, None, None, None)


def test_semaphore_signals_fence_once_at_gpu_scope():
    """The grid-group exchange signals its group's counter with one relaxed GPU-scope
    reduction after one fence, and waiters poll it with plain loads: jax's
    `semaphore_signal_parallel` fences at system scope after every signal, which
    cost 11-41 us per row block on the H200 (docs/mosaic-notes.md)."""
    config = pn.select_config(4096, 1024, 2048, BF16, kind="rms", transport="semaphore")
    fn = functools.partial(pn.post_norm_matmul, kind="rms", eps=1e-6, config=config)
    text = _lower(fn, S((4096, 1024), BF16), S((1024, 2048), BF16), None, None, None, None)
    assert text.count("red.relaxed.gpu.global.add") == 1
    assert text.count("fence.acq_rel.gpu") == 1
    assert "ld.relaxed.gpu.global" in text and "atom.relaxed.gpu.global.cas" not in text
    assert "fence.release.sys" not in text
    # The counters only grow: they count on jax zero-filling them (one per group and row
    # half: the pick stacks its warpgroups) before every call.
    assert config.split_rows
    assert f"-> tensor<{2 * config.grid_clusters}xi32>" in text
    # Partials move by plain stores and loads: no TMA round trip, so no proxy fence.
    assert "fence.proxy.async.global" not in text


# Gemma-2-9B's attention output (K = 16 heads x 256, N = d = 3584) and OLMo-2's (4096, 4096).
RESIDUAL_AFTER_SHAPES = [(4096, 4096, 3584), (4096, 4096, 4096)]


@pytest.mark.parametrize("m, k, n", RESIDUAL_AFTER_SHAPES, ids=["gemma2-9b", "olmo2"])
@pytest.mark.parametrize("kind", ["rms", "layer"])
def test_post_norm_residual_after_lowers(m, k, n, kind):
    """r + Norm(x @ W + b): the GPU's pick (the residual staged or in registers, no h)."""
    config = pn.select_gpu_config(m, k, n, BF16, kind=kind, residual=True)
    fn = functools.partial(pn.post_norm_matmul, kind=kind, eps=1e-6, config=config,
                           pre_norm_sum=False, residual_after=True)
    vec = S((n,), jnp.float32)
    _lower(fn, S((m, k), BF16), S((k, n), BF16), vec, vec, vec if kind == "layer" else None,
           S((m, n), BF16))


@pytest.mark.parametrize("m, k, n", RESIDUAL_AFTER_SHAPES, ids=["gemma2-9b", "olmo2"])
def test_dense_rms_norm_residual_after_lowers_through_the_op(m, k, n):
    """The public op with `residual_after=` and impl="mosaic" (Gemma's 1 + g gain)."""
    import jaxnorm

    def fn(x, w, g, r):
        return jaxnorm.dense_rms_norm(x, w, None, g, scale_offset=1.0, residual_after=r,
                                      impl="mosaic")

    _lower(fn, S((m, k), BF16), S((k, n), BF16), S((n,), jnp.float32), S((m, n), BF16))


# Gemma-2-9B's post-attention and post-feedforward norms (K = 4096 and 14336, d = 3584) and
# OLMo-2-7B's (K = 4096 and 11008, d = 4096), with y's per-tile row statistics.
OUTPUT_STATS_SHAPES = [(4096, 4096, 3584), (4096, 14336, 3584), (4096, 4096, 4096),
                       (4096, 11008, 4096)]


@pytest.mark.parametrize("m, k, n", OUTPUT_STATS_SHAPES,
                         ids=["gemma2-9b-o", "gemma2-9b-down", "olmo2-7b-o", "olmo2-7b-down"])
@pytest.mark.parametrize("kind", ["rms", "layer"])
@pytest.mark.parametrize("pick", ["gpu", "dsmem"])
def test_post_norm_output_stats_lower(m, k, n, kind, pick):
    """r + Norm(x @ W + b) with output_stats: the GPU's pick (grid groups at these shapes)
    and the cluster pick, each writing the two [N / tile_n, M] partials."""
    if pick == "gpu":
        config = pn.select_gpu_config(m, k, n, BF16, kind=kind, residual=True)
    else:
        config = pn.select_config(m, k, n, BF16, kind=kind, residual=True, transport="dsmem")
    fn = functools.partial(pn.post_norm_matmul, kind=kind, eps=1e-6, config=config,
                           pre_norm_sum=False, residual_after=True, output_stats=True)
    vec = S((n,), jnp.float32)
    _lower(fn, S((m, k), BF16), S((k, n), BF16), vec, vec, vec if kind == "layer" else None,
           S((m, n), BF16))


@pytest.mark.parametrize("m, k, n", OUTPUT_STATS_SHAPES[:2], ids=["gemma2-9b-o", "gemma2-9b-down"])
def test_dense_rms_norm_statistics_lower_through_the_op(m, k, n):
    """The public op with `return_statistics=True` and impl="mosaic" (Gemma's 1 + g gain)."""
    import jaxnorm

    def fn(x, w, g, r):
        h, stats = jaxnorm.dense_rms_norm(x, w, None, g, scale_offset=1.0, residual_after=r,
                                          return_statistics=True, impl="mosaic")
        return h, stats.mean, stats.m2

    _lower(fn, S((m, k), BF16), S((k, n), BF16), S((n,), jnp.float32), S((m, n), BF16))


@pytest.mark.parametrize("m, k", [(4096, 1024), (4096, 6912), (2048, 1024), (2048, 6912)])
def test_gemma_post_norms_lower_in_a_grid_group(m, k):
    """Gemma-3-1B's post-attention and post-MLP norms, r + Norm(x @ W) at N = 1152, as
    impl="mosaic" runs them on the GPU: one grid group of 9 CTAs a row."""
    import jaxnorm

    fn = functools.partial(jaxnorm.dense_rms_norm, impl="mosaic")
    with jax.sharding.use_abstract_mesh(hardware.h200_mesh()):
        _lower(lambda x, w, g, r: fn(x, w, None, g, residual_after=r),
               S((m, k), BF16), S((k, 1152), BF16), S((1152,), BF16), S((m, 1152), BF16))
