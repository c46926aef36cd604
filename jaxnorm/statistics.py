"""Per-row statistics in float32, shared by every pure-JAX path.

LayerNorm statistics are *shifted*: each row is first offset by its own first
element (a cheap estimate of the mean), then mean and variance are taken in two
passes over the shifted values. A bare E[x^2] - E[x]^2 loses every digit when
|mean| >> std (at |mean|/std = 1e4 float32 has nothing left); subtracting a
nearby shift first is exact for values close to it (Sterbenz), so the centred
values keep their precision. The shift cancels exactly in (x - mean), so it is
held out of autodiff without changing any gradient.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax


def safe_rsqrt(v: jax.Array) -> jax.Array:
    """rsqrt(v) where v > 0, else 0: a zero row with eps = 0 normalizes to zeros, not NaN.

    The double `where` keeps the unused rsqrt(0) = inf out of the gradient too.
    NaN stays NaN (NaN > 0 is False, but the row's values are NaN anyway).
    """
    positive = v > 0
    r = lax.rsqrt(jnp.where(positive, v, 1.0))
    return jnp.where(positive, r, jnp.where(jnp.isnan(v), v, 0.0))


def rms_inverse(x32: jax.Array, eps: float) -> jax.Array:
    """r(x) = rsqrt(mean(x^2) + eps) per row; x32 is [..., K] float32, result [...]."""
    return safe_rsqrt(jnp.mean(jnp.square(x32), axis=-1) + eps)


def centered_and_inverse_std(x32: jax.Array, eps: float) -> tuple[jax.Array, jax.Array]:
    """(x - mean(x), rsqrt(var(x) + eps)) per row, with shifted two-pass statistics."""
    shift = lax.stop_gradient(x32[..., :1])
    d = x32 - shift
    centered = d - jnp.mean(d, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(centered), axis=-1)
    return centered, safe_rsqrt(var + eps)


def mean_and_inverse_std(x32: jax.Array, eps: float) -> tuple[jax.Array, jax.Array]:
    """(mean(x), rsqrt(var(x) + eps)) per row, shifted two-pass; for lazy (column-sum) forms."""
    shift = lax.stop_gradient(x32[..., :1])
    d = x32 - shift
    mean_d = jnp.mean(d, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(d - mean_d), axis=-1)
    return (shift + mean_d)[..., 0], safe_rsqrt(var + eps)
