"""jaxnorm.nnx against the stock nnx norm + nnx.Linear: parameters, outputs, gradients."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from flax import nnx

import jaxnorm.nnx as jnnx
from verify.layer_pairs import assert_grads_match, assert_outputs_match
from verify import references as ref
from verify.checks import check_grads_of, check_post_norm_outputs

EPS = 1e-5
K = 48
SINGLE = {"linear": 40}
QKV = {"q": 32, "k": 16, "v": 16}


def _gain_init(key, shape, dtype):
    return (1 + 0.3 * jax.random.normal(key, shape)).astype(dtype)


def _shift_init(key, shape, dtype):
    return (0.5 * jax.random.normal(key, shape)).astype(dtype)


class StockPair(nnx.Module):
    """The unfused reference: a stock norm, then one stock Linear per name, same tree."""

    def __init__(self, kind, in_features, out_features, *, rngs, **kw):
        norm_kw = dict(epsilon=kw["epsilon"], dtype=kw["dtype"], param_dtype=kw["param_dtype"],
                       scale_init=kw["scale_init"], rngs=rngs)
        self.norm = (nnx.RMSNorm(in_features, **norm_kw) if kind == "rms" else
                     nnx.LayerNorm(in_features, bias_init=kw["norm_bias_init"], **norm_kw))
        self.names = tuple(out_features)
        for name, n in out_features.items():
            setattr(self, name, nnx.Linear(
                in_features, n, use_bias=kw["use_bias"], dtype=kw["dtype"],
                param_dtype=kw["param_dtype"], bias_init=kw["bias_init"], rngs=rngs))

    def __call__(self, x):
        h = self.norm(x)
        return tuple(getattr(self, name)(h) for name in self.names)


def _fused(kind, out_features, *, rngs, **kw):
    single = out_features is SINGLE
    if kind == "layer":
        cls = jnnx.LayerNormLinear if single else jnnx.LayerNormProjections
    else:
        kw.pop("norm_bias_init")
        cls = jnnx.RMSNormLinear if single else jnnx.RMSNormProjections
    return cls(K, out_features["linear"] if single else out_features, rngs=rngs, **kw)


def _pair(kind, out_features, seed=0, **overrides):
    kw = dict(use_bias=True, epsilon=EPS, dtype=None, param_dtype=jnp.float32,
              scale_init=_gain_init, bias_init=_shift_init, norm_bias_init=_shift_init)
    kw.update(overrides)
    fused = _fused(kind, out_features, rngs=nnx.Rngs(seed), **dict(kw))
    stock = StockPair(kind, K, out_features, rngs=nnx.Rngs(seed), **kw)
    return fused, stock


def _outputs(module, x):
    out = module(x)
    return out if isinstance(out, tuple) else (out,)


def _named(params: dict, names) -> dict:
    """A layer's parameter dict in verify's argument names."""
    named = {"scale": params["norm"].get("scale"), "norm_bias": params["norm"].get("bias")}
    for i, name in enumerate(names):
        named[f"kernel[{i}]"] = params[name]["kernel"]
        named[f"bias[{i}]"] = params[name].get("bias")
    return {k: v for k, v in named.items() if v is not None}


def _grads(module, x, dys) -> dict:
    graphdef, state = nnx.split(module)

    def loss(state, x):
        outs = _outputs(nnx.merge(graphdef, state), x)
        return sum(jnp.sum(y.astype(jnp.float32) * dy) for y, dy in zip(outs, dys))

    d_state, dx = jax.grad(loss, argnums=(0, 1))(state, x)
    return {"x": dx, **_named(nnx.to_pure_dict(d_state), module.names)}


@pytest.mark.parametrize("kind", ["rms", "layer"])
@pytest.mark.parametrize("out_features", [SINGLE, QKV], ids=["single", "qkv"])
@pytest.mark.parametrize("param_dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
def test_same_parameters_as_the_stock_pair(kind, out_features, param_dtype):
    """Same names, shapes, dtypes and values from the same Rngs with default initializers."""
    fused = _fused(kind, out_features, rngs=nnx.Rngs(3), use_bias=True, param_dtype=param_dtype,
                   norm_bias_init=nnx.initializers.zeros_init())
    stock = StockPair(kind, K, out_features, rngs=nnx.Rngs(3), use_bias=True, epsilon=1e-6,
                      dtype=None, param_dtype=param_dtype, scale_init=nnx.initializers.ones,
                      bias_init=nnx.initializers.zeros_init(),
                      norm_bias_init=nnx.initializers.zeros_init())
    ours, theirs = nnx.to_pure_dict(nnx.state(fused)), nnx.to_pure_dict(nnx.state(stock))
    assert jax.tree.structure(ours) == jax.tree.structure(theirs)
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs)):
        assert a.dtype == b.dtype == param_dtype
        np.testing.assert_array_equal(a, b)


CASES = [  # (x dtype, computation dtype): Flax promotion, and a forced bf16 computation
    (np.float32, None), (ml_dtypes.bfloat16, None), (ml_dtypes.bfloat16, jnp.bfloat16)]


@pytest.mark.parametrize("kind", ["rms", "layer"])
@pytest.mark.parametrize("out_features,use_bias", [(SINGLE, True), (QKV, False)],
                         ids=["single", "qkv"])
@pytest.mark.parametrize("x_dtype,dtype", CASES, ids=["f32", "bf16-promoted", "bf16"])
def test_outputs_and_gradients_match_the_stock_pair(kind, out_features, use_bias, x_dtype,
                                                     dtype):
    fused, stock = _pair(kind, out_features, use_bias=use_bias, dtype=dtype)
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((2, 5, K)).astype(x_dtype))
    ours, theirs = _outputs(fused, x), _outputs(stock, x)
    compute = np.dtype(ours[0].dtype)
    assert compute == (np.float32 if dtype is None else np.dtype(dtype))

    params = _named(nnx.to_pure_dict(nnx.state(stock)), stock.names)
    kernels = [params[f"kernel[{i}]"] for i in range(len(out_features))]
    biases = [params.get(f"bias[{i}]") for i in range(len(out_features))]
    # A forced dtype casts the parameters to it before use, as the stock layers do.
    as_used = (lambda a: a) if dtype is None else (lambda a: None if a is None else a.astype(dtype))
    args = (kind, x, as_used(params["scale"]), as_used(params.get("norm_bias")),
            [as_used(w) for w in kernels], [as_used(b) for b in biases])
    assert_outputs_match(*args, ours, theirs, eps=EPS, dtype=compute)

    dys = [jnp.asarray(rng.standard_normal(y.shape), compute) for y in ours]
    assert_grads_match(*args, [np.asarray(dy) for dy in dys], _grads(fused, x, dys),
                       _grads(stock, x, dys), eps=EPS, dtype=compute)


def test_stock_values_load_unchanged():
    """nnx.update of each child with the stock module's state, then equal outputs."""
    rngs = nnx.Rngs(7)
    norm, linear = nnx.RMSNorm(K, scale_init=_gain_init, rngs=rngs), nnx.Linear(K, 24, rngs=rngs)
    layer = jnnx.RMSNormLinear(K, 24, rngs=nnx.Rngs(99))
    nnx.update(layer.norm, nnx.state(norm))
    nnx.update(layer.linear, nnx.state(linear))
    x = jnp.asarray(np.random.default_rng(1).standard_normal((3, K)), jnp.float32)
    np.testing.assert_allclose(layer(x), linear(norm(x)), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["rms", "layer"])
def test_standalone_norms_match_stock(kind):
    rngs_a, rngs_b = nnx.Rngs(2), nnx.Rngs(2)
    if kind == "rms":
        ours = jnnx.RMSNorm(K, epsilon=EPS, scale_init=_gain_init, rngs=rngs_a)
        stock = nnx.RMSNorm(K, epsilon=EPS, scale_init=_gain_init, rngs=rngs_b)
    else:
        ours = jnnx.LayerNorm(K, epsilon=EPS, scale_init=_gain_init, bias_init=_shift_init,
                              rngs=rngs_a)
        stock = nnx.LayerNorm(K, epsilon=EPS, scale_init=_gain_init, bias_init=_shift_init,
                              rngs=rngs_b)
    x = jnp.asarray(np.random.default_rng(3).standard_normal((4, K)).astype(ml_dtypes.bfloat16))
    y, y_stock = ours(x), stock(x)
    assert y.dtype == y_stock.dtype == jnp.float32
    np.testing.assert_allclose(y, y_stock, rtol=1e-5, atol=1e-5)
    assert jax.tree.structure(nnx.state(ours)) == jax.tree.structure(nnx.state(stock))


def test_gemma_offset_gain():
    """scale_offset=1 with zero-initialized scales is Gemma's (1 + g) gain."""
    layer = jnnx.RMSNormLinear(K, 16, use_bias=False, epsilon=EPS, scale_offset=1.0,
                               scale_init=nnx.initializers.zeros_init(), rngs=nnx.Rngs(0))
    layer.norm.scale[...] = 0.1 * jnp.arange(K, dtype=jnp.float32) / K
    x = np.random.default_rng(4).standard_normal((3, K)).astype(np.float32)
    scale, kernel = np.asarray(layer.norm.scale[...]), np.asarray(layer.linear.kernel[...])
    want = ref.rms_norm_dense(x, scale, kernel, eps=EPS, scale_offset=1.0)
    np.testing.assert_allclose(layer(jnp.asarray(x)), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(layer.norm(jnp.asarray(x)) @ layer.linear.kernel[...], want,
                               rtol=1e-5, atol=1e-5)


def _assert_sgd_lowers(layer, loss) -> None:
    """A few jitted SGD steps on loss(layer) lower it."""

    @nnx.jit
    def step(layer):
        value, grads = nnx.value_and_grad(loss)(layer)
        nnx.update(layer, jax.tree.map(lambda p, g: p - 0.1 * g, nnx.state(layer), grads))
        return value

    first = step(layer)
    for _ in range(3):
        last = step(layer)
    assert last < first


def test_jit_and_training_step():
    layer = jnnx.RMSNormProjections(K, {"gate": 32, "up": 32}, use_bias=False, impl="xla",
                                    rngs=nnx.Rngs(0))
    x = jnp.ones((4, K)) + jnp.arange(K) / K

    def loss(layer):
        gate, up = layer(x)
        return jnp.mean(jnp.square(nnx.silu(gate) * up))

    _assert_sgd_lowers(layer, loss)


def test_projection_names_are_checked():
    with pytest.raises(ValueError, match="not a free attribute name"):
        jnnx.RMSNormProjections(K, {"norm": 8}, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="at least one"):
        jnnx.RMSNormProjections(K, {}, rngs=nnx.Rngs(0))


# ------------------------------------------------------------------ post-norm layers

N_OUT = 40


class StockPostPair(nnx.Module):
    """The unfused post-norm block: a stock Linear, then a stock norm over its outputs."""

    def __init__(self, kind, *, rngs, **kw):
        self.linear = nnx.Linear(K, N_OUT, use_bias=kw["use_bias"], dtype=kw["dtype"],
                                 param_dtype=kw["param_dtype"], bias_init=kw["bias_init"],
                                 rngs=rngs)
        norm_kw = dict(epsilon=kw["epsilon"], dtype=kw["dtype"], param_dtype=kw["param_dtype"],
                       scale_init=kw["scale_init"], rngs=rngs)
        self.norm = (nnx.RMSNorm(N_OUT, **norm_kw) if kind == "rms" else
                     nnx.LayerNorm(N_OUT, bias_init=kw["norm_bias_init"], **norm_kw))

    def __call__(self, x, residual=None):
        h = self.linear(x) if residual is None else self.linear(x) + residual
        return self.norm(h) if residual is None else (self.norm(h), h)


def _post_pair(kind, seed=0, **overrides):
    kw = dict(use_bias=True, epsilon=EPS, dtype=None, param_dtype=jnp.float32,
              scale_init=_gain_init, bias_init=_shift_init, norm_bias_init=_shift_init)
    kw.update(overrides)
    stock = StockPostPair(kind, rngs=nnx.Rngs(seed), **kw)
    if kind == "rms":
        kw.pop("norm_bias_init")
        return jnnx.LinearRMSNorm(K, N_OUT, rngs=nnx.Rngs(seed), **kw), stock
    return jnnx.LinearLayerNorm(K, N_OUT, rngs=nnx.Rngs(seed), **kw), stock


def _post_inputs(layer, x, residual, dtype) -> dict:
    """The op's arguments as the layer uses them: parameters cast to the computation dtype."""
    cast = lambda a: None if a is None else jnp.asarray(a, dtype)  # noqa: E731
    scale, norm_bias = layer.norm.params()
    return dict(x=cast(x), kernel=cast(layer.linear.kernel[...]),
                bias=None if layer.linear.bias is None else cast(layer.linear.bias[...]),
                scale=cast(scale), norm_bias=cast(norm_bias), residual=cast(residual), eps=EPS)


@pytest.mark.parametrize("kind", ["rms", "layer"])
@pytest.mark.parametrize("param_dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
def test_post_norm_layers_have_the_stock_parameters(kind, param_dtype):
    """Linear then norm, from the same Rngs: same names, shapes, dtypes and values."""
    ours, stock = _post_pair(kind, seed=5, param_dtype=param_dtype)
    a, b = nnx.to_pure_dict(nnx.state(ours)), nnx.to_pure_dict(nnx.state(stock))
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for p, q in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        assert p.dtype == q.dtype == param_dtype
        np.testing.assert_array_equal(p, q)


@pytest.mark.parametrize("kind", ["rms", "layer"])
@pytest.mark.parametrize("with_residual", [False, True], ids=["plain", "residual"])
@pytest.mark.parametrize("x_dtype,dtype", CASES, ids=["f32", "bf16-promoted", "bf16"])
def test_post_norm_layers_match_float64(kind, with_residual, x_dtype, dtype):
    """y (and, with a residual, the pre-norm sum) within verify's tolerance of float64, in
    the dtype Flax's promotion gives; gradients of y likewise, residual included."""
    layer, stock = _post_pair(kind, use_bias=with_residual, dtype=dtype)
    rng = np.random.default_rng(11)
    x = jnp.asarray((rng.standard_normal((2, 5, K)) + 0.5).astype(x_dtype))
    r = jnp.asarray(rng.standard_normal((2, 5, N_OUT)).astype(x_dtype)) if with_residual else None
    out = layer(x, r)
    y, h = out if with_residual else (out, None)
    stock_y = stock(x, r)[0] if with_residual else stock(x)
    compute = np.dtype(y.dtype)
    assert compute == np.dtype(stock_y.dtype) == (np.float32 if dtype is None else dtype)
    inputs = _post_inputs(layer, x, r, compute)
    op = "dense_rms_norm" if kind == "rms" else "dense_layer_norm"
    assert check_post_norm_outputs(kind, y, h, **inputs) <= 1.0

    dy = jnp.asarray(rng.standard_normal(y.shape), compute)
    graphdef, state = nnx.split(layer)

    def loss(state, x, r):
        out = nnx.merge(graphdef, state)(x, r)
        return jnp.sum((out[0] if with_residual else out).astype(jnp.float32) * dy)

    # Differentiate at the promoted x and residual: the cast's own VJP is only a rounding.
    d_state, dx, dr = jax.grad(loss, argnums=(0, 1, 2))(state, inputs["x"], inputs["residual"])
    d = nnx.to_pure_dict(d_state)
    grads = {"x": dx, "kernel": d["linear"]["kernel"], "scale": d["norm"]["scale"]}
    if with_residual:
        grads.update(bias=d["linear"]["bias"], residual=dr)
    if kind == "layer":
        grads["norm_bias"] = d["norm"]["bias"]
    # Gradients reach parameters through their cast to the computation dtype.
    grads = {k: jnp.asarray(v, compute) for k, v in grads.items()}
    assert check_grads_of(op, grads, [np.asarray(dy, np.float64)], **inputs) <= 1.0


def test_post_norm_layer_loads_stock_values_and_trains():
    """nnx.update with a stock Linear and RMSNorm gives their composition; a jitted SGD step
    through the fused layer lowers the loss."""
    rngs = nnx.Rngs(8)
    linear, norm = nnx.Linear(K, N_OUT, rngs=rngs), nnx.RMSNorm(N_OUT, scale_init=_gain_init,
                                                                 rngs=rngs)
    layer = jnnx.LinearRMSNorm(K, N_OUT, impl="xla", rngs=nnx.Rngs(0))
    nnx.update(layer.linear, nnx.state(linear))
    nnx.update(layer.norm, nnx.state(norm))
    x = jnp.asarray(np.random.default_rng(2).standard_normal((4, K)), jnp.float32)
    np.testing.assert_allclose(layer(x), norm(linear(x)), rtol=1e-5, atol=1e-5)

    target = jnp.asarray(np.random.default_rng(3).standard_normal((4, N_OUT)), jnp.float32)

    def loss(layer):
        y, _ = layer(x, residual=x[:, :N_OUT])
        return jnp.mean(jnp.square(y - target))

    _assert_sgd_lowers(layer, loss)


def test_post_norm_layer_gemma_offset():
    """scale_offset=1 with small scales is Gemma's (1 + g) gain, also in the post-norm layer."""
    layer = jnnx.LinearRMSNorm(K, N_OUT, use_bias=False, epsilon=EPS, scale_offset=1.0,
                               scale_init=_shift_init, rngs=nnx.Rngs(0))
    x = jnp.asarray(np.random.default_rng(4).standard_normal((3, K)), jnp.float32)
    y = layer(x)
    assert check_post_norm_outputs("rms", y, None, x=x, kernel=layer.linear.kernel[...],
                                   scale=layer.norm.scale[...], scale_offset=1.0,
                                   eps=EPS) <= 1.0
