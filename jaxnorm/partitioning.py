"""Partitioning rules for the Mosaic kernels under `jax.jit` with sharded inputs.

A Mosaic kernel is a custom call XLA's partitioner cannot split: left alone it
would gather every input onto each device. So on the kernel path each op's
forward is a `jax.experimental.custom_partitioning` function (as
TransformerEngine JAX does for its norms) whose Shardy rule names the factors
m (rows), k (the normalized row, the GEMM's reduction) and n_i (each output's
columns). Whatever shardings propagation picks, each device then runs:

- m sharded (data parallel): the kernel on its rows, no collective;
- n_i sharded (column-parallel pre-norm): the kernel on its columns, none;
- k sharded (row-parallel pre-norm): the split-row algebra of
  `jaxnorm.sharding`: [M] statistics psum-ed, the dense outputs' float32
  partials psum-ed, never x gathered;
- post-norm with n (or k) sharded: h on this device's columns (k's partials
  psum-ed), normalized with psum-ed [M] statistics.

The xla path is left to XLA's own partitioner (it sees plain HLO). Inside a
shard_map whose axes are all manual, and on one device, custom_partitioning
runs the function as it is.

Meshes with Explicit axes (`jax.make_mesh`'s default in jax 0.11) carry the
shardings in the types, where a GEMM contracting a sharded axis is an error
and a Pallas call cannot take sharded refs. There `over_explicit_mesh` runs the
whole op, custom VJP included, inside an internal `jax.shard_map` over that
mesh with the inputs' own specs, and the row-parallel `axis_name` set from
them: the same per-device programs as above, gradients psum-ed by JAX.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxnorm import dispatch, row_stats, sharding

Array = jax.Array
F32 = jnp.float32


class _Call(NamedTuple):
    """The static part of one partitioned call: the op, its settings, where its arrays sit."""

    op: str
    impl: str | None
    kwargs: tuple[tuple[str, Any], ...]
    treedef: Any  # of the op's positional arguments (None where an input is absent)
    roles: tuple[str, ...]  # per array argument: its dims' factors, e.g. "m k", "k n0"
    out_roles: tuple[str, ...]


def _kind(op: str) -> str:
    return "rms" if "rms" in op else "layer"


def _roles(op: str, args: tuple) -> tuple[Any, Any]:
    """(factors of each positional argument, factors of each output), None where absent."""
    def opt(v, role):
        return None if v is None else role

    if op in ("rms_norm", "layer_norm"):
        return ("m k", *(opt(v, "k") for v in args[1:])), ("m k",)
    if op.endswith("_norm_dense"):
        *vectors, kernels, biases = args[1:]
        return (("m k", *(opt(v, "k") for v in vectors),
                 tuple(f"k n{i}" for i in range(len(kernels))),
                 tuple(opt(b, f"n{i}") for i, b in enumerate(biases))),
                tuple(f"m n{i}" for i in range(len(kernels))))
    x, kernel, *rest = args  # post-norm: bias, scale, [norm_bias], residual
    vectors, residual = rest[:-1], rest[-1]
    return (("m k", "k n0", *(opt(v, "n0") for v in vectors), opt(residual, "m n0")),
            ("m n0", "m n0"))


def _wants_partitioning(impl: str | None) -> bool:
    """Only the kernel path: the xla path is plain HLO that XLA partitions itself."""
    if jax.device_count() == 1 or impl == "xla":
        return False
    return impl in ("mosaic", "interpret") or dispatch.hopper_or_newer()


def call(op: str, impl: str | None, *args: Any, **kwargs: Any) -> Any:
    """`dispatch.call(op, impl, *args, **kwargs)`, partitioned per device on the kernel path."""
    if not _wants_partitioning(impl):
        return dispatch.call(op, impl, *args, **kwargs)
    leaves, treedef = jax.tree.flatten(args)
    roles, out_roles = _roles(op, args)
    pre_norm_sum = kwargs.get("pre_norm_sum", True)
    out_roles = out_roles if pre_norm_sum or not op.startswith("dense_") else out_roles[:1]
    if kwargs.get("output_stats"):  # y and its rows' (mean, M2)
        out_roles = (out_roles[0], "m", "m")
    static = _Call(op, impl, tuple(sorted(kwargs.items())), treedef,
                   tuple(jax.tree.leaves(roles)), out_roles)
    outs = _vmappable(static)(*leaves)
    if op in ("rms_norm", "layer_norm"):
        return outs[0]
    if kwargs.get("output_stats"):
        return tuple(outs)
    if op.startswith("dense_"):
        return outs[0], outs[1] if len(outs) > 1 else None
    return tuple(outs)


def _rule(static: _Call, *_: Any) -> str:
    return f"{', '.join(static.roles)} -> {', '.join(static.out_roles)}"


def _factor_axes(static: _Call, specs: list[P]) -> dict[str, Any]:
    return _factor_axes_of(static.roles, specs)


def _factor_axes_of(roles: Any, specs: list[P]) -> dict[str, Any]:
    """Mesh axes of each factor, read from the first argument that carries it."""
    axes: dict[str, Any] = {}
    for role, spec in zip(roles, specs):
        for factor, entry in zip(role.split(), tuple(spec) + (None,) * 2):
            axes.setdefault(factor, entry)
    return axes


def _spec(role: str, axes: dict[str, Any]) -> P:
    return P(*(axes.get(f) for f in role.split()))


def _partition(static: _Call, mesh, arg_shapes, result_shape):
    specs = [a.sharding.spec for a in arg_shapes]
    axes = _factor_axes(static, specs)
    arg_shardings = tuple(NamedSharding(mesh, _spec(r, axes)) for r in static.roles)
    out_shardings = tuple(NamedSharding(mesh, _spec(r, axes)) for r in static.out_roles)
    k_axis = _as_tuple(axes.get("k"))
    n_axis = _as_tuple(axes.get("n0")) if static.op.startswith("dense_") else None

    def lower(*leaves: Array) -> tuple[Array, ...]:
        args = jax.tree.unflatten(static.treedef, leaves)
        return _per_device(static, args, k_axis, n_axis)

    return mesh, lower, out_shardings, arg_shardings


def _as_tuple(entry: Any) -> tuple | None:
    if entry is None:
        return None
    return (entry,) if isinstance(entry, str) else tuple(entry)


def _per_device(static: _Call, args: tuple, k_axis: tuple | None,
                n_axis: tuple | None) -> tuple[Array, ...]:
    """What one device computes on its blocks (see the module docstring)."""
    op, kwargs = static.op, dict(static.kwargs)
    eps = kwargs["eps"]
    if op.startswith("dense_"):
        if k_axis is None and n_axis is None:
            outs = dispatch.call(op, static.impl, *args, **kwargs)
            return tuple(o for o in outs if o is not None)
        x, kernel, bias, scale, *rest = args
        norm_bias, residual = (rest[0] if len(rest) == 2 else None), rest[-1]
        after = kwargs.get("residual_after", False)
        h = sharding.split_pre_norm_sum(x, kernel, bias, None if after else residual, k_axis)
        stats = sharding.row_statistics(_kind(op), h, eps, n_axis)
        gain = 1.0 if scale is None else scale.astype(F32)
        y = sharding.normalized(_kind(op), h, stats, gain, norm_bias)
        y = y + residual.astype(F32) if after else y
        if kwargs.get("output_stats"):
            out = row_stats.of_rows(y) if n_axis is None else row_stats.of_split_rows(y, n_axis)
            return y.astype(x.dtype), out.mean, out.m2
        y = y.astype(x.dtype)
        return (y, h.astype(x.dtype)) if kwargs.get("pre_norm_sum", True) else (y,)
    if k_axis is None:
        outs = dispatch.call(op, static.impl, *args, **kwargs)
        return (outs,) if op in ("rms_norm", "layer_norm") else tuple(outs)
    x = args[0]
    stats = sharding.row_statistics(_kind(op), x.astype(F32), eps, k_axis)
    scale = args[1]
    gain = 1.0 if scale is None else scale.astype(F32) + kwargs["scale_offset"]
    bias = args[2] if _kind(op) == "layer" else None  # LayerNorm's bias / norm_bias
    normed = sharding.normalized(_kind(op), x.astype(F32), stats, gain, bias)
    if op in ("rms_norm", "layer_norm"):
        return (normed.astype(x.dtype),)
    kernels, biases = args[-2], args[-1]
    sums = sharding.row_parallel_products(normed.astype(x.dtype), kernels, k_axis)
    return tuple((y if b is None else y + b.astype(F32)).astype(x.dtype)
                 for y, b in zip(sums, biases))


@functools.cache
def _vmappable(static: _Call) -> Callable[..., tuple[Array, ...]]:
    """The partitioned call, and under vmap the op as before (custom_partitioning has no
    batching rule; each kernel has its own)."""

    @jax.custom_batching.custom_vmap
    def partitioned(*leaves: Array) -> tuple[Array, ...]:
        return _partitioned(static, *leaves)

    @partitioned.def_vmap
    def batched(axis_size: int, in_batched: list[bool], *leaves: Array):
        outs = jax.vmap(
            lambda *ls: _per_device(static, jax.tree.unflatten(static.treedef, ls), None, None),
            in_axes=[0 if b else None for b in in_batched], axis_size=axis_size)(*leaves)
        return outs, tuple(True for _ in outs)

    return partitioned


_partitioned = custom_partitioning(
    lambda static, *leaves: _per_device(static, jax.tree.unflatten(static.treedef, leaves),
                                        None, None),
    static_argnums=(0,))
_partitioned.def_partition(partition=_partition, sharding_rule=_rule)


def _explicit_mesh(leaves: list) -> Any:
    """The Explicit mesh the arrays' types are sharded over, or None (Auto, manual, none)."""
    for leaf in leaves:
        named = getattr(jax.typeof(leaf), "sharding", None)
        mesh = getattr(named, "mesh", None)
        if mesh is not None and not mesh.empty and mesh.explicit_axes and any(named.spec):
            return mesh
    return None


def over_explicit_mesh(op: str, args: tuple, fn: Callable[[tuple, tuple | None], Any], *,
                       has_sum: bool | None = None, stats: bool = False) -> Any | None:
    """`fn(args, axis_name)` inside a shard_map over the Explicit mesh the args are sharded
    over (None when they are not): rows keep their sharding, kernels their columns, and a
    sharded normalized row (K pre-norm, N post-norm) becomes `axis_name`. `has_sum`: whether
    a post-norm op returns its pre-norm sum (default: when it has a residual); `stats`:
    whether it returns (y, RowStats), served with N unsharded."""
    leaves, treedef = jax.tree.flatten(args)
    mesh = _explicit_mesh(leaves)
    if mesh is None:
        return None
    roles, out_roles = _roles(op, args)
    role_leaves = jax.tree.leaves(roles)
    axes = _factor_axes_of(role_leaves, [jax.typeof(v).sharding.spec for v in leaves])
    post_norm = op.startswith("dense_")
    if post_norm:
        axes["k"] = None  # h's N is the normalized row; x's K is gathered, as jnp.dot's rule
    axis_name = _as_tuple(axes.get("n0" if post_norm else "k"))
    if stats and axis_name is not None:
        raise ValueError(f"return_statistics=True is not served with the output's N sharded "
                         f"(over mesh axes {axis_name}); shard the rows (M) only")
    in_specs = [_spec(r, axes) for r in role_leaves]
    leaves = [jax.sharding.reshard(v, NamedSharding(mesh, spec))
              for v, spec in zip(leaves, in_specs)]
    has_sum = post_norm and (args[-1] is not None if has_sum is None else has_sum)
    out_roles = out_roles[:1] if post_norm and not has_sum else out_roles
    out_roles = (out_roles[0], "m", "m") if stats else out_roles
    out_specs = tuple(_spec(r, axes) for r in out_roles)

    def local(*local_leaves: Array) -> tuple[Array, ...]:
        out = fn(jax.tree.unflatten(treedef, local_leaves), axis_name)
        if op.endswith("_dense"):
            return tuple(out)
        if stats:
            return out[0], out[1].mean, out[1].m2
        if post_norm:
            return tuple(out) if has_sum else (out[0],)
        return (out,)

    outs = jax.shard_map(local, mesh=mesh, in_specs=tuple(in_specs), out_specs=out_specs)(*leaves)
    if op.endswith("_dense"):
        return outs
    if stats:
        return outs[0], row_stats.RowStats(outs[1], outs[2], outs[0].shape[-1])
    if post_norm:
        return outs if has_sum else (outs[0], None)
    return outs[0]
