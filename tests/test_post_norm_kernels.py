"""Post-norm GEMM (Norm(x @ W + b [+ residual]), or r + Norm(x @ W + b)) under the Mosaic
GPU interpreter, race-checked.

Each CTA of a cluster computes part of the output row block; only per-row
statistics cross CTAs (through global scratch here, DSMEM on the GPU). Sizes
stay small because every warpgroup of every CTA is simulated; the same kernels
are compile-checked at real sizes in test_cuda_lowering_norms.py and run on the
H200 by bench/gpu/check_kernels.py. Inputs are fresh random draws.
"""

from __future__ import annotations

import dataclasses


import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jaxnorm
from jaxnorm.dispatch import Unsupported
from pallas_kernels import hardware
from pallas_kernels import post_norm_matmul as pn
from verify.checks import check_grad, check_op, check_post_norm_outputs
from kernel_checks import assert_race_free

BF16 = np.dtype(ml_dtypes.bfloat16)
F16 = np.dtype(np.float16)
F32 = np.dtype(np.float32)


def _inputs(rng, m, k, n, dtype, *, bias_mean=0.0, residual=True, norm_bias=False):
    inputs = dict(
        x=rng.standard_normal((m, k)).astype(dtype),
        kernel=(rng.standard_normal((k, n)) / np.sqrt(k)).astype(dtype),
        bias=(bias_mean + rng.standard_normal(n)).astype(F32),
        scale=(1.0 + 0.2 * rng.standard_normal(n)).astype(F32),
        eps=1e-6,
    )
    if residual:
        inputs["residual"] = rng.standard_normal((m, n)).astype(dtype)
    if norm_bias:
        inputs["norm_bias"] = rng.standard_normal(n).astype(F32)
    return inputs


@pytest.mark.parametrize(
    "m, k, n, dtype",
    [(50, 128, 256, BF16), (64, 128, 512, BF16), (64, 64, 256, F16)],
    ids=["rows-padded", "cluster2", "f16"],
)
def test_dense_rms_norm_matches_reference(rng, m, k, n, dtype):
    check_op("dense_rms_norm", "interpret", **_inputs(rng, m, k, n, dtype))
    assert_race_free()


@pytest.mark.parametrize("bias_mean", [0.0, 100.0], ids=["centred", "mean100"])
def test_dense_layer_norm_matches_reference(rng, bias_mean):
    """Rows with a large mean: the warpgroups' shifted partials are Chan-combined across CTAs."""
    inputs = _inputs(rng, 64, 128, 512, BF16, bias_mean=bias_mean, norm_bias=True)
    check_op("dense_layer_norm", "interpret", **inputs)
    assert_race_free()


def test_gemma_offset_gain_reaches_the_kernel(rng):
    """scale_offset=1 folds into the one gain vector the kernel reads: (1 + scale)."""
    inputs = _inputs(rng, 64, 128, 256, BF16, norm_bias=True)
    inputs["scale"] = (0.1 * rng.standard_normal(256)).astype(F32)
    check_op("dense_layer_norm", "interpret", scale_offset=1.0, **inputs)
    assert_race_free()


def _run_and_check(rng, kind, m, k, n, config, *, residual: bool, vectors: bool = False,
                   pre_norm_sum: bool = True, bias_mean: float = 0.0,
                   residual_after: bool = False) -> None:
    """Run the kernel directly (with `vectors`: bias, of mean `bias_mean`, and gain) and
    check y and h (unless not asked for: then it must be None) against float64; with
    `residual_after` the residual is added after the norm."""
    x = rng.standard_normal((m, k)).astype(BF16)
    w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(BF16)
    r = rng.standard_normal((m, n)).astype(BF16) if residual else None
    bias = (bias_mean + rng.standard_normal(n)).astype(F32) if vectors else None
    gain = (1.0 + 0.2 * rng.standard_normal(n)).astype(F32) if vectors else np.ones(n, F32)
    y, h = pn.post_norm_matmul(jnp.asarray(x), jnp.asarray(w),
                               None if bias is None else jnp.asarray(bias),
                               jnp.asarray(gain) if vectors else None, None,
                               None if r is None else jnp.asarray(r), kind=kind,
                               eps=1e-6, config=config, pre_norm_sum=pre_norm_sum,
                               residual_after=residual_after, interpret=True)
    assert_race_free()
    assert (h is not None) == pre_norm_sum
    where = "residual_after" if residual_after else "residual"
    inputs = dict(x=x, kernel=w, bias=bias, scale=gain if vectors else None, eps=1e-6,
                  **{where: r})
    assert check_post_norm_outputs(kind, y, h, **inputs) <= 1.0


@pytest.mark.parametrize("kind", ["rms", "layer"])
def test_narrow_k_steps_without_bias_or_residual(rng, kind):
    """64 x 64 warpgroup tiles, 32-wide K steps, a 2-CTA cluster; no bias, gain or residual."""
    config = pn.PostNormConfig(tile_m=64, tile_n=64, cluster_n=2, tile_k=32,
                               max_concurrent_steps=3, transport="global")
    _run_and_check(rng, kind, 64, 96, 256, config, residual=False)


@pytest.mark.parametrize(
    "kind, grid_clusters, residual",
    [("rms", 2, True), ("layer", 1, True), ("layer", 2, False)],
    ids=["rms-2-clusters", "layer-1-cluster", "layer-no-residual"],
)
def test_persistent_clusters_walk_several_row_blocks(rng, kind, grid_clusters, residual):
    """Fewer clusters than row blocks: each cluster exchanges statistics once per block,
    reusing its staging tile, exchange buffers and pipeline across blocks."""
    config = pn.PostNormConfig(tile_m=64, tile_n=64, cluster_n=2, tile_k=64,
                               max_concurrent_steps=2, transport="global",
                               grid_clusters=grid_clusters)
    _run_and_check(rng, kind, 192, 128, 256, config, residual=residual, vectors=True)


@pytest.mark.parametrize("kind, bias_mean", [("rms", 0.0), ("layer", 100.0)],
                         ids=["rms", "layer-mean100"])
def test_eight_partials_combine_as_one_matrix(rng, kind, bias_mean):
    """A 4-CTA cluster has 8 partials per row: read from global memory as one [rows, 8]
    matrix and reduced across each row's threads (what groups of 4-16 CTAs run on the
    GPU), LayerNorm's Chan combine included (rows with mean 100)."""
    config = pn.PostNormConfig(tile_m=64, tile_n=64, cluster_n=4, tile_k=64,
                               max_concurrent_steps=2, transport="global", grid_clusters=1)
    assert pn.row_stats_exchange(config, kind, gpu_fences=False).loads_as_matrix
    _run_and_check(rng, kind, 128, 64, 512, config, residual=False, vectors=True,
                   bias_mean=bias_mean)


@pytest.mark.parametrize("kind, residual", [("rms", False), ("layer", True)])
def test_chained_blocks_continue_one_pipeline(rng, kind, residual):
    """chain_blocks: a cluster's three row blocks run as one pipeline (the TMA warpgroup
    runs a block ahead of the epilogue), 4 K steps over 2 stages per block."""
    config = pn.PostNormConfig(tile_m=64, tile_n=64, cluster_n=2, tile_k=32,
                               max_concurrent_steps=2, transport="global", grid_clusters=1,
                               chain_blocks=True)
    _run_and_check(rng, kind, 192, 128, 256, config, residual=residual, vectors=True)


@pytest.mark.parametrize("kind, chained", [("rms", True), ("layer", False)])
def test_residual_in_registers(rng, kind, chained):
    """residual_in_registers: the residual loads from global memory straight into the
    WGMMA layout before the K-loop (no staged tile), h and y leave in pieces; chained
    or not, over several blocks."""
    config = pn.PostNormConfig(tile_m=64, tile_n=64, cluster_n=2, tile_k=32,
                               max_concurrent_steps=2, transport="global", grid_clusters=1,
                               chain_blocks=chained, residual_in_registers=True)
    _run_and_check(rng, kind, 192, 128, 256, config, residual=True, vectors=True)


@pytest.mark.parametrize(
    "kind, tile_n, cluster_n, residual, chained, in_registers",
    [("rms", 64, 2, True, False, False), ("layer", 64, 2, True, True, True),
     ("rms", 64, 8, False, True, False), ("layer", 64, 8, False, False, False),
     ("layer", 256, 2, True, False, True), ("rms", 256, 2, True, False, False)],
    ids=["rms-staged-residual", "layer-chained-registers", "rms-8-partials-chained",
         "layer-8-partials", "layer-256-wide-registers", "rms-256-wide-staged"],
)
def test_split_rows_give_each_warpgroup_its_own_rows(rng, kind, tile_n, cluster_n, residual,
                                                     chained, in_registers):
    """split_rows: the two MMA warpgroups stack (each 64 rows x all of the CTA's columns),
    so a row has one partial per CTA and each warpgroup reads its own rows' partials: one
    by one (2 a row) or as one [rows, 8] matrix, over three row blocks. 256-wide tiles
    take their epilogue 64 columns at a time."""
    config = pn.PostNormConfig(tile_m=64, tile_n=tile_n, cluster_n=cluster_n, tile_k=32,
                               max_concurrent_steps=2, transport="global", grid_clusters=1,
                               chain_blocks=chained, residual_in_registers=in_registers,
                               split_rows=True)
    assert (config.cta_m, config.cta_n) == (128, tile_n)
    _run_and_check(rng, kind, 384, 128, tile_n * cluster_n, config, residual=residual,
                   vectors=True, bias_mean=100.0 if kind == "layer" else 0.0)


def test_chained_blocks_need_whole_rounds_of_stages():
    config = pn.PostNormConfig(tile_m=64, tile_n=64, cluster_n=2, tile_k=32,
                               max_concurrent_steps=3, transport="global", chain_blocks=True)
    with pytest.raises(Unsupported, match="divisible by max_concurrent_steps=3"):
        pn.check_shape(64, 128, 256, config, "rms")
    with pytest.raises(Unsupported, match="two or more row blocks per cluster"):
        pn.check_shape(128, 96, 256, dataclasses.replace(config, grid_clusters=2), "rms")


@pytest.mark.parametrize("pre_norm_sum", [True, False], ids=["h", "no-h"])
@pytest.mark.parametrize(
    "kind, tile_m, tile_n",
    [("rms", 128, 128), ("layer", 64, 256), ("rms", 64, 64)],
    ids=["rms-4-pieces", "layer-4-pieces", "rms-1-piece"],
)
def test_pieces_through_two_slots_over_several_blocks(rng, kind, tile_m, tile_n, pre_norm_sum):
    """Without a residual, h and y leave 64 x 64 at a time through two alternating slots
    (1-4 pieces per tile), continuing across h, y and row blocks; h only if asked."""
    config = pn.PostNormConfig(tile_m=tile_m, tile_n=tile_n, cluster_n=2, tile_k=64,
                               max_concurrent_steps=2, transport="global", grid_clusters=1)
    _run_and_check(rng, kind, 2 * tile_m, 64, 4 * tile_n, config, residual=False, vectors=True,
                   pre_norm_sum=pre_norm_sum)


def test_residual_keeps_whole_staged_tiles_without_h(rng):
    """A residual stages whole tiles; with pre_norm_sum=False only y is written."""
    config = pn.PostNormConfig(tile_m=64, tile_n=64, cluster_n=2, tile_k=64,
                               max_concurrent_steps=2, transport="global", grid_clusters=1)
    _run_and_check(rng, "rms", 128, 64, 256, config, residual=True, vectors=True,
                   pre_norm_sum=False)


@pytest.mark.parametrize(
    "kind, tile_n, in_registers, split_rows, chained",
    [("rms", 64, False, False, False), ("layer", 64, True, False, True),
     ("rms", 256, False, True, False), ("layer", 256, True, True, False)],
    ids=["rms-staged", "layer-registers-chained", "rms-256-wide-staged-split",
         "layer-256-wide-registers-split"],
)
def test_residual_after_is_added_to_y_after_the_gain(rng, kind, tile_n, in_registers,
                                                     split_rows, chained):
    """r + Norm(x @ W + b) * g (Gemma 2/3, OLMo 2): the residual tile arrives staged or in
    registers as before the norm, but is added to y after the gain, over three row blocks;
    judged against float64 (the before-the-norm form would fail the judge)."""
    config = pn.PostNormConfig(tile_m=64, tile_n=tile_n, cluster_n=2, tile_k=32,
                               max_concurrent_steps=2, transport="global", grid_clusters=1,
                               chain_blocks=chained, residual_in_registers=in_registers,
                               split_rows=split_rows)
    rows = 3 * config.cta_m
    _run_and_check(rng, kind, rows, 128, config.cta_n * 2, config, residual=True, vectors=True,
                   pre_norm_sum=False, bias_mean=100.0 if kind == "layer" else 0.0,
                   residual_after=True)


def test_residual_after_refuses_a_pre_norm_sum(rng):
    """The staged residual is read after the norm, where h would have overwritten it."""
    x = jnp.asarray(rng.standard_normal((64, 64)).astype(BF16))
    w = jnp.asarray(rng.standard_normal((64, 256)).astype(BF16))
    r = jnp.asarray(rng.standard_normal((64, 256)).astype(BF16))
    config = pn.PostNormConfig(tile_m=64, tile_n=64, cluster_n=2, transport="global")
    with pytest.raises(ValueError, match="residual_after needs a residual and pre_norm_sum"):
        pn.post_norm_matmul(x, w, None, None, None, r, kind="rms", eps=1e-6, config=config,
                            residual_after=True, interpret=True)


@pytest.mark.parametrize("op", ["dense_rms_norm", "dense_layer_norm"])
def test_residual_after_through_the_op_and_its_gradient(rng, op):
    """`residual_after=` through the public op on the kernel (rows padded to 64), and its
    gradient (forward on the kernel, d residual_after = dy), against float64."""
    inputs = _inputs(rng, 50, 128, 256, BF16, residual=False,
                     norm_bias=op == "dense_layer_norm")
    inputs["residual_after"] = rng.standard_normal((50, 256)).astype(BF16)
    inputs["scale_offset"] = 1.0
    assert check_op(op, "interpret", **inputs) <= 1.0
    assert_race_free()
    assert check_grad(op, "interpret", **inputs) <= 1.0
    assert_race_free()


# ------------------------------------------------------------------- heuristics


def test_select_config_covers_rows_up_to_4096():
    wide = pn.select_config(8192, 4096, 4096, BF16, kind="layer")
    assert (wide.tile_m, wide.tile_n, wide.cluster_n) == (64, 256, 8)
    mid = pn.select_config(4096, 4096, 2048, BF16, kind="rms")
    assert (mid.tile_m, mid.tile_n, mid.cluster_n) == (128, 128, 8)
    single = pn.select_config(128, 512, 256, BF16, kind="rms")
    assert single.cluster_n == 1
    for config, kind in ((wide, "layer"), (mid, "rms"), (single, "rms")):
        assert pn.smem_bytes(config, kind) <= hardware.SMEM_BYTES_PER_CTA
    assert pn.max_n() == 4096


@pytest.mark.parametrize("kind", ["rms", "layer"])
def test_partials_read_in_place_leave_residual_cases_deep_pipelines(kind):
    """Through global memory the partials are read where the peers stored them (no
    shared-memory gather), so a residual's whole staged tiles still leave room for
    64 x 3 stages at rows of 4096 (LayerNorm's 16 x 3 partials took 52 KiB there and
    forced 64 x 2)."""
    config = pn.select_gpu_config(8192, 4096, 4096, BF16, kind=kind, residual=True)
    assert (config.transport, config.cluster_n) == ("semaphore", 16)
    assert (config.tile_k, config.max_concurrent_steps) == (64, 3)
    # LayerNorm's residual goes straight to registers (measured faster); RMSNorm's is staged.
    assert config.residual_in_registers == (kind == "layer")
    exchange = pn.row_stats_exchange(config, kind)
    assert exchange.smem_scratch().gathered is None and exchange.gathered_in_global


@pytest.mark.parametrize("m, n, chained", [(8192, 4096, True), (8192, 2048, True),
                                           (8192, 1024, True), (4096, 1024, False)])
def test_gpu_picks_chain_row_blocks_where_every_group_gets_two(m, n, chained):
    """RMSNorm without a residual fits 64 x 4 stages, which chain over K = 4096's 64 steps;
    the grid then takes the same rounds over fewer groups (8192 x 1024: 32 groups of 2
    blocks, not 33 with one holding a single block). 4096 x 1024 has one block a group."""
    config = pn.select_gpu_config(m, 4096, n, BF16, kind="rms", num_sms=132)
    assert config.chain_blocks == chained
    blocks = m // config.cta_m
    if chained:
        assert (config.tile_k, config.max_concurrent_steps) == (64, 4)
        assert blocks >= 2 * config.grid_clusters
        unchained = pn.select_gpu_config(m, 4096, n, BF16, kind="rms", residual=True)
        rounds = [-(-blocks // c.grid_clusters) for c in (config, unchained)]
        assert rounds[0] == rounds[1]
    pn.check_shape(m, 4096, n, config, "rms")


@pytest.mark.parametrize("kind, residual, stacked", [
    ("rms", False, True), ("rms", True, True), ("layer", True, True), ("layer", False, False)])
def test_grid_groups_stack_their_warpgroups_where_measured_faster(kind, residual, stacked):
    """On grid groups (and the interpreter's global transport) the MMA warpgroups take the
    CTA's row halves, 64 x 256 each, where the H200 measured that faster; LayerNorm without
    a residual (unmeasured) and DSMEM clusters keep them side by side. Either way a CTA
    covers 128 x 256."""
    for transport in ("semaphore", "global"):
        config = pn.select_config(8192, 4096, 2048, BF16, kind=kind, residual=residual,
                                  transport=transport)
        assert config.split_rows == stacked
        assert (config.cta_m, config.cta_n) == (128, 256)
        assert (config.tile_m, config.tile_n) == ((64, 256) if stacked else (128, 128))
    cluster = pn.select_config(8192, 4096, 2048, BF16, kind=kind, residual=residual)
    assert not cluster.split_rows


def test_shape_errors_name_the_dimension():
    config = pn.PostNormConfig(tile_m=128, tile_n=128, cluster_n=2)
    with pytest.raises(Unsupported, match="M=100 must be divisible by the CTA's 128 rows"):
        pn.check_shape(100, 256, 512, config)
    with pytest.raises(Unsupported, match="N=256 must equal cluster_n=2 x the CTA's 256 columns"):
        pn.check_shape(128, 256, 256, config)
    stacked = dataclasses.replace(config, tile_m=64, tile_n=256, split_rows=True)
    with pytest.raises(Unsupported, match="M=64 must be divisible by the CTA's 128 rows"):
        pn.check_shape(64, 256, 512, stacked)


def test_wide_rows_and_float32_are_unsupported(rng):
    x = rng.standard_normal((128, 64)).astype(BF16)  # above decode's 64 rows: the kernel's rules
    too_wide = (rng.standard_normal((64, 8192)) / 8).astype(BF16)
    with pytest.raises(Unsupported, match="N=8192"):
        jaxnorm.dense_rms_norm(x, too_wide, None, None, impl="interpret")
    with pytest.raises(Unsupported, match="float32"):
        jaxnorm.dense_rms_norm(x.astype(F32), too_wide[:, :256].astype(F32), None, None,
                               impl="interpret")
    # impl=None serves it (xla on a CPU), judged against the float64 reference.
    assert check_op("dense_rms_norm", None, x=x, kernel=too_wide, eps=1e-6) <= 1.0


def test_persistent_grid_stays_within_the_clusters_that_run_at_once():
    """A grid of more clusters than the GPU holds at once serializes (measured on the H200)."""
    for m, n, cluster in ((8192, 2048, 8), (8192, 1024, 4), (8192, 512, 2)):
        config = pn.select_config(m, 4096, n, BF16, kind="rms", num_sms=132)
        assert config.cluster_n == cluster
        assert config.grid_clusters == min(m // config.tile_m,
                                           hardware.resident_clusters(cluster, 132))
    assert hardware.resident_clusters(8, 132) == 15
    assert hardware.resident_clusters(8, 114) == 12  # elsewhere 7/8 of the SMs' worth


def test_semaphore_transport_refuses_what_could_deadlock(rng):
    """Grid groups wait on each other, so every CTA must be resident; the interpreter
    cannot allocate the global semaphores at all."""
    x = jnp.asarray(rng.standard_normal((256, 64)).astype(BF16))
    w = jnp.asarray(rng.standard_normal((64, 512)).astype(BF16))
    config = pn.PostNormConfig(tile_m=64, tile_n=128, cluster_n=2, transport="semaphore")
    with pytest.raises(Unsupported, match="interpreter cannot allocate global semaphores"):
        pn.post_norm_matmul(x, w, None, None, None, None, kind="rms", eps=1e-6, config=config,
                            interpret=True)
    too_many = pn.PostNormConfig(tile_m=64, tile_n=128, cluster_n=16, transport="semaphore",
                                 grid_clusters=9)
    with pytest.raises(Unsupported, match="needs every CTA resident"):
        pn.post_norm_matmul(jnp.zeros((64 * 9, 64), BF16), jnp.zeros((64, 4096), BF16), None,
                            None, None, None, kind="rms", eps=1e-6, config=too_many)
    assert pn.select_config(8192, 4096, 4096, BF16, kind="rms",
                            transport="semaphore").cluster_n == 16


@pytest.mark.parametrize(
    "m, n, transport",
    [(4096, 1024, "semaphore"), (8192, 1024, "semaphore"), (4096, 2048, "semaphore"),
     (8192, 2048, "semaphore"), (8192, 4096, "semaphore"), (4096, 4096, "semaphore"),
     (8192, 512, "dsmem")],
)
def test_gpu_picks_a_grid_group_where_it_saves_rounds(m, n, transport):
    """The picks measured fastest on the H200 (docs/mosaic-notes.md)."""
    config = pn.select_gpu_config(m, 4096, n, BF16, kind="rms", num_sms=132)
    assert config.transport == transport
    blocks = m // config.tile_m
    assert pn.grid_size(config, blocks) * config.cluster_n <= 132


@pytest.mark.parametrize("m, k", [(4096, 1024), (4096, 6912), (2048, 1024), (2048, 6912)])
def test_rows_no_cluster_covers_take_a_grid_group(m, k):
    """Gemma-3-1B's o- and down-projections (N = 1152 = 9 CTAs of 128 columns): no cluster of
    <= 8 CTAs covers the row evenly, so the GPU pick is a grid group of 9; rows neither
    serves keep the cluster's reason."""
    config = pn.select_gpu_config(m, k, 1152, BF16, kind="rms", residual=True, num_sms=132)
    assert (config.transport, config.cluster_n, config.cta_n) == ("semaphore", 9, 128)
    assert pn.grid_size(config, m // config.cta_m) * config.cluster_n <= 132
    with pytest.raises(Unsupported, match="N=8192 > 4096"):
        pn.select_gpu_config(m, k, 8192, BF16, kind="rms")


@pytest.mark.parametrize("kind", ["rms", "layer"])
def test_an_odd_group_of_ctas_shares_a_row(rng, kind):
    """Three CTAs a row (six partials), as Gemma-3-1B's nine are on the GPU, the residual
    added after the norm over two row blocks, judged against float64."""
    config = pn.PostNormConfig(tile_m=64, tile_n=64, cluster_n=3, tile_k=32,
                               max_concurrent_steps=2, transport="global", grid_clusters=1)
    _run_and_check(rng, kind, 2 * config.cta_m, 96, 3 * config.cta_n, config, residual=True,
                   vectors=True, pre_norm_sum=False,
                   bias_mean=100.0 if kind == "layer" else 0.0, residual_after=True)
