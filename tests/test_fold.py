"""Folding: exact round trips, and folded weights computing the same op."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import jaxnorm
from jaxnorm import fold
from verify.checks import check_op


def _draw(seed, *shape):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@given(st.integers(1, 64), st.integers(1, 32), st.integers(0, 2**32 - 1), st.sampled_from([0.0, 1.0]))
def test_fold_unfold_round_trip(k, n, seed, offset):
    g, w = _draw(seed, k) + 2.0 * (1 - offset), _draw(seed + 1, k, n)
    back = np.asarray(fold.unfold_gain(g, fold.fold_gain(g, w, offset), offset))
    np.testing.assert_allclose(back, w, rtol=4 * np.finfo(np.float32).eps, atol=1e-30)


def test_unfold_zero_gain_is_an_error():
    with pytest.raises(ValueError, match="zeros"):
        fold.unfold_gain(np.array([1.0, 0.0], np.float32), np.ones((2, 3), np.float32))


@given(st.integers(0, 2**32 - 1), st.sampled_from([0.0, 1.0]))
def test_folded_rms_dense_equals_unfolded(seed, offset):
    x, g, w, b = _draw(seed, 5, 48), _draw(seed + 1, 48), _draw(seed + 2, 48, 24), _draw(seed + 3, 24)
    folded = fold.fold_gain(g, w, offset)
    direct = jaxnorm.rms_norm_dense(x, g, w, b, scale_offset=offset, impl="xla")
    via_fold = jaxnorm.rms_norm_dense(x, None, folded, b, impl="xla")
    np.testing.assert_allclose(np.asarray(via_fold), np.asarray(direct), rtol=1e-5, atol=1e-5)
    assert check_op("rms_norm_dense", "xla", x=x, scale=None, kernel=np.asarray(folded), bias=b) <= 1


@given(st.integers(0, 2**32 - 1))
def test_folded_layer_norm_and_column_sums(seed):
    x, g, beta = _draw(seed, 4, 40) + 5.0, _draw(seed + 1, 40), _draw(seed + 2, 40)
    w, b = _draw(seed + 3, 40, 16), _draw(seed + 4, 16)
    f = fold.fold_layer_norm(g, beta, w, b)
    direct = np.asarray(jaxnorm.layer_norm_dense(x, g, beta, w, b, impl="xla"))
    via_fold = np.asarray(jaxnorm.layer_norm_dense(x, None, None, f.kernel, f.bias, impl="xla"))
    np.testing.assert_allclose(via_fold, direct, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np.asarray(f.column_sums), np.asarray(f.kernel).sum(0), rtol=1e-5,
                               atol=1e-5)
    # The lazy form the kernels use: s * (x W* - mu c) + folded bias.
    x64 = x.astype(np.float64)
    mu = x64.mean(-1, keepdims=True)
    s = 1 / np.sqrt(x64.var(-1, keepdims=True) + 1e-6)
    lazy = s * (x64 @ np.asarray(f.kernel, np.float64) - mu * np.asarray(f.column_sums)) + np.asarray(f.bias)
    np.testing.assert_allclose(lazy, direct, rtol=1e-4, atol=1e-4)
