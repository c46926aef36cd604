"""jaxnorm.linen's multi-projection layers against a stock nn norm + one nn.Dense per name."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from flax import linen as nn

import jaxnorm.linen as jlinen
from verify.layer_pairs import assert_grads_match, assert_outputs_match, gain_init, shift_init

EPS = 1e-5
K = 48
# Not in sorted order: outputs must follow the mapping's order, not the scope names'.
FEATURES = {"up": 40, "gate": 24, "v": 16}


class StockProjections(nn.Module):
    """The unfused reference: nn.RMSNorm / nn.LayerNorm named "norm", one nn.Dense per name."""

    kind: str
    features: dict
    use_bias: bool = True
    dtype: jnp.dtype | None = None

    @nn.compact
    def __call__(self, x):
        kw = dict(epsilon=EPS, dtype=self.dtype, scale_init=gain_init, name="norm")
        norm = (nn.RMSNorm(**kw) if self.kind == "rms"
                else nn.LayerNorm(bias_init=shift_init, **kw))
        h = norm(x)
        return tuple(nn.Dense(n, use_bias=self.use_bias, dtype=self.dtype,
                              bias_init=shift_init, name=name)(h)
                     for name, n in self.features.items())


def _fused(kind, features=FEATURES, **kw):
    kw = dict(epsilon=EPS, scale_init=gain_init, bias_init=shift_init, **kw)
    if kind == "layer":
        return jlinen.LayerNormProjections(features, norm_bias_init=shift_init, **kw)
    return jlinen.RMSNormProjections(features, **kw)


@pytest.mark.parametrize("kind", ["rms", "layer"])
def test_same_parameter_tree_and_values_as_the_stock_layers(kind):
    x = jnp.ones((2, K))
    ours = _fused(kind).init(jax.random.key(0), x)
    theirs = StockProjections(kind, FEATURES).init(jax.random.key(0), x)
    assert jax.tree.structure(ours) == jax.tree.structure(theirs)
    assert set(ours["params"]) == {"norm", *FEATURES}
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("kind", ["rms", "layer"])
@pytest.mark.parametrize("use_bias", [True, False])
@pytest.mark.parametrize("x_dtype,dtype", [(np.float32, None), (ml_dtypes.bfloat16, None),
                                           (ml_dtypes.bfloat16, jnp.bfloat16)],
                         ids=["f32", "bf16-promoted", "bf16"])
def test_outputs_and_gradients_match_the_stock_layers(kind, use_bias, x_dtype, dtype):
    fused = _fused(kind, use_bias=use_bias, dtype=dtype)
    stock = StockProjections(kind, FEATURES, use_bias=use_bias, dtype=dtype)
    rng = np.random.default_rng(1)
    x = jnp.asarray((rng.standard_normal((2, 3, K)) + 0.5).astype(x_dtype))
    params = stock.init(jax.random.key(2), x)
    ours, theirs = fused.apply(params, x), stock.apply(params, x)
    assert [y.shape[-1] for y in ours] == list(FEATURES.values())
    compute = np.dtype(ours[0].dtype)
    assert compute == (np.float32 if dtype is None else np.dtype(dtype))

    p = params["params"]
    # Linen keeps the gain and norm bias in their parameter dtype; kernel and bias take dtype.
    cast = (lambda a: a) if dtype is None else (lambda a: None if a is None else a.astype(dtype))
    args = (kind, x, p["norm"]["scale"], p["norm"].get("bias"),
            [cast(p[name]["kernel"]) for name in FEATURES],
            [cast(p[name].get("bias")) for name in FEATURES])
    assert_outputs_match(*args, ours, theirs, eps=EPS, dtype=compute)

    dys = [jnp.asarray(rng.standard_normal(y.shape), compute) for y in ours]

    def grads(module):
        def loss(params, x):
            return sum(jnp.sum(y.astype(jnp.float32) * dy)
                       for y, dy in zip(module.apply(params, x), dys))

        g, dx = jax.grad(loss, argnums=(0, 1))(params, x)
        g = g["params"]
        named = {"x": dx, "scale": g["norm"]["scale"], "norm_bias": g["norm"].get("bias")}
        for i, name in enumerate(FEATURES):
            named[f"kernel[{i}]"] = g[name]["kernel"]
            named[f"bias[{i}]"] = g[name].get("bias")
        return {k: v for k, v in named.items() if v is not None}

    assert_grads_match(*args, [np.asarray(dy) for dy in dys], grads(fused), grads(stock),
                       eps=EPS, dtype=compute)


def test_stock_values_load_with_one_mapping():
    """Stock layers with Flax's automatic names load as {norm: RMSNorm_0, q: Dense_0, ...}."""

    class AutoNamed(nn.Module):
        @nn.compact
        def __call__(self, x):
            h = nn.RMSNorm(epsilon=EPS, scale_init=gain_init)(x)
            return nn.Dense(32)(h), nn.Dense(8, bias_init=shift_init)(h)

    x = jnp.asarray(np.random.default_rng(3).standard_normal((5, K)), jnp.float32)
    stock = AutoNamed().init(jax.random.key(4), x)["params"]
    params = {"params": {"norm": stock["RMSNorm_0"], "q": stock["Dense_0"],
                         "kv": stock["Dense_1"]}}
    layer = jlinen.RMSNormProjections({"q": 32, "kv": 8}, epsilon=EPS)
    ours, theirs = layer.apply(params, x), AutoNamed().apply({"params": stock}, x)
    p = params["params"]
    args = ("rms", x, p["norm"]["scale"], None, [p["q"]["kernel"], p["kv"]["kernel"]],
            [p["q"]["bias"], p["kv"]["bias"]])
    assert_outputs_match(*args, ours, theirs, eps=EPS, dtype=np.float32)


@pytest.mark.parametrize("features, match", [({}, "at least one"), ({"norm": 8}, "'norm'"),
                                             ({"not a name": 8}, "identifier")])
def test_projection_names_are_checked(features, match):
    with pytest.raises(ValueError, match=match):
        jlinen.RMSNormProjections(features).init(jax.random.key(0), jnp.ones((1, K)))
