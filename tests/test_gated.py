"""The gated MLP input (`jaxnorm.rms_norm_gated_dense`, `pallas_kernels.gated_matmul`) against
float64: the kernel under the Mosaic GPU interpreter with race detection, the xla path, the
gradients, and the errors for what is refused. Inputs are fresh random draws."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxnorm
from jaxnorm.backends import mosaic_gated
from kernel_checks import assert_race_free
from pallas_kernels import gated_matmul as gm
from pallas_kernels import hardware
from pallas_kernels.errors import Unsupported
from pallas_kernels.gemm_config import MatmulDimension, TuningConfig
from verify import gated as vg

BF16, F16 = jnp.bfloat16, jnp.float16
ACTIVATIONS = tuple(gm.ACTIVATIONS)


def _inputs(rng, m, k, n, dtype=BF16, *, gain=True, offset=0.0, biases=(True, True)):
    centre = 0.0 if offset else 1.0
    return dict(
        x=jnp.asarray(rng.standard_normal((m, k)), dtype),
        scale=jnp.asarray(centre + 0.2 * rng.standard_normal(k), jnp.float32) if gain else None,
        gate_kernel=jnp.asarray(rng.standard_normal((k, n)) / np.sqrt(k), dtype),
        up_kernel=jnp.asarray(rng.standard_normal((k, n)) / np.sqrt(k), dtype),
        gate_bias=jnp.asarray(rng.standard_normal(n), jnp.float32) if biases[0] else None,
        up_bias=jnp.asarray(rng.standard_normal(n), jnp.float32) if biases[1] else None,
    ), dict(scale_offset=offset)


def _positional(inputs: dict) -> tuple:
    return tuple(inputs[name] for name in ("x", "scale", "gate_kernel", "up_kernel",
                                           "gate_bias", "up_bias"))


@pytest.mark.parametrize("name", ACTIVATIONS)
def test_kernel_activations_match_float64(name):
    """The epilogue's float32 activations (exp, tanh, a rational erf) within a few ulps."""
    g = np.linspace(-12.0, 12.0, 100_001).astype(np.float32)
    got = np.asarray(gm.ACTIVATIONS[name](jnp.asarray(g)), np.float64)
    expected = vg.activation(name, g.astype(np.float64))
    # A few float32 ulps of |g| (the activations are at most |g| in size).
    assert np.all(np.abs(got - expected) <= 2e-6 * (np.abs(g) + 1e-3))


# (M, K, N, activation, dtype, input options): several row blocks with M not a multiple of
# the tile (130), N not a multiple of the CTA tile (192) or below it (64), gain folded into x
# (M <= 4 N) or into the weights (M > 4 N), Gemma's 1 + g gain, one or two biases, decode.
KERNEL_CASES = {
    "M130_N192_silu_gain_biases": (130, 128, 192, "silu", BF16, {}),
    "M256_N64_gelu_tanh_gemma_gate_bias": (256, 128, 64, "gelu_tanh", BF16,
                                           dict(offset=1.0, biases=(True, False))),
    "M300_N64_gelu_weights_scaled": (300, 64, 64, "gelu", BF16, dict(biases=(False, False))),
    "M1_N128_silu_folded_f16": (1, 128, 128, "silu", F16, dict(gain=False,
                                                               biases=(False, True))),
}


@pytest.mark.parametrize("case", list(KERNEL_CASES))
def test_interpreted_kernel_matches_float64(case, rng):
    m, k, n, activation, dtype, options = KERNEL_CASES[case]
    inputs, kw = _inputs(rng, m, k, n, dtype, **options)
    y = jaxnorm.rms_norm_gated_dense(*_positional(inputs), activation=activation,
                                     impl="interpret", **kw)
    assert_race_free()
    assert y.shape == (m, n) and y.dtype == dtype
    assert vg.check_gated(y, **inputs, activation_name=activation, act_dtype=np.float32,
                          **kw) <= 1.0


@pytest.mark.parametrize("config", [
    TuningConfig(tile_m=128, tile_n=64, max_concurrent_steps=3, epi_tile_n=32),
    TuningConfig(tile_m=64, tile_n=64, max_concurrent_steps=2, wg_dimension=MatmulDimension.M),
    TuningConfig(tile_m=128, tile_n=64, max_concurrent_steps=3, epi_tile_n=32, wgmma_in_flight=1),
], ids=["tile_m128", "wg_along_M", "wgmma_in_flight"])
def test_kernel_configs(config, rng):
    """The 128-row tile (two 64-column accumulators per warpgroup) and warpgroups split along M,
    over several tiles per CTA (the interpreter runs 4 CTAs)."""
    inputs, _ = _inputs(rng, 300, 192, 320)
    y = gm.gated_rms_matmul(inputs["x"], inputs["gate_kernel"], inputs["up_kernel"],
                            scale=inputs["scale"], gate_bias=inputs["gate_bias"],
                            up_bias=inputs["up_bias"], config=config, interpret=True)
    assert_race_free()
    assert vg.check_gated(y, **inputs, act_dtype=np.float32) <= 1.0


def test_passed_row_scale_is_used(rng):
    """A given row scale replaces the statistics pass: 2 r gives RMSNorm(x) with a gain of 2."""
    inputs, _ = _inputs(rng, 64, 64, 64, gain=False, biases=(False, False))
    x, wg, wu = inputs["x"], inputs["gate_kernel"], inputs["up_kernel"]
    y = gm.gated_rms_matmul(x, wg, wu, row_scale=2 * gm.rms_row_scale(x, 1e-6), interpret=True)
    assert vg.check_gated(y, **dict(inputs, scale=np.full(64, 2.0, np.float32)),
                          act_dtype=np.float32) <= 1.0


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("dtype", [BF16, jnp.float32], ids=["bf16", "f32"])
def test_xla_matches_float64(activation, dtype, rng):
    inputs, kw = _inputs(rng, 2 * 37, 96, 80, dtype, offset=1.0)
    x = inputs["x"].reshape(2, 37, 96)  # leading dims are flattened and restored
    y = jaxnorm.rms_norm_gated_dense(x, *_positional(inputs)[1:], activation=activation,
                                     impl="xla", **kw)
    assert y.shape == (2, 37, 80) and y.dtype == dtype
    assert vg.check_gated(y, **inputs, activation_name=activation, **kw) <= 1.0


def test_automatic_dispatch_runs_xla_and_says_why(rng):
    inputs, _ = _inputs(rng, 64, 64, 64)
    y = jaxnorm.rms_norm_gated_dense(*_positional(inputs))
    expected = jaxnorm.rms_norm_gated_dense(*_positional(inputs), impl="xla")
    np.testing.assert_array_equal(np.asarray(y), np.asarray(expected))
    assert "rms_norm_gated_dense" in jaxnorm.fallback_reasons()


def test_automatic_dispatch_takes_the_kernel_only_where_measured():
    gate = jax.ShapeDtypeStruct((64, 128), BF16)
    decline = functools.partial(mosaic_gated._not_measured_faster, activation="silu")
    reason = decline(jnp.ones((2048, 64), BF16), None, gate)
    assert "not measured" in reason and "impl='mosaic'" in reason
    rows = jnp.ones((mosaic_gated.MIN_MEASURED_ROWS, 64), BF16)
    assert decline(rows, None, gate) is None
    reason = mosaic_gated._not_measured_faster(rows, None, gate, activation="gelu_tanh")
    assert "'gelu_tanh'" in reason and "impl='mosaic'" in reason


GRAD_CASES = {
    "interpret_silu_gain_biases": ("interpret", "silu", 130, 64, 192, {}),
    "interpret_gelu_tanh_gemma": ("interpret", "gelu_tanh", 64, 64, 64,
                                  dict(offset=1.0, biases=(False, True))),
    "xla_gelu_folded": ("xla", "gelu", 48, 96, 80, dict(gain=False)),
}


@pytest.mark.parametrize("case", list(GRAD_CASES))
def test_gradients_match_float64(case, rng):
    impl, activation, m, k, n, options = GRAD_CASES[case]
    inputs, kw = _inputs(rng, m, k, n, **options)
    diff = {name: v for name, v in inputs.items() if v is not None}

    def f(args):
        return jaxnorm.rms_norm_gated_dense(
            args["x"], args.get("scale"), args["gate_kernel"], args["up_kernel"],
            args.get("gate_bias"), args.get("up_bias"), activation=activation, impl=impl, **kw)

    y, vjp = jax.vjp(f, diff)
    dy = jnp.asarray(rng.standard_normal(y.shape), y.dtype)
    (grads,) = vjp(dy)
    assert all(grads[name].dtype == v.dtype for name, v in diff.items())
    assert vg.check_gated_grads(grads, np.asarray(dy, np.float64), **inputs,
                                activation_name=activation, **kw) <= 1.0


@pytest.mark.parametrize("change, message", [
    (dict(activation="relu"), "activation must be one of"),
    (dict(up_kernel=jnp.ones((64, 128), BF16)), "up_kernel must have gate_kernel's shape"),
    (dict(gate_kernel=jnp.ones((32, 64), BF16)), "has K=32 rows but x has K=64"),
    (dict(gate_bias=jnp.ones(32)), r"gate_bias must have shape \(64,\)"),
    (dict(up_bias=jnp.ones(32)), r"up_bias must have shape \(64,\)"),
    (dict(scale=jnp.ones(8)), r"scale must have shape \(64,\)"),
    (dict(x=jnp.ones((4, 64), jnp.int32)), "x must be a floating-point array"),
    (dict(impl="cuda"), "impl must be None or one of"),
    (dict(eps=-1.0), "eps must be >= 0"),
])
def test_bad_arguments_raise_value_errors(change, message):
    args = dict(x=jnp.ones((4, 64), BF16), scale=jnp.ones(64), gate_kernel=jnp.ones((64, 64), BF16),
                up_kernel=jnp.ones((64, 64), BF16), gate_bias=None, up_bias=None)
    kwargs = dict(activation="silu", eps=1e-6, impl="xla")
    for name, value in change.items():
        (args if name in args else kwargs)[name] = value
    with pytest.raises(ValueError, match=message):
        jaxnorm.rms_norm_gated_dense(*args.values(), **kwargs)


@pytest.mark.parametrize("x_shape, n, dtype, kernel_dtype, reason", [
    ((16, 100), 128, BF16, BF16, "K=100 must be a multiple of tile_k=64"),
    ((16, 128), 96, BF16, BF16, "N=96 must be a multiple of 64"),
    ((16, 128), 128, jnp.float32, jnp.float32, "float32"),
    ((16, 128), 128, BF16, jnp.float32, "copy them"),
    ((0, 128), 128, BF16, BF16, "M=0"),
])
def test_unsupported_calls_say_why(x_shape, n, dtype, kernel_dtype, reason):
    x, w = jnp.ones(x_shape, dtype), jnp.ones((x_shape[1], n), kernel_dtype)
    with pytest.raises(Unsupported, match=reason):
        mosaic_gated.rms_norm_gated_dense(x, None, w, w, None, None, activation="silu",
                                          eps=1e-6, scale_offset=0.0, interpret=True)


def test_unserved_activation_and_register_budget_are_unsupported():
    x, w = jnp.ones((16, 128), BF16), jnp.ones((128, 128), BF16)
    with pytest.raises(Unsupported, match="activation 'relu' not served"):
        gm.gated_rms_matmul(x, w, w, activation="relu", interpret=True)
    with pytest.raises(Unsupported, match="exceed the MMA warpgroups' registers"):
        gm.gated_rms_matmul(x, w, w, config=TuningConfig(tile_m=128, tile_n=128),
                            interpret=True)


@pytest.mark.parametrize("m", [1, 16, 64, 65, 130, 2048, 4096, 8192, 65536])
@pytest.mark.parametrize("k, n", [(2048, 8192), (4096, 14336), (1024, 3072), (2560, 9728),
                                  (128, 64)])
def test_gated_config_is_valid(m, k, n):
    config = gm.gated_config(m, k, n)
    w = jax.ShapeDtypeStruct((k, n), BF16)
    gm.check_gated_shapes(jax.ShapeDtypeStruct((m, k), BF16), w, w, config)
    assert gm.smem_bytes(config, 2) <= hardware.SMEM_BYTES_PER_CTA
    assert config.max_concurrent_steps >= 2
    if m <= 64:
        assert config.tile_m == 64  # the decode tiles of gemm_config.default_config
