"""The gated MLP input layers: the parameter tree of the norm + gate/up projections they
replace, and act(gate) * up judged against float64 from those parameters."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxnorm import linen as jl
from jaxnorm import linen_gated, nnx_gated
from jaxnorm import nnx as jn
from verify import gated as vg

BF16 = jnp.bfloat16


@pytest.mark.parametrize("use_bias", [False, True])
def test_nnx_layer_has_the_projections_tree_and_values(use_bias, rng):
    layer = nnx_gated.RMSNormGatedMLP(64, 96, activation="gelu_tanh", use_bias=use_bias,
                                      scale_offset=1.0, rngs=nnx.Rngs(3))
    stock = jn.RMSNormProjections(64, {"gate": 96, "up": 96}, use_bias=use_bias,
                                  rngs=nnx.Rngs(3))
    ours, theirs = nnx.state(layer, nnx.Param), nnx.state(stock, nnx.Param)
    assert jax.tree.structure(ours) == jax.tree.structure(theirs)
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    x = jnp.asarray(rng.standard_normal((5, 64)), BF16)
    y = layer(x)
    assert y.shape == (5, 96) and y.dtype == jnp.float32  # bf16 x, float32 parameters
    params = dict(scale=stock.norm.scale[...], gate_kernel=stock.gate.kernel[...],
                  up_kernel=stock.up.kernel[...],
                  gate_bias=stock.gate.bias[...] if use_bias else None,
                  up_bias=stock.up.bias[...] if use_bias else None)
    x32 = x.astype(jnp.float32)
    assert vg.check_gated(y, x32, **params, activation_name="gelu_tanh", scale_offset=1.0) <= 1.0


def test_nnx_layer_refuses_an_unknown_activation():
    with pytest.raises(ValueError, match="activation must be one of"):
        nnx_gated.RMSNormGatedMLP(64, 64, activation="relu", rngs=nnx.Rngs(0))


@pytest.mark.parametrize("use_bias, activation", [(False, "silu"), (True, "gelu")])
def test_linen_layer_has_the_projections_tree(use_bias, activation, rng):
    x = jnp.asarray(rng.standard_normal((3, 64)), BF16)
    layer = linen_gated.RMSNormGatedMLP(128, activation=activation, use_bias=use_bias,
                                        dtype=BF16, bias_init=nnx.initializers.normal(1.0))
    params = layer.init(jax.random.key(0), x)
    stock = jl.RMSNormProjections({"gate": 128, "up": 128}, use_bias=use_bias).init(
        jax.random.key(0), x)
    assert jax.tree.structure(params) == jax.tree.structure(stock)
    assert jax.tree.map(jnp.shape, params) == jax.tree.map(jnp.shape, stock)
    y = layer.apply(params, x)
    assert y.shape == (3, 128) and y.dtype == BF16
    p = params["params"]
    cast = {name: {k: jnp.asarray(v, BF16) for k, v in p[name].items()} for name in ("gate", "up")}
    biases = (cast["gate"]["bias"], cast["up"]["bias"]) if use_bias else (None, None)
    assert vg.check_gated(y, x, p["norm"]["scale"], cast["gate"]["kernel"],
                          cast["up"]["kernel"], *biases, activation_name=activation) <= 1.0
