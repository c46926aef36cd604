"""The gated MLP input (`jaxnorm.rms_norm_gated_dense`, `pallas_kernels.gated_matmul`) against
float64: the kernel under the Mosaic GPU interpreter with race detection, the xla path, the
gradients, and the errors for what is refused. Inputs are fresh random draws."""

from __future__ import annotations

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
], ids=["tile_m128", "wg_along_M"])
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
