"""`rms_norm_gated_dense(statistics=...)`: the MLP input given its input's row statistics (as
`residual_dense` writes them), against float64: the xla path, the kernels under the Mosaic
GPU interpreter with race detection (the decode gated kernel at M <= 64, the gated GEMM
above), the gradient through the statistics, bad statistics, and the automatic fallback."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxnorm
from jaxnorm import row_stats
from graph_checks import primitive_counts
from kernel_checks import assert_race_free
from verify import gated as vg

BF16 = jnp.bfloat16


def _inputs(rng, m, k, n, *, offset=0.0):
    """x, gain, both kernels and a gate bias: fresh draws, rows of varied scale."""
    rows = np.exp(rng.standard_normal((m, 1)))
    return dict(
        x=jnp.asarray(rows * rng.standard_normal((m, k)), BF16),
        scale=jnp.asarray((0.0 if offset else 1.0) + 0.2 * rng.standard_normal(k), jnp.float32),
        gate_kernel=jnp.asarray(rng.standard_normal((k, n)) / np.sqrt(k), BF16),
        up_kernel=jnp.asarray(rng.standard_normal((k, n)) / np.sqrt(k), BF16),
        gate_bias=jnp.asarray(rng.standard_normal(n), jnp.float32), up_bias=None)


def _call(inputs, stats, impl, activation="silu", offset=0.0):
    return jaxnorm.rms_norm_gated_dense(*inputs.values(), activation=activation,
                                        scale_offset=offset, impl=impl, statistics=stats)


@pytest.mark.parametrize("impl, m, activation, offset", [
    ("xla", 24, "silu", 0.0), ("xla", 7, "gelu_tanh", 1.0),
    ("interpret", 5, "silu", 0.0), ("interpret", 64, "gelu_tanh", 1.0),
    ("interpret", 130, "silu", 0.0)])
def test_given_statistics_match_float64(rng, impl, m, activation, offset):
    """With x's statistics given, the output is the gated MLP input of x (verify's judge)."""
    inputs = _inputs(rng, m, 128, 192, offset=offset)
    y = _call(inputs, row_stats.of_rows(inputs["x"]), impl, activation, offset)
    if impl == "interpret":
        assert_race_free()
    assert vg.check_gated(y, **inputs, activation_name=activation, scale_offset=offset,
                          act_dtype=np.float32 if impl == "interpret" else None) <= 1.0


@pytest.mark.parametrize("impl", ["xla", "interpret"])
def test_the_statistics_are_what_the_kernel_uses(rng, impl):
    """Statistics of 2x (the row scale halves) give half the pre-activation: the op reads
    them, it does not reduce x again (impl='xla' and the kernels alike)."""
    inputs = _inputs(rng, 8, 64, 128)
    inputs.update(gate_bias=None)
    doubled = row_stats.of_rows(2.0 * inputs["x"].astype(jnp.float32))
    y = _call(inputs, doubled, impl, "gelu")
    half = jaxnorm.rms_norm_gated_dense(
        inputs["x"], 0.5 * inputs["scale"], inputs["gate_kernel"], inputs["up_kernel"],
        activation="gelu", impl="xla")
    np.testing.assert_allclose(np.asarray(y, np.float32), np.asarray(half, np.float32),
                               rtol=0.05, atol=0.02)


def test_gradient_through_the_statistics_matches_float64(rng):
    """h -> (h, of_rows(h)) -> gated(statistics=): the gradient of the unfused norm -> gated,
    so the statistics' cotangent reaches h (without it dh would miss the row-scale term)."""
    inputs = _inputs(rng, 16, 64, 128)
    dy = jnp.asarray(rng.standard_normal((16, 128)), BF16)
    names = ("x", "scale", "gate_kernel", "up_kernel", "gate_bias")

    def loss(x, scale, gate_kernel, up_kernel, gate_bias):
        args = dict(x=x, scale=scale, gate_kernel=gate_kernel, up_kernel=up_kernel,
                    gate_bias=gate_bias, up_bias=None)
        y = _call(args, row_stats.of_rows(x), "xla")
        return jnp.sum(y.astype(jnp.float32) * dy.astype(jnp.float32))

    grads = jax.grad(loss, argnums=tuple(range(5)))(*(inputs[n] for n in names))
    assert vg.check_gated_grads(dict(zip(names, grads)), dy, **inputs) <= 1.0


def test_statistics_that_do_not_match_x_are_refused(rng):
    inputs = _inputs(rng, 8, 64, 128)
    stats = row_stats.of_rows(inputs["x"])
    with pytest.raises(ValueError, match="statistics.mean has shape"):
        _call(inputs, stats._replace(mean=stats.mean[:4]), "xla")
    with pytest.raises(ValueError, match="statistics.length is 32"):
        _call(inputs, stats._replace(length=32), "xla")
    with pytest.raises(TypeError, match="jaxnorm.RowStats"):
        _call(inputs, (stats.mean, stats.m2), "xla")


def test_automatic_fallback_reduces_x_as_stock_does(rng):
    """Under impl=None falling back to xla (CPU here) the statistics go unused: the graph is
    the one without them, while impl='xla' applies them."""
    inputs = _inputs(rng, 8, 64, 128)
    stats = row_stats.of_rows(inputs["x"])
    given = primitive_counts(lambda s: _call(inputs, s, None), stats)
    assert given == primitive_counts(lambda s: _call(inputs, None, None), stats)
    assert primitive_counts(lambda s: _call(inputs, s, "xla"), stats) != given


def test_automatic_kernel_is_differentiated_as_stock(rng, monkeypatch):
    """Where impl=None picks the kernel (a Hopper GPU, simulated), the gradient is the stock
    formulation's, no kernel in it, the statistics' cotangent a symbolic zero (nothing
    flows back into their producer)."""
    from jaxnorm import dispatch
    from jaxnorm.backends import mosaic_gated

    monkeypatch.setattr(dispatch, "hopper_or_newer", lambda: True)
    m = mosaic_gated.MIN_MEASURED_ROWS
    inputs = _inputs(rng, m, 64, 128)
    assert dispatch.resolve("rms_norm_gated_dense", None, *inputs.values(), None,
                            activation="silu", eps=1e-6, scale_offset=0.0) == "mosaic"
    dy = jnp.asarray(rng.standard_normal((m, 128)), BF16)
    names = ("x", "scale", "gate_kernel", "up_kernel", "gate_bias")

    def loss(x, scale, gate_kernel, up_kernel, gate_bias):
        args = dict(x=x, scale=scale, gate_kernel=gate_kernel, up_kernel=up_kernel,
                    gate_bias=gate_bias, up_bias=None)
        y = _call(args, row_stats.of_rows(x), None)
        return jnp.sum(y.astype(jnp.float32) * dy.astype(jnp.float32))

    def loss_without(x, *params):
        args = dict(zip(names, (x, *params)), up_bias=None)
        y = _call(args, None, None)
        return jnp.sum(y.astype(jnp.float32) * dy.astype(jnp.float32))

    operands = tuple(inputs[n] for n in names)
    grad = jax.grad(loss, argnums=tuple(range(5)))
    assert "mosaic_gpu" not in str(jax.make_jaxpr(grad)(*operands))
    # After dead-code elimination the statistics and their producer are gone entirely.
    assert primitive_counts(grad, *operands) == primitive_counts(
        jax.grad(loss_without, argnums=tuple(range(5))), *operands)
    grads = grad(*operands)
    assert vg.check_gated_grads(dict(zip(names, grads)), dy, **inputs) <= 1.0


def test_layers_pass_the_statistics(rng):
    """The NNX and Linen gated MLP-input layers take `statistics=` (impl='xla' applies them)."""
    from flax import nnx

    from jaxnorm import linen_gated, nnx_gated

    x = _inputs(rng, 6, 64, 128)["x"]
    doubled = row_stats.of_rows(2.0 * x.astype(jnp.float32))
    layer = nnx_gated.RMSNormGatedMLP(64, 128, impl="xla", rngs=nnx.Rngs(0))
    params = dict(scale=layer.norm.scale[...], gate_kernel=layer.gate.kernel[...],
                  up_kernel=layer.up.kernel[...])
    halved = jaxnorm.rms_norm_gated_dense(x, 0.5 * params["scale"], params["gate_kernel"],
                                          params["up_kernel"], impl="xla")
    np.testing.assert_allclose(np.asarray(layer(x, statistics=doubled), np.float32),
                               np.asarray(halved, np.float32), rtol=0.05, atol=0.02)
    module = linen_gated.RMSNormGatedMLP(128, impl="xla")
    variables = module.init(jax.random.key(0), x)
    given = module.apply(variables, x, statistics=row_stats.of_rows(x))
    p = variables["params"]
    assert vg.check_gated(given, x, p["norm"]["scale"], p["gate"]["kernel"],
                          p["up"]["kernel"]) <= 1.0
    with pytest.raises(ValueError, match="statistics.mean has shape"):
        module.apply(variables, x, statistics=doubled._replace(mean=doubled.mean[:2]))
