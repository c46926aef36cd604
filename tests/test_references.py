"""The references themselves: conventions against the code they describe, gradients against
finite differences."""

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from flax import nnx
from hypothesis import given
from hypothesis import strategies as st

from verify import gradients
from verify import references as ref
from verify import tolerances as tol

BF16 = np.dtype(ml_dtypes.bfloat16)


def _x(m=3, k=16, dtype=BF16, seed=0):
    return np.random.default_rng(seed).standard_normal((m, k)).astype(dtype)


def test_flax_convention_matches_nnx_rmsnorm():
    x, g = _x(), np.linspace(0.5, 1.5, 16).astype(np.float32)
    layer = nnx.RMSNorm(16, epsilon=1e-6, rngs=nnx.Rngs(0))
    layer.scale[...] = jnp.asarray(g)
    y = layer(jnp.asarray(x))
    assert y.dtype == ref.output_dtype("flax", x.dtype, g.dtype) == np.float32
    y64 = ref.rms_norm(x, g, convention="flax")
    assert np.all(np.abs(np.asarray(y, np.float64) - y64) <= tol.norm_tolerance(y64, y64, np.float32))


def test_hf_llama_convention_rounds_before_the_gain():
    """HF Llama: hidden.to(float32) * rsqrt(...) -> .to(input dtype) -> weight * hidden."""
    x, g = _x(), np.linspace(0.5, 1.5, 16).astype(BF16)
    x32 = x.astype(np.float32)
    hidden = (x32 / np.sqrt(np.mean(x32**2, -1, keepdims=True) + 1e-6)).astype(BF16)
    transliterated = (g * hidden).astype(np.float64)
    y64 = ref.rms_norm(x, g, convention="hf_llama")
    assert ref.output_dtype("hf_llama", x.dtype, g.dtype) == BF16
    np.testing.assert_allclose(transliterated, y64, rtol=2 * tol.unit_roundoff(BF16))


def test_gemma_convention_uses_one_plus_gain_and_casts_after():
    x, g = _x(), np.linspace(-0.5, 0.5, 16).astype(np.float32)
    x64 = x.astype(np.float64)
    expected = x64 / np.sqrt(np.mean(x64**2, -1, keepdims=True) + 1e-6) * (1.0 + g.astype(np.float64))
    np.testing.assert_allclose(ref.rms_norm(x, g, convention="gemma"), expected, rtol=1e-12)
    assert ref.output_dtype("gemma", x.dtype, g.dtype) == BF16


def test_unknown_convention_is_rejected():
    with pytest.raises(ValueError, match="convention"):
        ref.rms_norm(_x(), convention="torch")


def _finite_difference(f, x, dy, h=1e-6):
    grad = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        step = np.zeros_like(x)
        step[idx] = h
        grad[idx] = np.sum((f(x + step) - f(x - step)) * dy) / (2 * h)
    return grad


@given(st.integers(1, 4), st.integers(1, 12), st.integers(0, 2**32 - 1),
       st.sampled_from(["rms", "layer"]))
def test_reference_gradients_match_finite_differences(m, k, seed, kind):
    rng = np.random.default_rng(seed)
    x, g, beta = rng.standard_normal((m, k)), rng.standard_normal(k), rng.standard_normal(k)
    w, dy = rng.standard_normal((k, 3)), rng.standard_normal((m, 3))
    norm = ref.rms_norm if kind == "rms" else ref.layer_norm

    def forward(xv):
        args = (xv, g) if kind == "rms" else (xv, g, beta)
        return norm(*args, eps=1e-3) @ w

    grads = gradients.norm_dense_vjp(kind, x, g, beta if kind == "layer" else None, w, None, dy,
                                     eps=1e-3)
    np.testing.assert_allclose(grads["x"], _finite_difference(forward, x, dy), rtol=1e-5,
                               atol=1e-7)

    def by_gain(gv):
        args = (x, gv) if kind == "rms" else (x, gv, beta)
        return norm(*args, eps=1e-3) @ w

    np.testing.assert_allclose(grads["scale"], _finite_difference(by_gain, g, dy), rtol=1e-5,
                               atol=1e-7)


@given(st.integers(1, 3), st.integers(1, 10), st.integers(1, 6), st.integers(0, 2**32 - 1),
       st.sampled_from(["rms", "layer"]))
def test_post_norm_reference_gradients_match_finite_differences(m, k, n, seed, kind):
    rng = np.random.default_rng(seed)
    x, w, b = rng.standard_normal((m, k)), rng.standard_normal((k, n)), rng.standard_normal(n)
    g, dy = rng.standard_normal(n), rng.standard_normal((m, n))
    fn = ref.dense_rms_norm if kind == "rms" else ref.dense_layer_norm

    def forward(wv):
        args = (x, wv, b, g) if kind == "rms" else (x, wv, b, g, None)
        return fn(*args, eps=1e-3)[0]

    grads = gradients.dense_norm_vjp(kind, x, w, b, g, None, dy, eps=1e-3)
    np.testing.assert_allclose(grads["kernel"], _finite_difference(forward, w, dy), rtol=1e-5,
                               atol=1e-7)
