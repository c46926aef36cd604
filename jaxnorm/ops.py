"""The public functional ops: validate, flatten leading dims to M, dispatch, restore shape.

The xla path that impl=None falls back to gets x's leading dims too (`lead`) and computes
on x in the caller's shape, as stock Flax does (`jaxnorm.callers_rows`).

Shapes: x is [..., K]; kernels are [K, N]; vectors are [K] or [N]. Output dtype
follows x; statistics and accumulation are float32. See docs/design.md section 2.
Every op runs through `jaxnorm.autodiff`, whose custom VJP calls the dispatched
implementation forward and recomputes the backward from per-row statistics.

`axis_name` (inside `jax.shard_map`): the mesh axis over which the normalized
rows are split (x's K for the pre-norm ops, the output's N for the post-norm
ops); only per-row statistics and the dense outputs' partials are psum-ed
(docs/sharding.md).
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp

from jaxnorm import _checks, autodiff, dispatch, given_statistics, row_stats, sharding
from jaxnorm.backends import xla as _xla  # noqa: F401  (registers the xla backend)

ArrayLike = jax.typing.ArrayLike
Kernels = ArrayLike | Sequence[ArrayLike]


def _flatten(x: jax.Array) -> tuple[jax.Array, tuple[int, ...]]:
    return x.reshape(-1, x.shape[-1]), x.shape[:-1]


def _array(v: ArrayLike | None) -> jax.Array | None:
    """An already validated vector as an array: custom_vjp takes arrays, not lists."""
    return None if v is None else jnp.asarray(v)


def _common(x: ArrayLike, impl: str | None) -> tuple[jax.Array, int]:
    k = _checks.check_activation("x", x)
    _checks.check_impl(impl)
    return jnp.asarray(x), k


def rms_norm(
    x: ArrayLike,
    scale: ArrayLike | None = None,
    *,
    eps: float = 1e-6,
    scale_offset: float = 0.0,
    impl: str | None = None,
    axis_name: sharding.AxisName | None = None,
) -> jax.Array:
    """RMSNorm over the last axis: x * rsqrt(mean(x^2) + eps) * (scale + scale_offset).

    With `axis_name`, x and scale are this shard's slice of K (see module docstring).

    >>> y = rms_norm(jnp.ones((2, 8)), jnp.ones(8))
    """
    eps, scale_offset = _checks.check_scalars(eps, scale_offset)
    x, k = _common(x, impl)
    _checks.check_vector("scale", scale, k)
    axis = sharding.normalize_axis_name(axis_name, x)
    x2, lead = _flatten(x)
    with dispatch.automatic_scope(impl is None):
        y = autodiff.norm(
            "rms", x2, _array(scale), None, eps=eps, scale_offset=scale_offset, impl=impl,
            axis_name=axis, lead=lead,
        )
    return y.reshape(*lead, k)


def layer_norm(
    x: ArrayLike,
    scale: ArrayLike | None = None,
    bias: ArrayLike | None = None,
    *,
    eps: float = 1e-6,
    scale_offset: float = 0.0,
    impl: str | None = None,
    axis_name: sharding.AxisName | None = None,
) -> jax.Array:
    """LayerNorm over the last axis: (x - mean) * rsqrt(var + eps) * (scale + offset) + bias."""
    eps, scale_offset = _checks.check_scalars(eps, scale_offset)
    x, k = _common(x, impl)
    _checks.check_vector("scale", scale, k)
    _checks.check_vector("bias", bias, k)
    axis = sharding.normalize_axis_name(axis_name, x)
    x2, lead = _flatten(x)
    y = autodiff.norm(
        "layer", x2, _array(scale), _array(bias), eps=eps, scale_offset=scale_offset, impl=impl,
        axis_name=axis, lead=lead,
    )
    return y.reshape(*lead, k)


def _given_statistics(
    kind: str, x: jax.Array, statistics: object, axis: tuple | None, **kwargs
) -> tuple[jax.Array, ...]:
    """The pre-norm dense op with x's row statistics given (`jaxnorm.RowStats`)."""
    stats = row_stats.check("statistics", statistics, x.shape)
    if axis is not None:
        raise ValueError("statistics= and axis_name= together are not served: with K sharded, "
                         "pass the statistics of the whole rows to a call without axis_name")
    k = x.shape[-1]
    return given_statistics.norm_dense(kind, x.reshape(-1, k), stats=row_stats.flat_rows(stats),
                                       lead=x.shape[:-1], **kwargs)


def _unflatten_outputs(
    outs: tuple[jax.Array, ...], lead: tuple[int, ...], is_seq: bool
) -> jax.Array | tuple[jax.Array, ...]:
    shaped = tuple(y.reshape(*lead, y.shape[-1]) for y in outs)
    return shaped if is_seq else shaped[0]


def rms_norm_dense(
    x: ArrayLike,
    scale: ArrayLike | None,
    kernel: Kernels,
    bias: ArrayLike | Sequence[ArrayLike | None] | None = None,
    *,
    eps: float = 1e-6,
    scale_offset: float = 0.0,
    impl: str | None = None,
    axis_name: sharding.AxisName | None = None,
    statistics: row_stats.RowStats | None = None,
    return_input: bool = False,
) -> jax.Array | tuple[jax.Array, ...]:
    """RMSNorm(x; scale) @ kernel + bias, the norm never materialized on the kernel path.

    `kernel` may be a sequence ([wq, wk, wv]); the result is then a tuple and
    `bias` a matching sequence (or None). `scale=None` means the gain is already
    folded into the kernels (see `jaxnorm.fold`). With `axis_name` (row-parallel)
    x, scale and the kernels' rows are this shard's K-slice; the result is whole.
    `statistics` (x's `RowStats`, from `residual_dense`) gives the row scale
    rsqrt(m2/K + mean^2 + eps) without a reduction over x.

    `return_input=True` returns (outputs, x): the same x, to add to the residual stream in
    its place. In a training step x then has two cotangents, through the norm and through
    the x returned; where automatic dispatch takes RMSNorm's backward kernel they are summed
    inside it (dx + the stream's, one pass over each: docs/backward.md). Elsewhere JAX sums
    them as it would for x itself.
    """
    eps, scale_offset = _checks.check_scalars(eps, scale_offset)
    x, k = _common(x, impl)
    _checks.check_vector("scale", scale, k)
    kernels, is_seq = _checks.as_kernel_tuple(kernel, k)
    biases = _checks.as_bias_tuple(bias, kernels, is_seq)
    axis = sharding.normalize_axis_name(axis_name, x)
    with dispatch.automatic_scope(impl is None):
        if statistics is not None:
            outs = _given_statistics("rms", x, statistics, axis, scale=_array(scale),
                                     norm_bias=None, kernels=kernels, biases=biases, eps=eps,
                                     scale_offset=scale_offset, impl=impl,
                                     return_input=return_input)
            if not return_input:
                return _unflatten_outputs(outs, x.shape[:-1], is_seq)
            *outs, x_out = outs
            return _unflatten_outputs(tuple(outs), x.shape[:-1], is_seq), x_out.reshape(x.shape)
        x2, lead = _flatten(x)
        outs = autodiff.norm_dense(
            "rms", x2, _array(scale), None, kernels, biases, eps=eps, scale_offset=scale_offset,
            impl=impl, axis_name=axis, lead=lead, return_input=return_input,
        )
    if not return_input:
        return _unflatten_outputs(outs, lead, is_seq)
    *outs, x_out = outs
    return _unflatten_outputs(tuple(outs), lead, is_seq), x_out.reshape(x.shape)


def layer_norm_dense(
    x: ArrayLike,
    scale: ArrayLike | None,
    norm_bias: ArrayLike | None,
    kernel: Kernels,
    bias: ArrayLike | Sequence[ArrayLike | None] | None = None,
    *,
    eps: float = 1e-6,
    scale_offset: float = 0.0,
    impl: str | None = None,
    axis_name: sharding.AxisName | None = None,
    statistics: row_stats.RowStats | None = None,
) -> jax.Array | tuple[jax.Array, ...]:
    """LayerNorm(x; scale, norm_bias) @ kernel + bias; several kernels, `axis_name` and
    `statistics` (mean and s = rsqrt(m2/K + eps) from them) as in `rms_norm_dense`."""
    eps, scale_offset = _checks.check_scalars(eps, scale_offset)
    x, k = _common(x, impl)
    _checks.check_vector("scale", scale, k)
    _checks.check_vector("norm_bias", norm_bias, k)
    kernels, is_seq = _checks.as_kernel_tuple(kernel, k)
    biases = _checks.as_bias_tuple(bias, kernels, is_seq)
    axis = sharding.normalize_axis_name(axis_name, x)
    if statistics is not None:
        outs = _given_statistics("layer", x, statistics, axis, scale=_array(scale),
                                 norm_bias=_array(norm_bias), kernels=kernels, biases=biases,
                                 eps=eps, scale_offset=scale_offset, impl=impl)
        return _unflatten_outputs(outs, x.shape[:-1], is_seq)
    x2, lead = _flatten(x)
    outs = autodiff.norm_dense(
        "layer",
        x2,
        _array(scale),
        _array(norm_bias),
        kernels,
        biases,
        eps=eps,
        scale_offset=scale_offset,
        impl=impl,
        axis_name=axis,
        lead=lead,
    )
    return _unflatten_outputs(outs, lead, is_seq)


def _post_norm_inputs(
    x: ArrayLike, kernel: ArrayLike, bias: ArrayLike | None, residual: ArrayLike | None,
    residual_after: ArrayLike | None,
) -> tuple[jax.Array, jax.Array, tuple[int, ...], int, jax.Array | None]:
    """x flattened, the kernel, x's leading dims, N, and the one residual given (flattened)."""
    if residual is not None and residual_after is not None:
        raise ValueError("give residual (added before the norm: Norm(x @ W + b + residual)) "
                         "or residual_after (added after it: residual_after + Norm(x @ W + b)), "
                         "not both")
    name = "residual" if residual_after is None else "residual_after"
    residual = residual if residual_after is None else residual_after
    k = _checks.check_activation("x", x)
    (w,), _ = _checks.as_kernel_tuple(kernel, k)
    n = w.shape[1]
    _checks.check_vector("bias", bias, n)
    x = jnp.asarray(x)
    x2, lead = _flatten(x)
    if residual is not None:
        _checks.check_float(name, residual)
        if jnp.shape(residual) != (*lead, n):
            raise ValueError(
                f"{name} must have shape {(*lead, n)} (x's leading dims, N); "
                f"got {jnp.shape(residual)}"
            )
        residual = jnp.asarray(residual).reshape(-1, n)
    return x2, w, lead, n, residual


def _check_statistics_request(return_statistics: bool, residual_after: ArrayLike | None,
                              axis: tuple | None) -> None:
    """return_statistics=True asks for the RowStats of residual_after + Norm(...): the
    residual stream that the next block's pre-norm reads; other forms have no such reader."""
    if not isinstance(return_statistics, bool):
        raise TypeError(f"return_statistics must be a bool; got {type(return_statistics).__name__}")
    if not return_statistics:
        return
    if residual_after is None:
        raise ValueError("return_statistics=True needs residual_after=: the statistics are of "
                         "h = residual_after + Norm(x @ W + b), the residual stream the next "
                         "pre-norm op reads (statistics=)")
    if axis is not None:
        raise ValueError("return_statistics=True and axis_name= together are not served: "
                         "with N sharded, call without return_statistics")


def _post_norm_result(y: jax.Array, extra: object, lead: tuple[int, ...], n: int,
                      return_statistics: bool) -> jax.Array | tuple:
    """y (and h, or h's RowStats) with x's leading dims restored."""
    y = y.reshape(*lead, n)
    if return_statistics:
        return y, row_stats.reshaped(extra, lead)
    return y if extra is None else (y, extra.reshape(*lead, n))


def _offset_gain(scale: ArrayLike | None, scale_offset: float) -> jax.Array | None:
    """The post-norm kernels take the gain as one vector: (scale + offset) in float32."""
    if scale is None or scale_offset == 0.0:
        return _array(scale)
    return jnp.asarray(scale, jnp.float32) + scale_offset


def dense_rms_norm(
    x: ArrayLike,
    kernel: ArrayLike,
    bias: ArrayLike | None,
    scale: ArrayLike | None,
    *,
    eps: float = 1e-6,
    scale_offset: float = 0.0,
    residual: ArrayLike | None = None,
    residual_after: ArrayLike | None = None,
    return_statistics: bool = False,
    impl: str | None = None,
    axis_name: sharding.AxisName | None = None,
) -> jax.Array | tuple[jax.Array, jax.Array] | tuple[jax.Array, row_stats.RowStats]:
    """Post-norm RMSNorm(x @ kernel + bias [+ residual]) with gain (scale + scale_offset).

    With `residual`, returns (normed, pre-norm sum) so the sum can feed the
    residual stream without being recomputed. With `residual_after` instead,
    returns h = residual_after + RMSNorm(x @ kernel + bias) in x's dtype (a kernel adds in
    float32 before one rounding; the xla path adds the rounded norm as stock Flax adds a
    sublayer's output): Gemma 2/3's and OLMo 2's post-sublayer norm
    (docs/post-norm.md); with `return_statistics=True` too, (h, h's `RowStats`):
    float32 (mean, M2) of the float32 h before its rounding from a kernel, of the
    stored h on the xla path (as `residual_dense`'s), for the next pre-norm op's
    `statistics=`, differentiable like h.
    Statistics need `residual_after` (ValueError otherwise). `scale_offset=1.0` is
    Gemma's (1 + scale) gain. With `axis_name` (column-parallel) the kernel's columns
    and the N-vectors are this shard's N-slice, normalized with whole-row statistics.
    """
    eps, scale_offset = _checks.check_scalars(eps, scale_offset)
    _checks.check_impl(impl)
    x2, w, lead, n, res = _post_norm_inputs(x, kernel, bias, residual, residual_after)
    _checks.check_vector("scale", scale, n)
    axis = sharding.normalize_axis_name(axis_name, w, "kernel")
    _check_statistics_request(return_statistics, residual_after, axis)
    gain = _offset_gain(scale, scale_offset)
    with dispatch.automatic_scope(impl is None):
        y, extra = autodiff.dense_norm("rms", x2, w, _array(bias), gain, None, res, eps=eps,
                                       impl=impl, axis_name=axis,
                                       residual_after=residual_after is not None,
                                       output_stats=return_statistics, lead=lead)
    return _post_norm_result(y, extra, lead, n, return_statistics)


def dense_layer_norm(
    x: ArrayLike,
    kernel: ArrayLike,
    bias: ArrayLike | None,
    scale: ArrayLike | None,
    norm_bias: ArrayLike | None,
    *,
    eps: float = 1e-6,
    scale_offset: float = 0.0,
    residual: ArrayLike | None = None,
    residual_after: ArrayLike | None = None,
    return_statistics: bool = False,
    impl: str | None = None,
    axis_name: sharding.AxisName | None = None,
) -> jax.Array | tuple[jax.Array, jax.Array] | tuple[jax.Array, row_stats.RowStats]:
    """Post-norm LayerNorm(x @ kernel + bias [+ residual]), or residual_after +
    LayerNorm(x @ kernel + bias) (with its `RowStats` under `return_statistics`); see
    `dense_rms_norm`."""
    eps, scale_offset = _checks.check_scalars(eps, scale_offset)
    _checks.check_impl(impl)
    x2, w, lead, n, res = _post_norm_inputs(x, kernel, bias, residual, residual_after)
    _checks.check_vector("scale", scale, n)
    _checks.check_vector("norm_bias", norm_bias, n)
    axis = sharding.normalize_axis_name(axis_name, w, "kernel")
    _check_statistics_request(return_statistics, residual_after, axis)
    gain = _offset_gain(scale, scale_offset)
    y, extra = autodiff.dense_norm(
        "layer", x2, w, _array(bias), gain, _array(norm_bias), res, eps=eps, impl=impl,
        axis_name=axis, residual_after=residual_after is not None,
        output_stats=return_statistics, lead=lead,
    )
    return _post_norm_result(y, extra, lead, n, return_statistics)
