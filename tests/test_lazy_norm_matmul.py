"""The lazy pre-norm GEMM under the Mosaic GPU interpreter, with race detection, on a CPU.

Every kernel run here is simulated warpgroup by warpgroup (TMA, mbarriers,
wgmma) with a vector-clock race detector; uninitialized memory reads as NaN,
so an output element the kernel fails to write fails the check. Inputs are
fresh random draws (never zeros). Sizes stay small (K, N <= 256) because the
interpreter is slow; the same kernels are compile-checked at real sizes in
test_cuda_lowering_dense.py and run on the H200 by bench/gpu/check_kernels.py.
"""

from __future__ import annotations

import dataclasses
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxnorm import row_stats
from jaxnorm.backends import mosaic_dense
from jaxnorm.dispatch import Unsupported
from pallas_kernels import gemm_config
from pallas_kernels import hardware
from pallas_kernels import lazy_norm_matmul as lz
from pallas_kernels import plain_matmul as pm
from verify import references as ref
from verify import tolerances as tol
from verify.checks import check_outputs, check_op
from verify.residual import check_statistics_of_rounded
from kernel_checks import assert_race_free

BF16 = jnp.bfloat16


def _rng(request) -> np.random.Generator:
    """A fresh stream per test, reproducible from the test's id."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


def _inputs(rng, m, k, ns, dtype=BF16, *, scale=False, offset=0.0, norm_bias=False,
            bias=(True,), mean_ratio=0.0):
    x = rng.standard_normal((m, k))
    if mean_ratio:
        x = x + mean_ratio * np.where(rng.random((m, 1)) < 0.5, -1.0, 1.0)
    inputs = dict(
        x=jnp.asarray(x, dtype),
        kernel=[jnp.asarray(rng.standard_normal((k, n)) / np.sqrt(k), dtype) for n in ns],
        eps=1e-6,
    )
    inputs["bias"] = [jnp.asarray(rng.standard_normal(n), jnp.float32) if b else None
                      for n, b in zip(ns, bias * len(ns))]
    if scale:
        centre = 0.0 if offset else 1.0
        inputs["scale"] = jnp.asarray(centre + 0.2 * rng.standard_normal(k), jnp.float32)
        inputs["scale_offset"] = offset
    if norm_bias:
        inputs["norm_bias"] = jnp.asarray(0.2 * rng.standard_normal(k), jnp.float32)
    return inputs


# Through jaxnorm's ops (impl="interpret" runs the Mosaic backend under the interpreter).
OP_CASES = {
    "rms_M1_folded_bias": ("rms_norm_dense", 1, 128, (192,), {}),
    "rms_M3_two_weights_gemma_gain": (
        "rms_norm_dense", 3, 128, (128, 64), dict(scale=True, offset=1.0, bias=(True, False))),
    "rms_M200_gain_weights_scaled": ("rms_norm_dense", 200, 64, (64,), dict(scale=True)),
    "rms_M130_f16_gain": ("rms_norm_dense", 130, 128, (128,), dict(scale=True,
                                                                   dtype=jnp.float16)),
    "ln_M64_folded_prenormalized": ("layer_norm_dense", 64, 128, (256,), {}),
    "ln_M256_lazy_norm_bias_two_weights": (
        "layer_norm_dense", 256, 128, (64, 64), dict(norm_bias=True)),
    "ln_M256_lazy_gain_folded_per_call": (
        "layer_norm_dense", 256, 128, (64,), dict(scale=True, norm_bias=True)),
    "ln_M130_gain_three_weights": (
        "layer_norm_dense", 130, 128, (128, 64, 64), dict(scale=True, norm_bias=True)),
    "ln_M128_lazy_large_mean": ("layer_norm_dense", 128, 256, (64,), dict(mean_ratio=100.0)),
}


@pytest.mark.parametrize("case", list(OP_CASES))
def test_op_matches_reference(case, request):
    op, m, k, ns, kw = OP_CASES[case]
    dtype = kw.pop("dtype", BF16)
    inputs = _inputs(_rng(request), m, k, ns, dtype, **kw)
    assert check_op(op, "interpret", **inputs) <= 1.0
    assert_race_free()


def _judge(outs, inputs, kind: str) -> float:
    """Worst error/tolerance (verify's judge) of kernel-level outputs."""
    op = "rms_norm_dense" if kind == "rms" else "layer_norm_dense"
    return check_outputs(op, outs, **inputs)


def _lazy(kind: str, inputs: dict, **kw):
    common = dict(eps=inputs["eps"], scale=inputs.get("scale"),
                  scale_offset=inputs.get("scale_offset", 0.0), biases=inputs["bias"],
                  interpret=True, **kw)
    if kind == "rms":
        return lz.lazy_rms_matmul(inputs["x"], inputs["kernel"], **common)
    return lz.lazy_layer_norm_matmul(inputs["x"], inputs["kernel"],
                                     norm_bias=inputs.get("norm_bias"), **common)


@pytest.mark.parametrize("kind", ["rms", "ln"])
def test_row_statistics_of_the_output(kind, request):
    """Per-row partial (sum, M2) of y over column blocks, Chan-combined, match y's statistics;
    the second weight is narrower than a CTA tile (its second partial covers no column)."""
    m, k, ns = 130, 128, (256, 64)
    inputs = _inputs(_rng(request), m, k, ns)
    config = lz.default_config(m, k, ns)
    extra = dict(prenormalize=False) if kind == "ln" else {}
    outs, stats = _lazy(kind, inputs, config=config, return_row_stats=True, **extra)
    assert_race_free()
    assert _judge(outs, inputs, kind) <= 1.0
    assert 0 in gemm_config.part_columns(ns[1], config)
    for y, n, (sums, m2s) in zip(outs, ns, stats):
        assert sums.shape[1] == m and m2s.shape[1] == m
        mean, m2 = row_stats.from_partials(sums, m2s, gemm_config.part_columns(n, config))
        assert check_statistics_of_rounded(y, mean, m2) <= 1.0


def test_row_statistics_need_whole_warpgroup_tiles(request):
    inputs = _inputs(_rng(request), 8, 64, (192,))
    config = gemm_config.TuningConfig(tile_n=128)
    with pytest.raises(Unsupported, match="N=192 to be a multiple of tile_n=128"):
        _lazy("rms", inputs, config=config, return_row_stats=True)


@pytest.mark.parametrize(
    "m, config",
    [
        (1, None),  # decode, warpgroups split along M (few N tiles)
        (16, gemm_config.TuningConfig(tile_m=64, tile_n=64, max_concurrent_steps=3)),  # along N
        (100, None),  # rows padded to 104 for TMA
        # One wgmma step in flight, two slots: each released a step late, across tiles.
        (300, gemm_config.TuningConfig(max_concurrent_steps=2, wgmma_in_flight=1)),
        # Pingpong: the warpgroups take every other tile (an odd count per CTA) from one
        # ring (of three slots: fills of a slot alternate owners); and a step in flight.
        (320, gemm_config.TuningConfig(tile_m=64, tile_n=64, max_concurrent_steps=3,
                                       pingpong=True)),
        (200, gemm_config.TuningConfig(tile_m=64, tile_n=64, max_concurrent_steps=3,
                                       pingpong=True, wgmma_in_flight=1)),
    ],
)
def test_plain_matmul(m, config, request):
    rng = _rng(request)
    x = jnp.asarray(rng.standard_normal((m, 128)), BF16)
    w = jnp.asarray(rng.standard_normal((128, 192)) / np.sqrt(128), BF16)
    y = pm.plain_matmul(x, w, config=config, interpret=True)
    assert_race_free()
    y64 = ref.f64(x) @ ref.f64(w)
    t = tol.dense_tolerance(ref.f64(x), ref.f64(w), y64, x.dtype, x.dtype)
    assert y.dtype == BF16 and np.all(np.abs(ref.f64(y) - y64) <= t)


def test_layer_norm_paths_agree_with_passed_statistics(request):
    """Precomputed (s, s mu) and column sums give the same result as computing them."""
    m, k, ns = 128, 128, (64,)
    inputs = _inputs(_rng(request), m, k, ns)
    x, (w,) = inputs["x"], inputs["kernel"]
    lazy_inputs = dict(eps=1e-6, biases=inputs["bias"], prenormalize=False, interpret=True)
    (computed,) = lz.lazy_layer_norm_matmul(x, [w], **lazy_inputs)
    (given,) = lz.lazy_layer_norm_matmul(
        x, [w], col_sums=[jnp.sum(w.astype(jnp.float32), axis=0)],
        row_vectors=lz.layer_norm_row_vectors(x, 1e-6), **lazy_inputs)
    assert_race_free()
    np.testing.assert_array_equal(np.asarray(computed), np.asarray(given))
    assert _judge([given], inputs, "ln") <= 1.0


@pytest.mark.parametrize(
    "x_shape, w_shape, dtype, reason",
    [
        ((16, 100), (100, 128), BF16, "K=100 must be a multiple of tile_k=64"),
        ((16, 128), (128, 96), BF16, "N=96 must be a multiple of 64"),
        ((16, 128), (128, 128), jnp.float32, "float32"),
        ((0, 128), (128, 128), BF16, "M=0"),
    ],
)
def test_unsupported_shapes_fall_back_with_a_reason(x_shape, w_shape, dtype, reason):
    x, w = jnp.ones(x_shape, dtype), jnp.ones(w_shape, dtype)
    for call in (
        lambda: mosaic_dense.rms_norm_dense(x, None, (w,), (None,), eps=1e-6, scale_offset=0.0,
                                            interpret=True),
        lambda: mosaic_dense.layer_norm_dense(x, None, None, (w,), (None,), eps=1e-6,
                                              scale_offset=0.0, interpret=True),
    ):
        with pytest.raises(Unsupported, match=reason):
            call()


def test_kernel_dtype_must_match_x():
    x, w = jnp.ones((8, 128), BF16), jnp.ones((128, 128), jnp.float32)
    with pytest.raises(Unsupported, match="copy them"):
        mosaic_dense.rms_norm_dense(x, None, (w,), (None,), eps=1e-6, scale_offset=0.0,
                                    interpret=True)


@pytest.mark.parametrize("m", [1, 16, 64, 65, 200, 2048, 8191, 65536])
@pytest.mark.parametrize("ns", [(4096,), (6144,), (14336,), (4096, 1024, 1024)])
def test_default_config_is_valid(m, ns):
    config = lz.default_config(m, 4096, ns)
    gemm_config.check_shapes(jax.ShapeDtypeStruct((m, 4096), BF16),
                      [jax.ShapeDtypeStruct((4096, n), BF16) for n in ns], config)
    assert gemm_config.smem_bytes(config, 2) <= hardware.SMEM_BYTES_PER_CTA
    if m <= 64:
        assert config.tile_m == 64  # the decode config


def test_wgmma_in_flight_is_zero_or_one():
    x, w = jax.ShapeDtypeStruct((128, 128), BF16), jax.ShapeDtypeStruct((128, 128), BF16)
    with pytest.raises(Unsupported, match="wgmma_in_flight=2 must be 0 or 1"):
        gemm_config.check_shapes(x, [w], gemm_config.TuningConfig(wgmma_in_flight=2))


@pytest.mark.parametrize("m, offset, config", [
    (200, 0.0, gemm_config.TuningConfig(tile_m=64, tile_n=64, max_concurrent_steps=2)),
    (130, 1.0, gemm_config.TuningConfig(tile_m=64, tile_n=64, max_concurrent_steps=3,
                                        wg_dimension=gemm_config.MatmulDimension.N)),
])
def test_column_gain_in_the_mainloop(m, offset, config, request):
    """The unfolded gain multiplies each x tile in registers before wgmma (several M and N
    tiles, K steps over a two- or three-slot ring, two weights), against float64."""
    inputs = _inputs(_rng(request), m, 256, (128, 64), scale=True, offset=offset,
                     bias=(True, False))
    outs = _lazy("rms", inputs, gain_in_kernel=True, config=config)
    assert _judge(outs, inputs, "rms") <= 1.0
    assert_race_free()


def test_column_gain_declines_clusters_and_wgmma_in_flight(request):
    inputs = _inputs(_rng(request), 256, 128, (128,), scale=True)
    for config in (gemm_config.TuningConfig(tile_m=64, tile_n=64, wgmma_in_flight=1),
                   gemm_config.TuningConfig(
                       tile_m=64, tile_n=64,
                       cluster_dimension=gemm_config.MatmulDimension.M)):
        with pytest.raises(Unsupported, match="column gain"):
            _lazy("rms", inputs, gain_in_kernel=True, config=config)


def test_pingpong_with_row_statistics_vectors_and_the_gain_in_the_mainloop(request):
    """Pingpong warpgroups with every epilogue vector (row scale, bias), the row statistics out
    and the unfolded gain applied in the mainloop, over several tiles per CTA; three K steps a
    tile in a ring of two slots, so a slot's consecutive fills belong to either warpgroup."""
    config = gemm_config.TuningConfig(tile_m=64, tile_n=64, max_concurrent_steps=2,
                                      pingpong=True)
    inputs = _inputs(_rng(request), 200, 192, (192, 64), scale=True, bias=(True, False))
    outs, stats = _lazy("rms", inputs, gain_in_kernel=True, config=config,
                        return_row_stats=True)
    assert_race_free()
    assert _judge(outs, inputs, "rms") <= 1.0
    for y, (sums, m2s) in zip(outs, stats):
        mean, m2 = row_stats.from_partials(sums, m2s,
                                           gemm_config.part_columns(y.shape[1], config))
        assert check_statistics_of_rounded(y, mean, m2) <= 1.0


def test_pingpong_declines_clusters_and_the_gated_kernel(request):
    inputs = _inputs(_rng(request), 256, 128, (128,))
    config = gemm_config.TuningConfig(tile_m=64, tile_n=64, pingpong=True,
                                      cluster_dimension=gemm_config.MatmulDimension.N)
    with pytest.raises(Unsupported, match="pingpong"):
        _lazy("rms", inputs, config=config)
    from pallas_kernels import gated_matmul

    w = inputs["kernel"][0]
    with pytest.raises(Unsupported, match="pingpong"):
        gated_matmul.check_gated_shapes(inputs["x"], w, w, dataclasses.replace(
            config, cluster_dimension=None))
