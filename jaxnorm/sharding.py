"""Inside `jax.shard_map`: matching the inputs' varying axes, and row statistics over a mesh axis.

Two concerns, both about what moves between shards (docs/sharding.md):

- With `check_vma=True` a custom VJP's cotangent must have its input's type. A
  replicated parameter next to batch-sharded x is *invariant* over the batch
  axis while its gradient, a sum over this shard's rows, varies. `match_varying`
  casts every input to the union of the inputs' varying axes before the custom
  VJP sees them (`jax.lax.pcast(..., to="varying")`); JAX transposes that cast
  into the psum over those axes, so a replicated gain gets the sum of the
  shards' gradients and column-parallel x the sum of its N-shards' dx.
- Row-parallel norms (x's K sharded over `axis_name`): each shard reduces its
  part of every row and only per-row statistics are psum-ed, M floats each.
  LayerNorm keeps the shifted two-pass statistics of `jaxnorm.statistics`:
  the shift is the first element of the row (shard 0's), then the mean of the
  shifted row, then the sum of squared deviations from it, one psum each, so
  rows with |mean| >> std keep their digits exactly as unsharded.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from jaxnorm import statistics
from jaxnorm.backends.xla import matmul_f32

Array = jax.Array
AxisName = str | tuple[str, ...]


def varying_axes(a: Any) -> frozenset[str]:
    """The manual mesh axes `a` varies over (empty outside shard_map or with check_vma=False)."""
    manual = getattr(jax.typeof(a), "manual_axis_type", None)
    return frozenset(getattr(manual, "varying", ()) or ())


def match_varying(*trees: Any) -> tuple[Any, ...]:
    """Every array leaf cast to vary over the union of all leaves' varying axes (see module
    docstring); the identity outside shard_map."""
    leaves = [leaf for leaf in jax.tree.leaves(trees) if leaf is not None]
    union = frozenset().union(*(varying_axes(leaf) for leaf in leaves))
    if not union:
        return trees

    def cast(leaf: Array) -> Array:
        missing = tuple(sorted(union - varying_axes(leaf)))
        return lax.pcast(leaf, missing, to="varying") if missing else leaf

    return jax.tree.map(cast, trees)


def vary_like(outputs: Any, *inputs: Any) -> Any:
    """Outputs typed to vary over the inputs' varying axes: a Pallas call inside shard_map
    returns unvarying types although each shard's result depends on its own inputs."""
    union = frozenset().union(*(varying_axes(a) for a in jax.tree.leaves(inputs)))
    if not union:
        return outputs
    return jax.tree.map(lambda y: match_varying(y, *inputs)[0], outputs)


def normalize_axis_name(axis_name: AxisName | None, sharded: Array,
                        sharded_name: str = "x") -> tuple | None:
    """axis_name as a tuple of mesh axes bound by an enclosing shard_map, or None.

    Raises ValueError outside shard_map, for an axis the mesh does not have, and
    (where shard_map tracks it, check_vma=True) when `sharded` does not vary over
    the axis: a replicated operand's statistics would be counted once per shard.
    """
    if axis_name is None:
        return None
    names = (axis_name,) if isinstance(axis_name, str) else axis_name
    if not isinstance(names, tuple) or not names or not all(isinstance(n, str) for n in names):
        raise ValueError(f"axis_name must be a mesh axis name or a tuple of them; got "
                         f"{axis_name!r}")
    for name in names:
        try:
            lax.axis_size(name)
        except NameError:
            raise ValueError(
                f"axis_name={name!r} is not an axis of an enclosing jax.shard_map; the "
                "row-parallel form runs inside shard_map over the mesh axis that shards the "
                "normalized rows"
            ) from None
    varying = varying_axes(sharded)
    if varying and not set(names) <= varying:
        raise ValueError(
            f"axis_name={axis_name!r}: {sharded_name} must be sharded over it (its row split "
            f"across the shards), but {sharded_name} varies only over {sorted(varying)}")
    return names


def shard_count(axis_name: tuple | None) -> int:
    """How many shards split a row: the product of the axes' sizes (1 without an axis)."""
    count = 1
    for name in axis_name or ():
        count *= lax.axis_size(name)
    return count


def _row_sums(axis_name: tuple | None, *values: Array) -> list[Array]:
    """Each [M, k] value's row sums over the whole row: one psum of all of them together."""
    sums = [jnp.sum(v, axis=-1) for v in values]
    return sums if axis_name is None else list(lax.psum(tuple(sums), axis_name))


def row_means(axis_name: tuple | None, *values: Array) -> list[Array]:
    """Means over whole rows of [M, k_local] values (K = k_local times the shard count)."""
    k = values[0].shape[-1] * shard_count(axis_name)
    return [s * (1.0 / k) for s in _row_sums(axis_name, *values)]


def _row_shift(x32: Array, axis_name: tuple | None) -> Array:
    """The row's first element (shard 0's), out of autodiff as in `statistics.shifted`."""
    first = lax.stop_gradient(x32[:, 0])
    if axis_name is None:
        return first
    (first,) = _row_sums(axis_name, jnp.where(lax.axis_index(axis_name) == 0, first, 0.0)[:, None])
    return first


def row_statistics(kind: str, x32: Array, eps: float, axis_name: tuple | None) -> tuple:
    """What a pre-norm forward saves per row: (r,) for RMSNorm, (shift, shifted mean, s) for
    LayerNorm; over the whole row, psum-ing M floats per statistic when K is sharded."""
    if kind == "rms":
        if axis_name is None:
            return (statistics.rms_inverse(x32, eps),)
        (mean_sq,) = row_means(axis_name, jnp.square(x32))
        return (statistics.rsqrt_plus_eps(mean_sq, eps),)
    shift = _row_shift(x32, axis_name)
    if axis_name is None:
        return (shift, *statistics.shifted_mean_and_inverse_std(x32, eps))
    d = x32 - shift[:, None]
    (mean_d,) = row_means(axis_name, d)
    (var,) = row_means(axis_name, jnp.square(d - mean_d[:, None]))
    return shift, mean_d, statistics.rsqrt_plus_eps(var, eps)


def centred_rows(kind: str, x32: Array, stats: Sequence[Array]) -> Array:
    """x for RMSNorm, (x - shift) - shifted mean for LayerNorm (never x - mean: see above)."""
    if kind == "rms":
        return x32
    shift, mean_d = stats[0], stats[1]
    return (x32 - shift[:, None]) - mean_d[:, None]


# ------------------------------------------------- forward of the split-row forms


def normalized(kind: str, x32: Array, stats: Sequence[Array], gain: Array | float,
               bias: Array | None) -> Array:
    """inv * centred * gain (+ bias) in float32: this shard's columns of a split row."""
    y = centred_rows(kind, x32, stats) * stats[-1][:, None] * gain
    return y if bias is None else y + bias.astype(jnp.float32)


def row_parallel_products(normed: Array, kernels: Sequence[Array],
                          axis_name: tuple) -> tuple[Array, ...]:
    """Each kernel's product with K split over `axis_name`: this shard's K-slice of the
    product, then one psum of the float32 partials (the only [M, N] that moves)."""
    return lax.psum(tuple(matmul_f32(normed, w) for w in kernels), axis_name)


def split_pre_norm_sum(x: Array, kernel: Array, bias: Array | None, residual: Array | None,
                       k_axis: tuple | None) -> Array:
    """h = x @ W (+ b + residual) in float32 on this shard's columns; with x's K split over
    `k_axis` the GEMM's partials are psum-ed first (before the bias is added once)."""
    h = matmul_f32(x, kernel)
    if k_axis is not None:
        h = lax.psum(h, k_axis)
    return _pre_norm_sum_rest(h, bias, residual)


def _pre_norm_sum_rest(h: Array, bias: Array | None, residual: Array | None) -> Array:
    if bias is not None:
        h = h + bias.astype(jnp.float32)
    if residual is not None:
        h = h + residual.astype(jnp.float32)
    return h
