"""`jaxnorm.models.layers.attend`: jax.nn.dot_product_attention where it serves the case, the
reference einsum path elsewhere; both agree (float32) on causal GQA with caches, left
padding and sliding windows."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxnorm.models import layers


def _qkv(seed: int, b=2, t=5, s=9, h=4, kv=2, d=8):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((b, t, h, d)).astype(np.float32)
    k = rng.standard_normal((b, s, kv, d)).astype(np.float32)
    v = rng.standard_normal((b, s, kv, d)).astype(np.float32)
    return jnp.asarray(q), jnp.asarray(k), jnp.asarray(v)


@pytest.mark.parametrize("start, window, pad, scalar", [
    (0, None, None, None), (4, None, None, None), (4, 3, None, None), (0, None, (0, 2), 24.0),
    (3, 2, (1, 3), None)],
    ids=["prefill", "cached", "cached-window", "left-padded-scalar", "window-padded"])
def test_dot_product_attention_path_matches_the_reference(start, window, pad, scalar):
    q, k, v = _qkv(start + (window or 0))
    slots = start + jnp.arange(q.shape[1])
    pad = None if pad is None else jnp.asarray(pad)
    kw = dict(scalar=scalar, window=window, pad=pad)
    fast = layers.attend(q, k, v, slots, **kw)
    ref = layers.attend(q, k, v, slots, reference=True, **kw)
    assert fast.shape == (2, 5, 32)
    np.testing.assert_allclose(np.asarray(fast), np.asarray(ref), rtol=1e-5, atol=1e-5)


def test_the_paths_are_the_ones_named(monkeypatch):
    """Without a soft-cap attend calls jax.nn.dot_product_attention; with one it cannot."""
    calls = []
    original = jax.nn.dot_product_attention

    def spy(*args, **kwargs):
        calls.append(kwargs["implementation"])
        return original(*args, **kwargs)

    monkeypatch.setattr(jax.nn, "dot_product_attention", spy)
    q, k, v = _qkv(1)
    slots = jnp.arange(q.shape[1])
    layers.attend(q, k, v, slots)
    assert calls == [None]
    capped = layers.attend(q, k, v, slots, cap=2.0)
    assert calls == [None]
    uncapped = layers.attend(q, k, v, slots, reference=True)
    assert not np.allclose(np.asarray(capped), np.asarray(uncapped), atol=1e-3)
