"""verify.rope's identities (what the decode attention-input epilogue relies on): a hand
anchor, then random float64 cases over head counts, head sizes, positions and scales."""

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from verify import rope

FLOAT64_LEVEL = 1e-12
seeds = st.integers(0, 2**32 - 1)
heads = st.tuples(st.integers(1, 6), st.integers(1, 4), st.integers(1, 32))  # rows, heads, hd/2


def _draw(seed: int, *shape) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape)


def test_anchor_quarter_turn():
    """At a quarter turn (cos 0, sin 1) a head [a, b] becomes [-b, a]."""
    q = np.array([[1.0, 2.0, 3.0, 4.0]])
    out = rope.rope_heads(q, np.zeros((1, 1)), np.ones((1, 1)), 2)
    np.testing.assert_array_equal(out, [[-2.0, 1.0, -4.0, 3.0]])


def test_anchor_qk_norm_of_a_head():
    """Head [3, 4]: mean square 12.5, so with gain 1 + g (g = 0) it becomes [3, 4] / sqrt(12.5)."""
    out = rope.qk_norm(np.array([[3.0, 4.0]]), np.zeros(2), head_dim=2, eps=0.0, offset=1.0)
    np.testing.assert_allclose(out, [[3 / np.sqrt(12.5), 4 / np.sqrt(12.5)]], rtol=1e-15)


@given(heads, seeds, st.floats(0.0, 1e5))
def test_rope_keeps_every_head_norm(shape, seed, max_position):
    m, h, half = shape
    positions = np.random.default_rng(seed).uniform(0.0, max_position, m)
    err = rope.rope_keeps_head_norms(_draw(seed, m, h * 2 * half), positions, 2 * half)
    assert err < FLOAT64_LEVEL * 2 * half * 10  # sin/cos of large angles round at ~1e-16 too


@given(heads, seeds, st.floats(1.0, 1e3))
def test_rope_commutes_with_the_row_scale(shape, seed, spread):
    m, h, half = shape
    rng = np.random.default_rng(seed)
    s = rng.uniform(1.0 / spread, spread, m)
    err = rope.rope_commutes_with_row_scale(_draw(seed, m, h * 2 * half), s,
                                            rng.uniform(0.0, 4096.0, m), 2 * half)
    assert err < FLOAT64_LEVEL


@given(heads, seeds, st.floats(1.0, 1e3))
def test_qk_norm_ignores_the_row_scale(shape, seed, spread):
    m, h, half = shape
    s = np.random.default_rng(seed).uniform(1.0 / spread, spread, m)
    err = rope.qk_norm_ignores_row_scale(_draw(seed, m, h * 2 * half), s,
                                         _draw(seed + 1, 2 * half), 2 * half)
    assert err < FLOAT64_LEVEL * 2 * half


def test_qk_norm_feels_the_row_scale_only_through_eps():
    """With qk_eps > 0 the scale matters (a tiny row is pulled to 0): the identity is eps = 0's."""
    q = 1e-4 * _draw(0, 2, 8)
    kw = dict(head_dim=8, eps=1e-2, offset=0.0)
    assert not np.allclose(rope.qk_norm(q, np.ones(8), **kw),
                           rope.qk_norm(1e4 * q, np.ones(8), **kw))
