"""Flax layers of the residual GEMM (nnx.ResidualLinear, linen.ResidualDense) and the
pre-norm layers' `statistics=`: stock parameter trees, values judged against float64."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from flax import nnx

import jaxnorm
from jaxnorm import linen as jl
from jaxnorm import nnx as jn
from verify import residual as vr

BF16 = jnp.bfloat16


def _data(seed, lead, k, n, dtype=jnp.float32):
    rng = np.random.default_rng(seed)
    return (jnp.asarray(rng.standard_normal((*lead, k)), dtype),
            jnp.asarray(rng.standard_normal((*lead, n)), dtype))


def test_nnx_residual_linear_has_linears_parameters_and_computes_h():
    layer = jn.ResidualLinear(64, 128, rngs=nnx.Rngs(0))
    stock = nnx.Linear(64, 128, rngs=nnx.Rngs(0))
    assert jax.tree.map(jnp.shape, nnx.state(layer)) == jax.tree.map(jnp.shape, nnx.state(stock))
    np.testing.assert_array_equal(np.asarray(layer.kernel[...]), np.asarray(stock.kernel[...]))
    nnx.update(layer, {"bias": nnx.Param(jnp.linspace(-1, 1, 128))})
    x, r = _data(0, (2, 5), 64, 128)
    h, stats = layer(x, r)
    inputs = dict(x=x, kernel=layer.kernel[...], residual=r, bias=layer.bias[...])
    assert max(vr._ratio(j) for j in vr.judge_residual(h, stats, "output", **inputs)) <= 1.0
    assert stats.mean.shape == (2, 5) and stats.length == 128


def test_linen_residual_dense_has_dense_parameters_and_computes_h():
    x, r = _data(1, (7,), 32, 64, BF16)
    layer = jl.ResidualDense(64)
    params = layer.init(jax.random.key(0), x, r)
    stock = nn.Dense(64).init(jax.random.key(0), x)
    assert jax.tree.map(jnp.shape, params) == jax.tree.map(jnp.shape, stock)
    np.testing.assert_array_equal(np.asarray(params["params"]["kernel"]),
                                  np.asarray(stock["params"]["kernel"]))
    h, stats = layer.apply(params, x, r)
    assert h.dtype == jnp.float32  # bf16 x with float32 parameters computes in float32
    inputs = dict(x=jnp.asarray(x, jnp.float32), kernel=params["params"]["kernel"],
                  residual=jnp.asarray(r, jnp.float32), bias=params["params"]["bias"])
    assert max(vr._ratio(j) for j in vr.judge_residual(h, stats, "output", **inputs)) <= 1.0


@pytest.mark.parametrize("kind", ["rms", "layer"])
def test_nnx_pre_norm_layers_take_statistics(kind):
    """o-projection -> (h, stats) -> pre-norm projections given stats = the unfused pair."""
    o_proj = jn.ResidualLinear(64, 96, param_dtype=BF16, rngs=nnx.Rngs(0))
    cls = jn.RMSNormProjections if kind == "rms" else jn.LayerNormProjections
    gate_up = cls(96, {"gate": 64, "up": 64}, param_dtype=BF16, rngs=nnx.Rngs(1))
    x, r = _data(2, (3, 8), 64, 96, BF16)
    h, stats = o_proj(x, r)
    given = gate_up(h, statistics=stats)
    assert len(given) == 2
    norm = gate_up.norm
    inputs = dict(kernel=[gate_up.gate.kernel[...], gate_up.up.kernel[...]],
                  bias=[gate_up.gate.bias[...], gate_up.up.bias[...]], eps=norm.epsilon,
                  scale=norm.scale[...])
    if kind == "layer":
        inputs["norm_bias"] = norm.bias[...]
    op = f"{kind}_norm_dense"
    assert vr.check_consumer(op, given, None, x=h, **inputs) <= 1.0


@pytest.mark.parametrize("cls", [jl.RMSNormDense, jl.LayerNormDense])
def test_linen_pre_norm_layers_take_statistics(cls):
    x, r = _data(3, (16,), 32, 64)
    res = jl.ResidualDense(64)
    h, stats = res.apply(res.init(jax.random.key(0), x, r), x, r)
    layer = cls(48)
    params = layer.init(jax.random.key(1), h)
    given = layer.apply(params, h, statistics=stats)
    plain = layer.apply(params, h)
    np.testing.assert_allclose(np.asarray(given), np.asarray(plain), rtol=2e-5, atol=2e-5)
    with pytest.raises(ValueError, match=r"statistics.mean has shape \(8,\) but x has shape"):
        layer.apply(params, h, statistics=stats._replace(mean=stats.mean[:8]))
