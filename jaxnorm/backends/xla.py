"""Pure-JAX implementations: the same algebra on any device XLA runs on.

Every function takes activations [..., K] (the public ops hand over [M, K] rows, or
under impl=None's fallback x in the caller's shape: `jaxnorm.callers_rows`) and tuples of
kernels/biases, and returns a tuple of outputs in x.dtype.
Statistics are float32. The products are the ones stock Flax writes (operands
and result in x's dtype, float32 accumulation inside the GEMM, a bias added in
that dtype), so falling back to this path costs what the stock layers cost; a
float32 dot asks for full precision so GPUs do not silently drop to TF32.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from jaxnorm import dispatch, row_stats, statistics
from jaxnorm.dispatch import register

Array = jax.Array


def _gain(scale: Array | None, scale_offset: float) -> Array | float:
    return 1.0 if scale is None else scale.astype(jnp.float32) + scale_offset


def _precision(dtype: jnp.dtype) -> lax.Precision:
    return lax.Precision.HIGHEST if dtype == jnp.float32 else lax.Precision.DEFAULT


def matmul(a: Array, w: Array) -> Array:
    """a @ w as nnx.Linear computes it: result in a's dtype, no float32 copy plus a convert."""
    return jnp.matmul(a, w.astype(a.dtype), precision=_precision(a.dtype))


def _linear(a: Array, w: Array, b: Array | None) -> Array:
    y = matmul(a, w)
    return y if b is None else y + b.astype(y.dtype)


def matmul_f32(a: Array, w: Array) -> Array:
    """a @ w in a's dtype with float32 accumulation and float32 result."""
    return jnp.matmul(
        a, w.astype(a.dtype), preferred_element_type=jnp.float32, precision=_precision(a.dtype)
    )


def rms_normalized_f32(x: Array, scale: Array | None, eps: float, scale_offset: float) -> Array:
    x32 = x.astype(jnp.float32)
    return x32 * statistics.rms_inverse(x32, eps)[..., None] * _gain(scale, scale_offset)


def layer_normalized_f32(
    x: Array, scale: Array | None, bias: Array | None, eps: float, scale_offset: float
) -> Array:
    centered, inv_std = statistics.centered_and_inverse_std(x.astype(jnp.float32), eps)
    y = centered * inv_std[..., None] * _gain(scale, scale_offset)
    return y if bias is None else y + bias.astype(jnp.float32)


def _stock_rms_norm(x: Array, scale: Array | None, eps: float, scale_offset: float) -> Array:
    return rms_normalized_f32(x, scale, eps, scale_offset).astype(x.dtype)


def rms_normalized(x: Array, scale: Array | None, eps: float, scale_offset: float) -> Array:
    """RMSNorm(x) in x's dtype as stock Flax computes it. Inside an impl=None op where
    automatic dispatch takes RMSNorm's backward kernel for x's rows
    (`dispatch.norm_backward_kernel`) its VJP is that kernel; everywhere else JAX
    differentiates this graph, as it does stock's."""
    rows = x.reshape(-1, x.shape[-1])  # the kernel's [M, K] view of x
    if not dispatch.norm_backward_kernel(rows, scale, eps=eps, scale_offset=scale_offset):
        return _stock_rms_norm(x, scale, eps, scale_offset)
    return _rms_norm_kernel_vjp(float(eps), float(scale_offset), False, 1, x, scale)


def rms_normalized_and_input(x: Array, scale: Array | None, eps: float, scale_offset: float,
                             consumers: int = 1) -> tuple[Array, ...]:
    """(RMSNorm(x) once per consumer, x): `rms_normalized` with x passed through for the
    residual stream. Where the backward kernel serves, x's cotangents (through each copy of
    the norm, and through the x returned) meet inside it: the consumers' (the q, k and v, or
    gate and up, GEMMs') summed as it reads them and dx + the stream's in one pass
    (docs/backward.md), where the table has the kernel measured faster with that many; where
    it has it only with one, JAX sums the consumers' first; elsewhere JAX adds them all, as
    it does for stock's graph."""
    rows = x.reshape(-1, x.shape[-1])
    taken = functools.partial(dispatch.norm_backward_kernel, rows, scale, eps=eps,
                              scale_offset=scale_offset, addend=True)
    if consumers > 1 and taken(cotangents=consumers):
        return _rms_norm_kernel_vjp(float(eps), float(scale_offset), True, consumers, x, scale)
    # One copy for every consumer (JAX adds their cotangents), where the kernel measured
    # faster only in that form, or nowhere.
    if taken():
        normed, x_out = _rms_norm_kernel_vjp(float(eps), float(scale_offset), True, 1, x, scale)
    else:
        normed, x_out = _stock_rms_norm(x, scale, eps, scale_offset), x
    return (normed,) * consumers + (x_out,)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2, 3))
def _rms_norm_kernel_vjp(eps: float, scale_offset: float, with_input: bool, copies: int,
                         x: Array, scale: Array | None) -> Array | tuple[Array, ...]:
    """The stock norm of x [..., K] (`copies` times, then x itself where `with_input`) whose
    VJP is the backward kernel on x's [M, K] rows, given the copies' cotangents to sum and
    x's cotangent through the returned x as its addend."""
    return _norm_copies(eps, scale_offset, with_input, copies, x, scale)


def _norm_copies(eps, scale_offset, with_input, copies, x, scale):
    y = _stock_rms_norm(x, scale, eps, scale_offset)
    return (y,) * copies + (x,) if with_input else y


def _rms_norm_kernel_vjp_fwd(eps, scale_offset, with_input, copies, x, scale):
    return _norm_copies(eps, scale_offset, with_input, copies, x, scale), (x, scale)


def _rms_norm_kernel_vjp_bwd(eps, scale_offset, with_input, copies, saved, cotangents):
    x, scale = saved
    cotangents = cotangents if with_input else (cotangents,)
    dys, addend = cotangents[:copies], cotangents[copies:]
    rows = lambda a: a.astype(x.dtype).reshape(-1, x.shape[-1])
    g = rows(dys[0]) if copies == 1 else tuple(map(rows, dys))
    dx, d_scale = dispatch.call("rms_norm_backward", None, rows(x), g, scale,
                                *map(rows, addend), eps=eps, scale_offset=scale_offset)
    return dx.reshape(x.shape), d_scale


_rms_norm_kernel_vjp.defvjp(_rms_norm_kernel_vjp_fwd, _rms_norm_kernel_vjp_bwd)


@register("rms_norm_backward", "xla")
def rms_norm_vjp(x: Array, g: Array | tuple[Array, ...], scale: Array | None,
                 addend: Array | None = None, *, eps: float,
                 scale_offset: float) -> tuple[Array, Array | None]:
    """(dx [+ addend], d scale) of RMSNorm(x) for its cotangent g (or the sum of a tuple of
    them, one per consumer): JAX's VJP of the stock graph (the addend, x's other cotangent,
    added as JAX adds cotangents)."""
    _, vjp = jax.vjp(lambda x, scale: _stock_rms_norm(x, scale, eps, scale_offset), x, scale)
    if isinstance(g, (tuple, list)):  # summed in float32 and rounded once, as the kernel does
        g = functools.reduce(jnp.add, [gi.astype(jnp.float32) for gi in g]).astype(x.dtype)
    dx, d_scale = vjp(g)
    return (dx if addend is None else dx + addend), d_scale


@register("rms_norm", "xla")
def rms_norm(x: Array, scale: Array | None, *, eps: float, scale_offset: float) -> Array:
    return rms_normalized(x, scale, eps, scale_offset)


@register("layer_norm", "xla")
def layer_norm(
    x: Array, scale: Array | None, bias: Array | None, *, eps: float, scale_offset: float
) -> Array:
    return layer_normalized_f32(x, scale, bias, eps, scale_offset).astype(x.dtype)


def _dense_outputs(
    normed: Array, kernels: tuple[Array, ...], biases: tuple[Array | None, ...]
) -> tuple[Array, ...]:
    return tuple(_linear(normed, w, b) for w, b in zip(kernels, biases))


@register("rms_norm_dense", "xla")
def rms_norm_dense(
    x: Array,
    scale: Array | None,
    kernels: tuple[Array, ...],
    biases: tuple[Array | None, ...],
    stats: row_stats.RowStats | None = None,
    *,
    eps: float,
    scale_offset: float,
    return_input: bool = False,
) -> tuple[Array, ...]:
    """The unfused pattern users write: normalize once (in x.dtype), then one dot per kernel.

    With `stats` (x's rows' RowStats) the row scale comes from them, not from x.
    `return_input`: x itself after the outputs (`rms_normalized_and_input`)."""
    if stats is None:
        if not return_input:
            return _dense_outputs(rms_normalized(x, scale, eps, scale_offset), kernels, biases)
        *normed, x_out = rms_normalized_and_input(x, scale, eps, scale_offset,
                                                  consumers=len(kernels))
        return (*(_linear(n, w, b) for n, w, b in zip(normed, kernels, biases)), x_out)
    r = row_stats.rms_inverse(stats, eps)
    normed = x.astype(jnp.float32) * r[..., None] * _gain(scale, scale_offset)
    outs = _dense_outputs(normed.astype(x.dtype), kernels, biases)
    return (*outs, x) if return_input else outs


@register("layer_norm_dense", "xla")
def layer_norm_dense(
    x: Array,
    scale: Array | None,
    norm_bias: Array | None,
    kernels: tuple[Array, ...],
    biases: tuple[Array | None, ...],
    stats: row_stats.RowStats | None = None,
    *,
    eps: float,
    scale_offset: float,
) -> tuple[Array, ...]:
    if stats is None:
        normed = layer_normalized_f32(x, scale, norm_bias, eps, scale_offset)
    else:
        s = row_stats.inverse_std(stats, eps)
        normed = (x.astype(jnp.float32) - stats.mean[..., None]) * s[..., None]
        normed = normed * _gain(scale, scale_offset)
        normed = normed if norm_bias is None else normed + norm_bias.astype(jnp.float32)
    return _dense_outputs(normed.astype(x.dtype), kernels, biases)


def _pre_norm_sum(x: Array, kernel: Array, bias: Array | None, residual: Array | None) -> Array:
    """x @ W + b as the stock Linear writes it, then the residual added in float32."""
    h = _linear(x, kernel, bias).astype(jnp.float32)
    if residual is not None:
        h = h + residual.astype(jnp.float32)
    return h


def _post_norm_outputs(x: Array, h: Array, y: Array, residual: Array | None,
                       residual_after: bool, pre_norm_sum: bool,
                       output_stats: bool) -> tuple[Array, ...]:
    """(y [+ the residual added after the norm], h or None) in x.dtype; with `output_stats`,
    (y, mean, M2): the row statistics of the stored y, as `residual_dense`'s xla path.

    The residual is added after y's rounding, in x's dtype, as stock Flax adds a
    sublayer's output: XLA then writes the residual stream in x's dtype and takes the
    next norm's statistics in the same fusion. A float32 add with one rounding is
    what the kernels do; here XLA (excess precision allowed) would drop that rounding
    for the stream's float32 readers and keep the float32 sum."""
    if residual_after:
        y = y.astype(x.dtype) + residual.astype(x.dtype)
    if output_stats:  # residual_after's (ops refuse it otherwise): y is stored already
        stats = row_stats.of_rows(y)
        return y, stats.mean, stats.m2
    return y.astype(x.dtype), h.astype(x.dtype) if pre_norm_sum else None


@register("dense_rms_norm", "xla")
def dense_rms_norm(
    x: Array,
    kernel: Array,
    bias: Array | None,
    scale: Array | None,
    residual: Array | None,
    *,
    eps: float,
    pre_norm_sum: bool = True,
    residual_after: bool = False,
    output_stats: bool = False,
) -> tuple[Array, ...]:
    """(RMSNorm(x @ W + b [+ residual]), the pre-norm sum or None), the sum with the
    residual kept in float32 until the end; with `residual_after`, (residual +
    RMSNorm(x @ W + b), h or None), the add in x's dtype. `output_stats` (with
    pre_norm_sum=False) returns (y, mean, M2) of y's float32 rows instead."""
    if residual is None or residual_after:
        # The product as stock's Linear writes it, normed as stock's norm (its float32 copy
        # normalized, then rounded), so a training step may differentiate the norm with
        # its kernel (`rms_normalized`).
        product = _linear(x, kernel, bias)
        y = rms_normalized(product, scale, eps, 0.0)
        return _post_norm_outputs(x, product.astype(jnp.float32), y, residual, residual_after,
                                  pre_norm_sum, output_stats)
    h = _pre_norm_sum(x, kernel, bias, residual)
    y = h * statistics.rms_inverse(h, eps)[..., None] * _gain(scale, 0.0)
    return _post_norm_outputs(x, h, y, residual, residual_after, pre_norm_sum, output_stats)


@register("dense_layer_norm", "xla")
def dense_layer_norm(
    x: Array,
    kernel: Array,
    bias: Array | None,
    scale: Array | None,
    norm_bias: Array | None,
    residual: Array | None,
    *,
    eps: float,
    pre_norm_sum: bool = True,
    residual_after: bool = False,
    output_stats: bool = False,
) -> tuple[Array, ...]:
    h = _pre_norm_sum(x, kernel, bias, None if residual_after else residual)
    centered, inv_std = statistics.centered_and_inverse_std(h, eps)
    y = centered * inv_std[..., None] * _gain(scale, 0.0)
    if norm_bias is not None:
        y = y + norm_bias.astype(jnp.float32)
    return _post_norm_outputs(x, h, y, residual, residual_after, pre_norm_sum, output_stats)



@register("residual_dense", "xla")
def residual_dense(
    x: Array, kernel: Array, bias: Array | None, residual: Array
) -> tuple[Array, Array, Array]:
    """(h, mean, m2): h = x @ W + b + residual as XLA users write it (one dot in x.dtype, the
    residual added in x.dtype, which XLA fuses into cuBLAS as beta = 1), then h's two-pass
    float32 row statistics."""
    return residual_outputs(_linear(x, kernel, bias), residual)


def residual_sum(x: Array, kernel: Array, bias: Array | None, residual: Array) -> Array:
    """h = x @ W + b + residual in x's dtype, as `residual_dense` writes it, without its
    statistics (for callers that take RowStats of h themselves)."""
    return _linear(x, kernel, bias) + residual.astype(x.dtype)


def residual_outputs(y: Array, residual: Array) -> tuple[Array, Array, Array]:
    """(h, mean, m2): h = y + residual in y's dtype and h's float32 row statistics, after
    whichever GEMM wrote y (this path's dot, or the decode GEMM's at decode)."""
    h = y + residual.astype(y.dtype)
    stats = row_stats.of_rows(h)
    return h, stats.mean, stats.m2
