"""The residual GEMM under the Mosaic GPU interpreter, with race detection, on a CPU.

h = x @ w + b + r and its rows' (mean, M2) from the kernel's per-warpgroup partials,
judged against float64 (verify.residual): statistics combined across N tiles and
pieces, several row blocks, M not a multiple of the tile, LayerNorm-like rows with
|mean|/std = 1e3, and the statistics feeding the pre-norm kernels.
"""

from __future__ import annotations

import dataclasses
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxnorm
from jaxnorm import row_stats
from jaxnorm.backends import mosaic_dense, mosaic_residual
from jaxnorm.dispatch import Unsupported
from kernel_checks import assert_race_free
from pallas_kernels import decode_configs, decode_matmul, gemm_config
from pallas_kernels import residual_matmul as rm
from test_residual import consume, consumer_inputs, residual_inputs
from verify import residual as vr
from verify.checks import _ratio

Config = gemm_config.TuningConfig
# 128 x 128 warpgroup tiles in 64 x 32 pieces (8 per tile, the ring wraps), CTA tile 256 wide.
PIECES = Config(tile_m=128, tile_n=128, epi_tile_m=64, epi_tile_n=32, max_concurrent_steps=3)
# Warpgroups stacked along M: one partial per CTA tile's columns.
STACKED = Config(tile_m=64, tile_n=128, epi_tile_m=64, epi_tile_n=64,
                 wg_dimension=gemm_config.MatmulDimension.M)


def _rng(request) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


def _run(inputs, config):
    h, (sums, m2s) = rm.residual_matmul(inputs["x"], inputs["kernel"], inputs["residual"],
                                        bias=inputs["bias"], config=config, interpret=True)
    assert_race_free()
    n = inputs["kernel"].shape[1]
    counts = gemm_config.part_columns(n, config or rm.residual_config(*inputs["x"].shape, n))
    mean, m2 = row_stats.from_partials(sums, m2s, counts)
    return h, row_stats.RowStats(mean, m2, n)


@pytest.mark.parametrize("case", [
    (130, 128, 512, PIECES, True, 0.0),
    (130, 128, 512, PIECES, False, 1e3),
    (200, 64, 256, STACKED, True, 1e3),
    (16, 128, 256, None, True, 0.0),
    (300, 64, 128, None, True, 0.0),
    (200, 128, 512, dataclasses.replace(PIECES, wgmma_in_flight=1), True, 0.0),
    (200, 128, 384, dataclasses.replace(PIECES, pingpong=True, max_concurrent_steps=2), True,
     1e3),
], ids=["pieces_two_n_tiles", "pieces_mean_1e3", "stacked_mean_1e3", "decode_default",
        "default_three_row_blocks", "wgmma_in_flight", "pingpong"])
def test_residual_kernel_matches_float64(case, request):
    m, k, n, config, bias, mean_ratio = case
    inputs = residual_inputs(_rng(request), (m,), k, n, bias=bias, mean_ratio=mean_ratio)
    h, stats = _run(inputs, config)
    judged = vr.judge_residual(h, stats, "float32", **inputs)
    assert max(_ratio(j) for j in judged) <= 1.0


def test_residual_ring_when_slots_per_piece_do_not_fit(request, monkeypatch):
    """With less SMEM the residual's pieces go through a three-slot ring (8 pieces a tile):
    loaded while earlier pieces are computed, each slot refilled after its store read it."""
    config = PIECES
    assert gemm_config.residual_slots(config, 2) == 8
    monkeypatch.setattr(gemm_config.hardware, "SMEM_BYTES_PER_CTA",
                        gemm_config.smem_bytes(config, 2, staging_slots=7))
    assert gemm_config.residual_slots(config, 2) == gemm_config.RESIDUAL_SLOTS
    inputs = residual_inputs(_rng(request), (130,), 128, 512, bias=True, mean_ratio=0.0)
    h, stats = _run(inputs, config)
    judged = vr.judge_residual(h, stats, "float32", **inputs)
    assert max(_ratio(j) for j in judged) <= 1.0


# The preset shapes whose table config has a 3-stage pipeline (8192x14336x4096's has 4, and
# a slot per piece does not fit beside them: it keeps the ring).
@pytest.mark.parametrize("m, k, n", [(8192, 2048, 2048), (8192, 8192, 2048), (4096, 4096, 4096),
                                     (8192, 2048, 3072)])
def test_preset_shapes_load_every_residual_piece_before_the_k_loop(m, k, n):
    config = rm.residual_config(m, k, n)
    pieces = (config.tile_m // config.epi_tile_m) * (config.tile_n // config.epi_tile_n)
    slots = gemm_config.residual_slots(config, 2)
    assert slots >= pieces
    assert gemm_config.smem_bytes(config, 2, staging_slots=slots) <= (
        gemm_config.hardware.SMEM_BYTES_PER_CTA)


def test_sum_of_squares_would_lose_the_variance(request):
    """The judge is sharp enough to fail float32 (sum, sum of squares) at |mean|/std = 1e3,
    which the kernel's (sum, M2) passes."""
    inputs = residual_inputs(_rng(request), (130,), 128, 512, bias=False, mean_ratio=1e3)
    h, stats = _run(inputs, PIECES)
    h32 = np.asarray(jnp.asarray(vr.reference(**inputs)[0], jnp.float32))
    sums, squares = h32.sum(1, dtype=np.float32), (h32 * h32).sum(1, dtype=np.float32)
    naive_m2 = squares - sums * sums / np.float32(h32.shape[1])
    kernel = {j.name: j for j in vr.judge_residual(h, stats, "float32", **inputs)}
    naive = {j.name: j for j in vr.judge_residual(h, stats._replace(m2=jnp.asarray(naive_m2)),
                                                  "float32", **inputs)}
    assert _ratio(kernel["m2"]) <= 1.0
    with pytest.raises(AssertionError, match="m2: error"):
        _ratio(naive["m2"])


@pytest.mark.parametrize("kind", ["rms", "layer"])
def test_residual_kernel_feeds_the_pre_norm_kernel(kind, request):
    """residual_dense -> rms_norm_dense / layer_norm_dense(statistics=...), both kernels."""
    rng = _rng(request)
    inputs = residual_inputs(rng, (2, 65), 64, 256, mean_ratio=3.0 if kind == "layer" else 0.0)
    h, stats = jaxnorm.residual_dense(inputs["x"], inputs["kernel"], inputs["residual"],
                                      inputs["bias"], impl="interpret")
    assert vr.check_residual("interpret", **inputs) <= 1.0
    norm_inputs = consumer_inputs(rng, kind, 256, (128, 64))
    outs = consume(kind, h, stats, norm_inputs, "interpret")
    assert_race_free()
    assert vr.check_consumer(f"{kind}_norm_dense", outs, "interpret", x=h, **norm_inputs) <= 1.0


def test_kernel_gradient_matches_float64(request):
    """The custom_vjp around the kernel: cotangents for h, mean and M2."""
    rng = _rng(request)
    inputs = residual_inputs(rng, (64,), 64, 256)
    names = ("x", "kernel", "residual", "bias")

    def f(a):
        h, stats = jaxnorm.residual_dense(*(a[k] for k in names), impl="interpret")
        return h, stats.mean, stats.m2

    out, vjp = jax.vjp(f, {k: inputs[k] for k in names})
    dh = jnp.asarray(rng.standard_normal(out[0].shape), out[0].dtype)
    dmean = jnp.asarray(rng.standard_normal(64), jnp.float32)
    dm2 = jnp.asarray(rng.standard_normal(64) / 256, jnp.float32)
    (grads,) = vjp((dh, dmean, dm2))
    args = [inputs[k] for k in names]
    expected = vr.residual_vjp(*args, dh, dmean, dm2)
    magnitudes = vr.residual_vjp(*args, dh, dmean, dm2, magnitude=True)
    assert vr.check_grads(grads, expected, magnitudes, jnp.bfloat16, 256) <= 1.0


def test_what_the_kernel_does_not_serve(request):
    inputs = residual_inputs(_rng(request), (8,), 64, 384)
    with pytest.raises(Unsupported, match="N=384 to be a multiple of the CTA tile 256"):
        rm.residual_matmul(inputs["x"], inputs["kernel"], inputs["residual"], config=PIECES,
                           interpret=True)
    f32 = residual_inputs(_rng(request), (8,), 64, 128, jnp.float32)
    with pytest.raises(Unsupported, match="float32 not served"):
        jaxnorm.residual_dense(f32["x"], f32["kernel"], f32["residual"], impl="interpret")


DecodeConfig = decode_matmul.DecodeConfig


@pytest.mark.parametrize("m, bias", [(1, True), (7, False), (64, True)])
def test_decode_rows_take_the_decode_gemm(m, bias, request, monkeypatch):
    """At M <= 64 with split-K partials summed by XLA, residual_dense's product is the decode
    GEMM's and XLA adds r; h and its statistics against float64."""
    calls = []
    original = decode_matmul.lazy_rms_decode_matmul
    monkeypatch.setattr(decode_matmul, "lazy_rms_decode_matmul",
                        lambda *a, **kw: calls.append(1) or original(*a, **kw))
    monkeypatch.setattr(decode_matmul, "decode_config",
                        lambda *a, **kw: DecodeConfig(tile_n=64, split_k=2, stages=3))
    inputs = residual_inputs(_rng(request), (m,), 128, 192, bias=bias, mean_ratio=3.0)
    assert vr.check_residual("interpret", **inputs) <= 1.0
    assert_race_free()
    assert calls


@pytest.mark.parametrize("m, bias, config", [
    (1, True, DecodeConfig(tile_n=64, split_k=2, stages=3, reduction="cluster")),
    (7, False, DecodeConfig(tile_n=64, split_k=2, stages=3, warpgroups=2, reduction="cluster")),
    (16, True, DecodeConfig(tile_n=128, split_k=2, stages=3, reduction="cluster")),
    (64, True, DecodeConfig(tile_n=64, split_k=2, stages=3, reduction="cluster")),
], ids=["m1", "m7_wg2", "m16_n128", "m64"])
def test_decode_rows_in_one_launch(m, bias, config, request, monkeypatch):
    """Where the config's K splits are a cluster, the decode kernel also adds r and writes
    h's per-tile (sum, M2) (rows of |mean|/std = 1e3 included): h and its statistics against
    float64, and no XLA add or product after the kernel."""
    calls = []
    original = decode_matmul.decode_residual_matmul
    monkeypatch.setattr(decode_matmul, "decode_residual_matmul",
                        lambda *a, **kw: calls.append(kw["config"]) or original(*a, **kw))
    monkeypatch.setattr(decode_matmul, "decode_config", lambda *a, **kw: config)
    inputs = residual_inputs(_rng(request), (m,), 256, 256, bias=bias, mean_ratio=1e3)
    assert vr.check_residual("interpret", **inputs) <= 1.0
    assert_race_free()
    assert calls == [config]


@pytest.mark.parametrize("m, warpgroups", [(1, 1), (64, 2)])
def test_the_residual_epilogue_unsplit_matches_float64(m, warpgroups, request):
    """split_k = 1 (the op keeps two launches there until timed on the GPU): the kernel alone,
    h and the combined statistics against float64."""
    inputs = residual_inputs(_rng(request), (m,), 256, 256, mean_ratio=1e3)
    config = DecodeConfig(tile_n=64, split_k=1, stages=3, warpgroups=warpgroups)
    h, sums, m2s = decode_matmul.decode_residual_matmul(
        inputs["x"], inputs["kernel"], inputs["residual"], bias=inputs["bias"], config=config,
        interpret=True)
    assert_race_free()
    mean, m2 = row_stats.from_partials(sums, m2s, config.tile_n)
    stats = row_stats.RowStats(mean, m2, 256)
    assert max(_ratio(j) for j in vr.judge_residual(h, stats, "output", **inputs)) <= 1.0


@pytest.mark.parametrize("config, reason", [
    (DecodeConfig(tile_n=128, split_k=1, stages=3), "whole CTA tiles"),
    (DecodeConfig(tile_n=64, split_k=2, stages=3), "sum of the K splits in the kernel"),
])
def test_decode_residual_kernel_says_what_it_does_not_serve(config, reason, request):
    inputs = residual_inputs(_rng(request), (8,), 128, 192)
    with pytest.raises(Unsupported, match=reason):
        decode_matmul.decode_residual_matmul(inputs["x"], inputs["kernel"], inputs["residual"],
                                             config=config, interpret=True)
    with pytest.raises(ValueError, match="residual must be"):
        decode_matmul.decode_residual_matmul(inputs["x"], inputs["kernel"],
                                             inputs["residual"][:, :64], config=config,
                                             interpret=True)


def test_automatic_use_at_decode_follows_the_measured_table():
    s = jax.ShapeDtypeStruct
    for (m, k, (n, *more)), _, ratio in decode_configs.ENTRIES:
        if more:  # several weights: not a residual_dense launch
            continue
        reason = mosaic_residual._slower_than_xla(s((m, k), jnp.bfloat16),
                                                  s((k, n), jnp.bfloat16), None, None)
        assert (reason is None if ratio <= mosaic_dense.DECODE_MAX_RATIO
                else f"{ratio:.3f}x cuBLAS" in reason)


def test_automatic_use_declined_with_the_measurement():
    """impl=None keeps the kernel out at every shape: it measured slower than XLA's x @ w + r."""
    for m in (512, 8192):
        x = jax.ShapeDtypeStruct((m, 4096), jnp.bfloat16)
        w = jax.ShapeDtypeStruct((4096, 4096), jnp.bfloat16)
        reason = mosaic_residual._slower_than_xla(x, w, None, None)
        assert mosaic_residual.MEASURED_RATIO in reason and "impl='mosaic'" in reason


@pytest.mark.parametrize("kind", ["rms", "layer"])
def test_composed_kernel_gradient_equals_the_unfused_pair(kind, request):
    """Both kernels' custom_vjps (residual_dense, then the pre-norm GEMM given the
    statistics): the gradient of h -> Norm -> dense, against float64."""
    rng = _rng(request)
    inputs = residual_inputs(rng, (32,), 64, 128)
    norm_inputs = consumer_inputs(rng, kind, 128, (64,))
    norm_inputs["bias"] = jnp.asarray(rng.standard_normal(64), jnp.float32)
    dy = jnp.asarray(rng.standard_normal((32, 64)), jnp.bfloat16)
    res_names = ("x", "kernel", "residual", "bias")
    norm_names = ("scale", "kernel", "bias") + (("norm_bias",) if kind == "layer" else ())

    def loss(a, b):
        h, stats = jaxnorm.residual_dense(*(a[k] for k in res_names), impl="interpret")
        y = consume(kind, h, stats, {**norm_inputs, **b}, "interpret")
        return jnp.sum(y.astype(jnp.float32) * dy.astype(jnp.float32))

    grads_a, grads_b = jax.grad(loss, argnums=(0, 1))(
        {k: inputs[k] for k in res_names}, {k: norm_inputs[k] for k in norm_names})
    got = {**grads_a, **{f"norm_{k}": v for k, v in grads_b.items()}}
    dy64 = np.asarray(dy, np.float64)
    expected = vr.composed_vjp(kind, inputs, norm_inputs, dy64, magnitude=False)
    magnitudes = vr.composed_vjp(kind, inputs, norm_inputs, dy64, magnitude=True)
    assert vr.check_grads(got, expected, magnitudes, jnp.bfloat16, 128) <= 1.0
