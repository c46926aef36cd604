"""The residual GEMM: h = x @ kernel + bias + residual, and the next norm's statistics of h.

In a pre-norm transformer h is the residual stream (after the o- or the down-
projection) and the next pre-norm GEMM's input. The GEMM that writes h also
reduces it into per-row float32 (mean, M2) (`jaxnorm.RowStats`), so that
`rms_norm_dense(h, ..., statistics=stats)` applies a row scale and never reads h
an extra time (docs/design.md, "Statistics from the producer").

The backward takes cotangents for h and for the statistics: with
mean = sum(h) / N and M2 = sum((h - mean)^2),

    dH = dh + d_mean / N + 2 d_m2 (h - mean),

then dx = dH W^T, dW = x^T dH, db = colsum(dH), d_residual = dH. Composed with a
pre-norm op given the statistics, this is the gradient of the unfused h -> norm.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxnorm import _checks, dispatch, row_stats
from jaxnorm.backends import xla as _xla  # registers the xla backend too
from jaxnorm.backends.xla import matmul_f32
from jaxnorm.row_stats import RowStats

ArrayLike = jax.typing.ArrayLike
Array = jax.Array
F32 = jnp.float32
OP = "residual_dense"


class _Static(NamedTuple):
    impl: str
    automatic: bool  # impl=None chose the kernel: differentiate the xla formulation
    bias_dtype: jnp.dtype | None


def _stock(x: Array, kernel: Array, bias: Array | None, residual: Array):
    return dispatch.call(OP, "xla", x, kernel, bias, residual)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _residual_dense(s: _Static, x, kernel, bias, residual):
    return dispatch.call(OP, s.impl, x, kernel, bias, residual)


def _fwd(s: _Static, x, kernel, bias, residual):
    if s.automatic:
        return jax.vjp(_stock, x, kernel, bias, residual)
    h, mean, m2 = _residual_dense(s, x, kernel, bias, residual)
    return (h, mean, m2), (x, kernel, h, mean)


def _bwd(s: _Static, saved, cotangents):
    if s.automatic:
        return saved(cotangents)
    x, kernel, h, mean = saved
    dh, d_mean, d_m2 = cotangents
    # The statistics are of the float32 h; the saved h is its rounding to x.dtype.
    grad = row_stats.output_cotangent(h, mean, dh, d_mean, d_m2)
    operand = grad.astype(x.dtype)  # GEMM operand in x's precision, as the forward's
    dx = matmul_f32(operand, kernel.T).astype(x.dtype)
    dw = matmul_f32(x.T, operand).astype(kernel.dtype)
    db = None if s.bias_dtype is None else jnp.sum(grad, axis=0).astype(s.bias_dtype)
    return dx, dw, db, grad.astype(h.dtype)


_residual_dense.defvjp(_fwd, _bwd)


def _check_inputs(x: ArrayLike, kernel: ArrayLike, residual: ArrayLike,
                  bias: ArrayLike | None) -> tuple[int, int]:
    k = _checks.check_activation("x", x)
    (w,), _ = _checks.as_kernel_tuple(kernel, k)
    n = w.shape[1]
    _checks.check_vector("bias", bias, n)
    _checks.check_float("residual", residual)
    lead = tuple(jnp.shape(x)[:-1])
    if tuple(jnp.shape(residual)) != (*lead, n):
        raise ValueError(f"residual must have shape {(*lead, n)} (x's leading dims, kernel's N);"
                         f" got shape {tuple(jnp.shape(residual))}; x: {tuple(jnp.shape(x))}, "
                         f"kernel: {tuple(w.shape)}")
    x_dtype, r_dtype = _checks._dtype(x), _checks._dtype(residual)
    if r_dtype != x_dtype:
        raise ValueError(f"residual dtype {r_dtype} differs from x dtype {x_dtype}: h is "
                         "written in x's dtype; cast the residual first")
    return k, n


def residual_dense(
    x: ArrayLike,
    kernel: ArrayLike,
    residual: ArrayLike,
    bias: ArrayLike | None = None,
    *,
    impl: str | None = None,
) -> tuple[jax.Array, RowStats]:
    """(h, stats): h = x @ kernel + bias + residual in x's dtype, stats its rows' RowStats.

    x is [..., K], kernel [K, N], residual [..., N] of x's dtype, bias [N]. The
    statistics are float32 of the float32 h before its rounding to x's dtype on the
    kernel path; the xla path (a dot in x's dtype plus the residual, as XLA users
    write it) takes them of the rounded h. Pass them to `rms_norm_dense` /
    `layer_norm_dense` (`statistics=`) for the norm that reads h. Differentiable in
    every input, through h and through the statistics.

    >>> h, stats = residual_dense(jnp.ones((2, 8)), jnp.ones((8, 4)), jnp.ones((2, 4)))
    """
    _checks.check_impl(impl)
    _, n = _check_inputs(x, kernel, residual, bias)
    x = jnp.asarray(x)
    lead = x.shape[:-1]
    args = (x.reshape(-1, x.shape[-1]), jnp.asarray(kernel),
            None if bias is None else jnp.asarray(bias), jnp.asarray(residual).reshape(-1, n))
    chosen = dispatch.resolve(OP, impl, *args)
    if impl is None and chosen == "xla":  # stock's graph, in the caller's shape
        h = _xla.residual_sum(x, args[1], args[2], jnp.asarray(residual))
        stats = row_stats.of_rows(h)  # with mean(h^2): an RMSNorm reader keeps one reduction
    else:
        bias_dtype = None if bias is None else args[2].dtype
        s = _Static(chosen, impl is None, bias_dtype)
        h, mean, m2 = _residual_dense(s, *args)
        stats = RowStats(mean, m2, n)
    return h.reshape(*lead, n), row_stats.reshaped(stats, lead)
