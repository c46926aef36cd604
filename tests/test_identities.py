"""docs/design.md section 1, items 1-6: hand-countable anchors, then random float64 cases."""

import jax.numpy as jnp
import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from jaxnorm import row_stats
from verify import identities
from verify import references as ref

A = np.array([[3.0, 4.0], [6.0, 8.0]])
B = np.array([[1.0, 2.0], [1.0, 0.0]])
FLOAT64_LEVEL = 1e-12


def test_anchor_row_scale_commutes_with_product():
    """(DA)B = D(AB): D = diag(2, 1/2) -> both [[14, 12], [7, 6]]."""
    d = np.array([[2.0], [0.5]])
    np.testing.assert_array_equal((d * A) @ B, [[14.0, 12.0], [7.0, 6.0]])
    np.testing.assert_array_equal(d * (A @ B), [[14.0, 12.0], [7.0, 6.0]])


def test_anchor_gain_moves_into_weight():
    """(AG)B = A(GB), G = diag(1, 3): both [[15, 6], [30, 12]]."""
    g = np.array([1.0, 3.0])
    np.testing.assert_array_equal((A * g) @ B, [[15.0, 6.0], [30.0, 12.0]])
    np.testing.assert_array_equal(A @ (g[:, None] * B), [[15.0, 6.0], [30.0, 12.0]])


def test_anchor_centering():
    """A_c B = AB - mean(A) 1^T B: row means 3.5, 7; 1^T B = [2, 2]; both [[0, -1], [0, -2]]."""
    a_c = A - A.mean(axis=1, keepdims=True)
    np.testing.assert_array_equal(a_c, [[-0.5, 0.5], [-1.0, 1.0]])
    np.testing.assert_array_equal(a_c @ B, [[0.0, -1.0], [0.0, -2.0]])
    np.testing.assert_array_equal(A @ B - np.array([[3.5], [7.0]]) * B.sum(0), [[0, -1], [0, -2]])


def test_anchor_variance_from_moments():
    """x = [3, 4]: E[x^2] = 12.5, E[x]^2 = 12.25, sigma^2 = 0.25."""
    x = np.array([3.0, 4.0])
    assert np.mean(x * x) == 12.5 and np.mean(x) ** 2 == 12.25 and np.var(x) == 0.25


def test_anchor_chunked_sum_of_squares():
    """[1, 2 | 3, 4]: 1 + 4 = 5, 9 + 16 = 25, total 30."""
    x = np.array([[1.0, 2.0, 3.0, 4.0]])
    assert identities.chunked_statistics(x, 2) == 0.0
    assert np.sum(x[:, :2] ** 2) == 5 and np.sum(x[:, 2:] ** 2) == 25 and np.sum(x**2) == 30


def test_anchor_shifted_combine():
    """[1, 3 | 10, 14], shift = first: parts (2, 1, 1, 2) and (2, 10, 2, 8).

    a = (0 + 1, 9 + 2) = (1, 11), mu = 6, M2 = 2 + 8 + 2 (25 + 25) = 110:
    mean 1 + 6 = 7, variance 110 / 4 = 27.5 (= np.var).
    """
    x = np.array([[1.0, 3.0, 10.0, 14.0]])
    parts = [identities.shifted_partials(p, "first") for p in (x[:, :2], x[:, 2:])]
    np.testing.assert_array_equal(np.concatenate(parts[0]), [2, 1, 1, 2])
    np.testing.assert_array_equal(np.concatenate(parts[1]), [2, 10, 2, 8])
    mean, var = identities.combine_shifted(parts)
    assert mean[0] == 7.0 and var[0] == 27.5 == np.var(x)


def test_shifted_combine_keeps_float32_digits_where_moments_lose_them():
    """|mean| / std = 1e4: E[x^2] - E[x]^2 in float32 has no digit of the variance
    left; the shifted combine of 8 float32 partials keeps it to ~1e-4."""
    x = (1e4 + np.random.default_rng(0).standard_normal((4, 4096))).astype(np.float32)
    assert identities.shifted_statistics(x, 8, "first") < 1e-4
    assert identities.shifted_statistics(x, 8, "mean", "mean") < 1e-4
    moments = np.mean(x * x, -1) - np.mean(x, -1) ** 2
    var64 = np.var(x.astype(np.float64), -1)
    assert np.max(np.abs(moments - var64) / var64) > 0.5


def test_anchor_chan_combine():
    """[1, 3 | 10, 14]: partials (2, 4, 2) and (2, 24, 8); mean 28 / 4 = 7,
    M2 = 2 + 8 + 2 (2 - 7)^2 + 2 (12 - 7)^2 = 110 (= 4 np.var)."""
    x = np.array([[1.0, 3.0, 10.0, 14.0]])
    parts = [identities.sum_m2_partials(p) for p in (x[:, :2], x[:, 2:])]
    np.testing.assert_array_equal(np.concatenate(parts[0]), [2, 4, 2])
    np.testing.assert_array_equal(np.concatenate(parts[1]), [2, 24, 8])
    mean, m2 = identities.combine_sum_m2(parts)
    assert mean[0] == 7.0 and m2[0] == 110.0 and 4 * np.var(x) == 110.0


def test_anchor_chan_combine_keeps_float32_digits():
    """|mean| / std = 1e3: jaxnorm's float32 combine of (sum, M2) partials (the residual
    GEMM's) keeps M2 to ~1e-5 where E[x^2] - E[x]^2 loses it."""
    x = (1e3 + np.random.default_rng(1).standard_normal((4, 4096))).astype(np.float32)
    assert identities.chan_statistics(x, 32) < 1e-4
    partials = [identities.sum_m2_partials(p) for p in np.split(x, 32, axis=-1)]
    sums, m2s = (np.stack([p[i] for p in partials]) for i in (1, 2))
    mean, m2 = row_stats.from_partials(jnp.asarray(sums), jnp.asarray(m2s), 128)
    x64 = x.astype(np.float64)
    m2_64 = np.sum((x64 - x64.mean(-1, keepdims=True)) ** 2, -1)
    assert np.max(np.abs(np.asarray(m2) - m2_64) / m2_64) < 1e-4
    moments = 4096 * (np.mean(x * x, -1) - np.mean(x, -1) ** 2)
    assert np.max(np.abs(moments - m2_64) / m2_64) > 1e-2


def test_anchor_rms_from_mean_m2():
    """[3, 4]: mean 3.5, M2 0.5: M2/2 + mean^2 = 0.25 + 12.25 = 12.5 = mean(x^2)."""
    assert identities.norms_from_mean_m2(np.array([[3.0, 4.0]]), 0.0) < 1e-15


def test_anchor_rms_scale_invariance():
    """RMSNorm([3, 4]) = [3, 4] / sqrt(12.5) = RMSNorm([6, 8]) (eps = 0)."""
    expected = np.array([[3.0, 4.0]]) / np.sqrt(12.5)
    np.testing.assert_allclose(ref.rms_norm(np.array([[3.0, 4.0]]), eps=0.0), expected, rtol=1e-15)
    np.testing.assert_allclose(ref.rms_norm(np.array([[6.0, 8.0]]), eps=0.0), expected, rtol=1e-15)


def test_anchor_qk_scores():
    """q = [3, 4], k = [6, 8], unit gains: normalized rows are equal, score = 2 (= K)."""
    q, k = np.array([[3.0, 4.0]]), np.array([[6.0, 8.0]])
    ones = np.ones(2)
    score = ref.rms_norm(q, ones, eps=0.0) @ ref.rms_norm(k, ones, eps=0.0).T
    np.testing.assert_allclose(score, [[2.0]], rtol=1e-15)
    assert identities.qk_norm_scores(q, k, ones, ones, 0.0) < FLOAT64_LEVEL


shapes = st.tuples(st.integers(1, 6), st.integers(1, 70), st.integers(1, 9))
seeds = st.integers(0, 2**32 - 1)


def _draw(seed, *shape):
    return np.random.default_rng(seed).standard_normal(shape)


@given(shapes, seeds)
def test_lazy_rms(shape, seed):
    m, k, n = shape
    assert identities.lazy_rms(_draw(seed, m, k), _draw(seed + 1, k), _draw(seed + 2, k, n),
                               1e-6) < FLOAT64_LEVEL * k


@given(shapes, seeds)
def test_lazy_layer_norm(shape, seed):
    m, k, n = shape
    err = identities.lazy_layer_norm(_draw(seed, m, k) + 3.0, _draw(seed + 1, k),
                                     _draw(seed + 2, k), _draw(seed + 3, k, n),
                                     _draw(seed + 4, n), 1e-6)
    assert err < FLOAT64_LEVEL * k * 10  # the column-sum form cancels |mu| / sigma ~ 3


@given(shapes, seeds)
def test_centering_and_moments(shape, seed):
    m, k, n = shape
    assert identities.centering(_draw(seed, m, k), _draw(seed + 1, k, n)) < FLOAT64_LEVEL * k
    assert identities.variance_from_moments(_draw(seed, m, k)) < FLOAT64_LEVEL * k


@given(shapes, seeds, st.integers(1, 8))
def test_chunked_statistics(shape, seed, chunks):
    m, k, _ = shape
    assert identities.chunked_statistics(_draw(seed, m, k), min(chunks, k)) < FLOAT64_LEVEL * k


@given(shapes, seeds, st.integers(1, 8), st.sampled_from(["first", "mean"]),
       st.sampled_from(["first", "mean"]), st.floats(-1e4, 1e4))
def test_shifted_statistics(shape, seed, chunks, shift, reference, offset):
    m, k, _ = shape
    x = _draw(seed, m, k) + offset
    assert identities.shifted_statistics(x, min(chunks, k), shift, reference) < (
        FLOAT64_LEVEL * k)


@given(shapes, seeds, st.integers(1, 8), st.floats(-1e4, 1e4))
def test_chan_statistics(shape, seed, chunks, offset):
    m, k, _ = shape
    assert identities.chan_statistics(_draw(seed, m, k) + offset, min(chunks, k)) < (
        FLOAT64_LEVEL * k)


@given(shapes, seeds, st.floats(1e-6, 1.0), st.floats(-100, 100))
def test_norms_from_mean_m2(shape, seed, eps, offset):
    m, k, _ = shape
    assert identities.norms_from_mean_m2(_draw(seed, m, k) + offset, eps) < FLOAT64_LEVEL * k


@given(shapes, seeds, st.integers(1, 32))
def test_deferred_scale(shape, seed, k_tile):
    m, k, n = shape
    assert identities.deferred_scale(_draw(seed, m, k), _draw(seed + 1, k, n), 1e-6,
                                     k_tile) < FLOAT64_LEVEL * k


@given(shapes, seeds, st.floats(1e-3, 1e3))
def test_norm_cancellation(shape, seed, c):
    m, k, n = shape
    assert identities.norm_cancellation(_draw(seed, m, k), c, _draw(seed + 1, k, n)) < (
        FLOAT64_LEVEL * k)


@given(shapes, seeds)
def test_qk_norm(shape, seed):
    m, k, n = shape
    err = identities.qk_norm_scores(_draw(seed, m, k), _draw(seed + 1, n, k), _draw(seed + 2, k),
                                    _draw(seed + 3, k), 1e-6)
    assert err < FLOAT64_LEVEL * k


@given(st.integers(1, 6), st.integers(1, 40), seeds, st.floats(0.0, 1e5))
def test_rope_keeps_the_row_scale(m, half, seed, max_position):
    positions = np.random.default_rng(seed).uniform(0.0, max_position, m)
    err = identities.rope_norm(_draw(seed, m, 2 * half), positions, _draw(seed + 1, 2 * half),
                               1e-6)
    assert err < FLOAT64_LEVEL * 2 * half * 10  # sin/cos of large angles round at ~1e-16 too


@given(shapes, seeds, st.sampled_from(["silu", "gelu_tanh", "gelu"]))
def test_gated_epilogue(shape, seed, activation):
    m, k, n = shape
    err = identities.gated_epilogue(_draw(seed, m, k), _draw(seed + 1, k), _draw(seed + 2, k, n),
                                    _draw(seed + 3, k, n), _draw(seed + 4, n), _draw(seed + 5, n),
                                    1e-6, activation)
    assert err < FLOAT64_LEVEL * k * 10  # act and the product add a few roundings of their own


def test_anchor_gated_epilogue():
    """x = [3, 4]: r = 1/sqrt(12.5 + eps); one column of ones in Wg and Wu, g = 1, b = 0:
    gate = up = 7 r = 1.9799, silu(gate) * up = gate^2 sigmoid(gate) = 3.9200 * 0.8787 = 3.4444."""
    x, ones = np.array([[3.0, 4.0]]), np.ones((2, 1))
    gate = 7.0 / np.sqrt(12.5)
    expected = gate * gate / (1.0 + np.exp(-gate))
    assert abs(expected - 3.4444) < 1e-4
    assert identities.gated_epilogue(x, np.ones(2), ones, ones, np.zeros(1), np.zeros(1), 0.0,
                                     "silu") < FLOAT64_LEVEL
    from verify import gated

    np.testing.assert_allclose(gated.rms_norm_gated_dense(x, None, ones, ones, eps=0.0),
                               [[expected]], rtol=1e-14)


@given(shapes, seeds, st.integers(1, 4))
def test_rms_backward_one_pass(shape, seed, block_m):
    m, k, _ = shape
    err = identities.rms_backward_one_pass(_draw(seed, m, k), _draw(seed + 1, k),
                                           _draw(seed + 2, m, k), 1e-6, block_m)
    assert err < FLOAT64_LEVEL * k * 10


@given(shapes, seeds, st.integers(1, 4), st.integers(2, 3))
def test_rms_backward_of_copies(shape, seed, block_m, consumers):
    m, k, _ = shape
    dys = [_draw(seed + 2 + i, m, k) for i in range(consumers)]
    err = identities.rms_backward_of_copies(_draw(seed, m, k), _draw(seed + 1, k), dys, 1e-6,
                                            block_m)
    assert err < FLOAT64_LEVEL * k * 10 * consumers


def test_anchor_rms_backward_one_pass():
    """x = [3, 4], g = 1, dy = [1, 0], eps = 0: r = 1/sqrt(12.5), rowsum(dy x) = 3, so
    dx = r ([1, 0] - (3 / 25) [3, 4]) = r [0.64, -0.48] = [0.18102, -0.13576]."""
    x, dy = np.array([[3.0, 4.0]]), np.array([[1.0, 0.0]])
    r = 1.0 / np.sqrt(12.5)
    np.testing.assert_allclose(r * np.array([0.64, -0.48]), [0.18102, -0.13576], atol=1e-5)
    assert identities.rms_backward_one_pass(x, np.ones(2), dy, 0.0, 1) < FLOAT64_LEVEL
