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
import numpy as np
from jax import lax


def safe_rsqrt(v: jax.Array) -> jax.Array:
    """rsqrt(v) where v > 0, else 0: a zero row with eps = 0 normalizes to zeros, not NaN.

    The double `where` keeps the unused rsqrt(0) = inf out of the gradient too.
    NaN stays NaN (NaN > 0 is False, but the row's values are NaN anyway).
    """
    positive = v > 0
    r = lax.rsqrt(jnp.where(positive, v, 1.0))
    return jnp.where(positive, r, jnp.where(jnp.isnan(v), v, 0.0))


def rsqrt_plus_eps(v: jax.Array, eps: float) -> jax.Array:
    """rsqrt(v + eps) for float32 v >= 0 (or NaN): the plain rsqrt, as stock Flax writes it,
    when eps is a normal float32 (then v + eps > 0 on every finite row, even where denormals
    flush to zero, and rsqrt already keeps NaN and maps inf to 0), else `safe_rsqrt`, for
    rows of zeros at eps = 0."""
    if eps >= np.finfo(np.float32).tiny:
        return lax.rsqrt(v + eps)
    return safe_rsqrt(v + eps)


def rms_inverse(x32: jax.Array, eps: float) -> jax.Array:
    """r(x) = rsqrt(mean(x^2) + eps) per row; x32 is [..., K] float32, result [...]."""
    return rsqrt_plus_eps(jnp.mean(jnp.square(x32), axis=-1), eps)


def shifted(x32: jax.Array) -> jax.Array:
    """x minus its row's first element: exact for values near it (Sterbenz), gradient-neutral."""
    return x32 - lax.stop_gradient(x32[..., :1])


def shifted_mean_and_inverse_std(x32: jax.Array, eps: float) -> tuple[jax.Array, jax.Array]:
    """(mean of the shifted row, rsqrt(var(x) + eps)) per row: what a backward pass saves.

    `shifted(x) - mean` recovers the centred row without ever forming mean(x),
    which would round at |mean|'s scale.
    """
    d = shifted(x32)
    mean_d = jnp.mean(d, axis=-1)
    var = jnp.mean(jnp.square(d - mean_d[..., None]), axis=-1)
    return mean_d, rsqrt_plus_eps(var, eps)


def centered_and_inverse_std(x32: jax.Array, eps: float) -> tuple[jax.Array, jax.Array]:
    """(x - mean(x), rsqrt(var(x) + eps)) per row, with shifted two-pass statistics."""
    mean_d, inv_std = shifted_mean_and_inverse_std(x32, eps)
    return shifted(x32) - mean_d[..., None], inv_std
