"""jaxnorm.linen against the stock nn norm + nn.Dense: parameters, outputs, gradients."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from flax import linen as nn

import jaxnorm.linen as jlinen
from verify.layer_pairs import assert_grads_match, assert_outputs_match
from verify import references as ref
from verify.checks import check_grads_of, check_post_norm_outputs

EPS = 1e-5
K, N = 48, 40


def _gain_init(key, shape, dtype):
    return (1 + 0.3 * jax.random.normal(key, shape)).astype(dtype)


def _shift_init(key, shape, dtype):
    return (0.5 * jax.random.normal(key, shape)).astype(dtype)


class StockPair(nn.Module):
    """The unfused reference, with the children named as the fused layer names its scopes."""

    kind: str
    features: int
    use_bias: bool = True
    epsilon: float = 1e-6
    dtype: jnp.dtype | None = None
    param_dtype: jnp.dtype = jnp.float32
    scale_init: nn.initializers.Initializer = nn.initializers.ones
    bias_init: nn.initializers.Initializer = nn.initializers.zeros_init()

    @nn.compact
    def __call__(self, x):
        kw = dict(epsilon=self.epsilon, dtype=self.dtype, param_dtype=self.param_dtype,
                  scale_init=self.scale_init, name="norm")
        norm = (nn.RMSNorm(**kw) if self.kind == "rms"
                else nn.LayerNorm(bias_init=self.bias_init, **kw))
        return nn.Dense(self.features, use_bias=self.use_bias, dtype=self.dtype,
                        param_dtype=self.param_dtype, bias_init=self.bias_init, name="dense")(
            norm(x))


def _fused(kind, **kw):
    if kind == "layer":
        norm_bias_init = kw.get("bias_init", nn.initializers.zeros_init())
        return jlinen.LayerNormDense(norm_bias_init=norm_bias_init, **kw)
    return jlinen.RMSNormDense(**kw)


@pytest.mark.parametrize("kind", ["rms", "layer"])
@pytest.mark.parametrize("param_dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
def test_same_parameters_as_the_stock_pair(kind, param_dtype):
    x = jnp.ones((2, K))
    ours = _fused(kind, features=N, param_dtype=param_dtype).init(jax.random.key(0), x)
    theirs = StockPair(kind, N, param_dtype=param_dtype).init(jax.random.key(0), x)
    assert jax.tree.structure(ours) == jax.tree.structure(theirs)
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs)):
        assert a.dtype == b.dtype == param_dtype
        np.testing.assert_array_equal(a, b)


CASES = [(np.float32, None), (ml_dtypes.bfloat16, None), (ml_dtypes.bfloat16, jnp.bfloat16)]


@pytest.mark.parametrize("kind", ["rms", "layer"])
@pytest.mark.parametrize("use_bias", [True, False])
@pytest.mark.parametrize("x_dtype,dtype", CASES, ids=["f32", "bf16-promoted", "bf16"])
def test_outputs_and_gradients_match_the_stock_pair(kind, use_bias, x_dtype, dtype):
    kw = dict(features=N, use_bias=use_bias, epsilon=EPS, dtype=dtype, scale_init=_gain_init,
              bias_init=_shift_init)
    fused, stock = _fused(kind, **kw), StockPair(kind, **kw)
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((2, 5, K)).astype(x_dtype))
    params = stock.init(jax.random.key(1), x)
    y, y_stock = fused.apply(params, x), stock.apply(params, x)
    compute = np.dtype(y.dtype)
    assert compute == (np.float32 if dtype is None else np.dtype(dtype))

    p = params["params"]
    # Linen keeps the gain and norm bias in their parameter dtype; kernel and bias take dtype.
    cast = (lambda a: a) if dtype is None else (lambda a: None if a is None else a.astype(dtype))
    args = (kind, x, p["norm"]["scale"], p["norm"].get("bias"), [cast(p["dense"]["kernel"])],
            [cast(p["dense"].get("bias"))])
    assert_outputs_match(*args, [y], [y_stock], eps=EPS, dtype=compute)

    dy = jnp.asarray(rng.standard_normal(y.shape), compute)

    def grads(module):
        def loss(params, x):
            return jnp.sum(module.apply(params, x).astype(jnp.float32) * dy)

        g, dx = jax.grad(loss, argnums=(0, 1))(params, x)
        g = g["params"]
        named = {"x": dx, "scale": g["norm"]["scale"], "norm_bias": g["norm"].get("bias"),
                 "kernel[0]": g["dense"]["kernel"], "bias[0]": g["dense"].get("bias")}
        return {k: v for k, v in named.items() if v is not None}

    assert_grads_match(*args, [np.asarray(dy)], grads(fused), grads(stock), eps=EPS,
                       dtype=compute)


def test_stock_values_load_with_one_mapping():
    """A stock pair with Flax's automatic names loads as {norm: RMSNorm_0, dense: Dense_0}."""

    class AutoNamed(nn.Module):
        @nn.compact
        def __call__(self, x):
            return nn.Dense(N)(nn.RMSNorm(scale_init=_gain_init)(x))

    x = jnp.asarray(np.random.default_rng(2).standard_normal((3, K)), jnp.float32)
    stock = AutoNamed().init(jax.random.key(4), x)["params"]
    params = {"params": {"norm": stock["RMSNorm_0"], "dense": stock["Dense_0"]}}
    np.testing.assert_allclose(jlinen.RMSNormDense(N).apply(params, x),
                               AutoNamed().apply({"params": stock}, x), rtol=1e-5, atol=1e-5)


def test_gemma_offset_and_jit():
    layer = jlinen.RMSNormDense(N, use_bias=False, epsilon=EPS, scale_offset=1.0,
                                scale_init=_shift_init, impl="xla")
    x = np.random.default_rng(5).standard_normal((3, K)).astype(np.float32)
    params = layer.init(jax.random.key(0), x)
    p = params["params"]
    want = ref.rms_norm_dense(x, np.asarray(p["norm"]["scale"]), np.asarray(p["dense"]["kernel"]),
                              eps=EPS, scale_offset=1.0)
    np.testing.assert_allclose(jax.jit(layer.apply)(params, x), want, rtol=1e-5, atol=1e-5)


def test_folded_layer_has_no_scale():
    params = jlinen.RMSNormDense(N, use_scale=False).init(jax.random.key(0), jnp.ones((1, K)))
    assert "norm" not in params["params"]


# ------------------------------------------------------------------ post-norm layers


class StockPostPair(nn.Module):
    """nn.Dense, then a stock norm over its outputs (residual added before it)."""

    kind: str
    dtype: jnp.dtype | None = None

    @nn.compact
    def __call__(self, x, residual=None):
        h = nn.Dense(N, dtype=self.dtype, bias_init=_shift_init, name="dense")(x)
        h = h if residual is None else h + residual
        kw = dict(epsilon=EPS, dtype=self.dtype, scale_init=_gain_init, name="norm")
        norm = nn.RMSNorm(**kw) if self.kind == "rms" else nn.LayerNorm(bias_init=_shift_init,
                                                                         **kw)
        return norm(h) if residual is None else (norm(h), h)


def _post_layer(kind, dtype):
    kw = dict(epsilon=EPS, dtype=dtype, scale_init=_gain_init, bias_init=_shift_init)
    if kind == "rms":
        return jlinen.DenseRMSNorm(N, **kw)
    return jlinen.DenseLayerNorm(N, norm_bias_init=_shift_init, **kw)


@pytest.mark.parametrize("kind", ["rms", "layer"])
@pytest.mark.parametrize("x_dtype,dtype", [(np.float32, None), (ml_dtypes.bfloat16, None),
                                           (ml_dtypes.bfloat16, jnp.bfloat16)],
                         ids=["f32", "bf16-promoted", "bf16"])
def test_post_norm_layers_match_float64(kind, x_dtype, dtype):
    """Stock parameters (same tree and values as nn.Dense then the norm); y and the
    pre-norm sum within verify's tolerance of float64; gradients too, residual included."""
    layer, stock = _post_layer(kind, dtype), StockPostPair(kind, dtype)
    rng = np.random.default_rng(6)
    x = jnp.asarray((rng.standard_normal((2, 5, K)) + 0.5).astype(x_dtype))
    r = jnp.asarray(rng.standard_normal((2, 5, N)).astype(x_dtype))
    params = layer.init(jax.random.key(3), x, r)
    stock_params = stock.init(jax.random.key(3), x, r)
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(stock_params)):
        np.testing.assert_array_equal(a, b)
    assert jax.tree.structure(params) == jax.tree.structure(stock_params)

    y, h = layer.apply(params, x, r)
    compute = np.dtype(y.dtype)
    assert compute == np.dtype(stock.apply(params, x, r)[0].dtype)
    p = params["params"]
    # Linen keeps the gain and norm bias in their parameter dtype; kernel and bias take dtype.
    inputs = dict(x=jnp.asarray(x, compute), kernel=jnp.asarray(p["dense"]["kernel"], compute),
                  bias=jnp.asarray(p["dense"]["bias"], compute), scale=p["norm"]["scale"],
                  norm_bias=p["norm"].get("bias"), residual=jnp.asarray(r, compute), eps=EPS)
    assert check_post_norm_outputs(kind, y, h, **inputs) <= 1.0

    dy = jnp.asarray(rng.standard_normal(y.shape), compute)

    def loss(params, x, r):
        return jnp.sum(layer.apply(params, x, r)[0].astype(jnp.float32) * dy)

    g, dx, dr = jax.grad(loss, argnums=(0, 1, 2))(params, inputs["x"], inputs["residual"])
    g = g["params"]
    grads = {"x": dx, "residual": dr, "scale": g["norm"]["scale"],
             "kernel": jnp.asarray(g["dense"]["kernel"], compute),
             "bias": jnp.asarray(g["dense"]["bias"], compute)}
    if kind == "layer":
        grads["norm_bias"] = g["norm"]["bias"]
    op = "dense_rms_norm" if kind == "rms" else "dense_layer_norm"
    assert check_grads_of(op, grads, [np.asarray(dy, np.float64)], **inputs) <= 1.0


def test_post_norm_layer_gemma_offset_without_residual():
    """scale_offset=1 is Gemma's (1 + g) gain; without a residual the layer returns y only."""
    layer = jlinen.DenseRMSNorm(N, use_bias=False, epsilon=EPS, scale_offset=1.0,
                                scale_init=_shift_init, impl="xla")
    x = jnp.asarray(np.random.default_rng(7).standard_normal((3, K)), jnp.float32)
    params = layer.init(jax.random.key(0), x)
    p = params["params"]
    y = jax.jit(layer.apply)(params, x)
    assert check_post_norm_outputs("rms", y, None, x=x, kernel=p["dense"]["kernel"],
                                   scale=p["norm"]["scale"], scale_offset=1.0, eps=EPS) <= 1.0
