"""Rows padded to whole tiles, in one place: the kernels and the backends pad and crop alike.

Padded rows are zeros, computed and dropped: a row's norm never reads another row.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import jax
import jax.numpy as jnp

from pallas_kernels.errors import Unsupported

T = TypeVar("T")


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


def config_for_rows(m: int, select: Callable[[int], T], multiple: int) -> tuple[T, int]:
    """(select(rows), rows): for M itself, or where no split serves M, for M rounded up to
    `multiple` (narrow rows take blocks of several rows); the first Unsupported otherwise."""
    try:
        return select(m), m
    except Unsupported as reason:
        padded = round_up(m, multiple)
        if padded == m:
            raise
        try:
            return select(padded), padded
        except Unsupported:
            raise reason from None
