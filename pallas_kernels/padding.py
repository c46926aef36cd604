"""Rows padded to whole tiles, in one place: the kernels and the backends pad and crop alike.

Padded rows are zeros, computed and dropped: a row's norm never reads another row.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def round_up(m: int, multiple: int) -> int:
    """The smallest multiple of `multiple` that is >= m."""
    return -(-m // multiple) * multiple


def pad_rows(a: jax.Array, rows: int) -> jax.Array:
    """a [M, ...] with zero rows appended up to `rows` (a itself when M == rows)."""
    if a.shape[0] == rows:
        return a
    return jnp.pad(a, ((0, rows - a.shape[0]),) + ((0, 0),) * (a.ndim - 1))


def crop_rows(a: jax.Array, rows: int) -> jax.Array:
    """The first `rows` rows of a (a itself when it has no more)."""
    return a if a.shape[0] == rows else a[:rows]
