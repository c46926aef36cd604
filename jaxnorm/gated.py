"""The gated MLP input as one op: act(RMSNorm(x) @ W_gate + b_g) * (RMSNorm(x) @ W_up + b_u).

A SwiGLU / GeGLU MLP reads its input twice (gate and up), writes both [M, d_ff]
products and reads them again for act(gate) * up. `rms_norm_gated_dense` does the
norm, both products and the gating in one Mosaic kernel on Hopper
(`pallas_kernels.gated_matmul`: one [M, d_ff] output, the norm's row scale in the
epilogue), and elsewhere exactly what stock Flax computes (`jaxnorm.backends.xla_gated`).

Differentiation: a custom VJP whose backward is pure JAX. It recomputes gate and
up (the xla products, whose own VJP is `jaxnorm.autodiff`'s lean pre-norm dense
backward) instead of saving two [M, d_ff] activations, then
d gate = dy * up * act'(gate), d up = dy * act(gate) in float32. Where impl=None
resolves to the kernel, the op is differentiated as the xla formulation (as
`jaxnorm.autodiff` does for every op: a training step gains nothing from a
forward whose products the backward needs again), reducing x itself: statistics
given with x are x's own, so the whole gradient flows through x and theirs is zero.
An explicit impl with statistics differentiates the given-statistics formulation.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from jaxnorm import _checks, autodiff, callers_rows, dispatch, row_stats
from jaxnorm.backends import xla_gated
from jaxnorm.backends.xla_gated import ACTIVATIONS, OP

__all__ = ["ACTIVATIONS", "rms_norm_gated_dense"]

Array = jax.Array
ArrayLike = jax.typing.ArrayLike
F32 = jnp.float32


class _Static(NamedTuple):
    """What the rules need that is not an array (a custom_vjp nondiff argument)."""

    activation: str
    eps: float
    scale_offset: float
    impl: str
    automatic: bool  # impl=None chose the kernel: differentiate the xla formulation
    return_input: bool = False  # x after the result, for the residual stream
    lead: callers_rows.Lead = None  # automatic: the caller's leading dims of x

    def kwargs(self) -> dict[str, Any]:
        return dict(activation=self.activation, eps=self.eps, scale_offset=self.scale_offset)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _gated(s: _Static, x, scale, gate_kernel, up_kernel, gate_bias, up_bias, stats) -> Array:
    y = dispatch.call(OP, s.impl, x, scale, gate_kernel, up_kernel, gate_bias, up_bias, stats,
                      **s.kwargs())
    return (y, x) if s.return_input else y


def _xla_formulation(s: _Static, x: Array, *args) -> Array | tuple[Array, Array]:
    """(with `return_input`, x's two cotangents meet in the norm's backward kernel), on x in
    the caller's shape where `s.lead` gives it, the outputs as rows."""
    out = xla_gated.rms_norm_gated_dense(callers_rows.shaped(x, s.lead), *args, **s.kwargs(),
                                         return_input=s.return_input)
    return callers_rows.flat_outputs(out, s.lead)


def _gated_fwd(s: _Static, *args):
    if s.automatic:  # stock's formulation: given statistics (x's own) get no cotangent
        return jax.vjp(functools.partial(_xla_formulation, s), *args[:-1])
    return _gated(s, *args), args


def _gated_bwd(s: _Static, res, dy: Array | tuple[Array, Array]):
    if s.automatic:
        return (*res(dy), None)
    if s.return_input:  # an explicit impl: JAX's sum of x's two cotangents
        dy, d_input = dy
        dx, *grads = _gated_bwd(s._replace(return_input=False), res, dy)
        return (dx + d_input.astype(dx.dtype), *grads)
    *res, stats = res
    if stats is not None:  # the given-statistics formulation, differentiated by JAX
        _, vjp = jax.vjp(functools.partial(_xla_formulation, s), *res, stats)
        return vjp(dy)
    x, scale, gate_kernel, up_kernel, gate_bias, up_bias = res

    def products(x, scale, gate_kernel, up_kernel, gate_bias, up_bias):
        return autodiff.norm_dense("rms", x, scale, None, (gate_kernel, up_kernel),
                                   (gate_bias, up_bias), eps=s.eps,
                                   scale_offset=s.scale_offset, impl="xla")

    (gate, up), products_vjp = jax.vjp(products, *res)
    gated, act_vjp = jax.vjp(ACTIVATIONS[s.activation], gate.astype(F32))
    dy32 = dy.astype(F32)
    (d_gate,) = act_vjp(dy32 * up.astype(F32))
    d_up = dy32 * gated
    return (*products_vjp((d_gate.astype(gate.dtype), d_up.astype(up.dtype))), None)


_gated.defvjp(_gated_fwd, _gated_bwd)


def _check_kernels(gate_kernel: ArrayLike, up_kernel: ArrayLike, k: int) -> tuple[Array, Array]:
    (w_gate,), _ = _checks.as_kernel_tuple(gate_kernel, k)
    (w_up,), _ = _checks.as_kernel_tuple(up_kernel, k)
    if w_up.shape != w_gate.shape:
        raise ValueError(f"up_kernel must have gate_kernel's shape {w_gate.shape} (the product "
                         f"act(gate) * up is elementwise); got {w_up.shape}")
    return w_gate, w_up


def rms_norm_gated_dense(
    x: ArrayLike,
    scale: ArrayLike | None,
    gate_kernel: ArrayLike,
    up_kernel: ArrayLike,
    gate_bias: ArrayLike | None = None,
    up_bias: ArrayLike | None = None,
    *,
    activation: str = "silu",
    eps: float = 1e-6,
    scale_offset: float = 0.0,
    impl: str | None = None,
    statistics: row_stats.RowStats | None = None,
    return_input: bool = False,
) -> jax.Array | tuple[jax.Array, jax.Array]:
    """act(RMSNorm(x; scale) @ gate_kernel + gate_bias) * (RMSNorm(x; scale) @ up_kernel + up_bias).

    x: [..., K]; kernels [K, d_ff] (one shape); biases [d_ff] or None; result
    [..., d_ff] in x's dtype. `activation`: "silu" (SwiGLU), "gelu_tanh" (GeGLU,
    Gemma) or "gelu" (exact). `scale=None` means the gain is folded into both
    kernels (`jaxnorm.fold`); `scale_offset=1.0` is Gemma's (1 + scale) gain.
    `impl`: None (automatic), "xla", "mosaic" or "interpret". `statistics`: x's
    `RowStats` (from `residual_dense`), the kernel's row scale without a reduction
    over x; where impl=None falls back to xla, the norm reduces x itself as stock does.
    `return_input=True` returns (result, x) for the residual stream, as
    `jaxnorm.rms_norm_dense` does: x's two cotangents summed in RMSNorm's backward kernel
    where automatic dispatch takes it.

    >>> y = rms_norm_gated_dense(jnp.ones((2, 64)), jnp.ones(64), jnp.ones((64, 128)),
    ...                          jnp.ones((64, 128)))
    """
    eps, scale_offset = _checks.check_scalars(eps, scale_offset)
    k = _checks.check_activation("x", x)
    _checks.check_impl(impl)
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {tuple(ACTIVATIONS)}; got {activation!r}")
    _checks.check_vector("scale", scale, k)
    w_gate, w_up = _check_kernels(gate_kernel, up_kernel, k)
    n = w_gate.shape[1]
    _checks.check_vector("gate_bias", gate_bias, n)
    _checks.check_vector("up_bias", up_bias, n)
    x = jnp.asarray(x)
    lead = x.shape[:-1]
    stats = None if statistics is None else row_stats.flat_rows(
        row_stats.check("statistics", statistics, x.shape))
    args = tuple(None if a is None else jnp.asarray(a)
                 for a in (x.reshape(-1, k), scale, w_gate, w_up, gate_bias, up_bias))
    kwargs = dict(activation=activation, eps=eps, scale_offset=scale_offset)
    chosen = dispatch.resolve(OP, impl, *args, stats, **kwargs)
    with dispatch.automatic_scope(impl is None):
        if impl is None and chosen == "xla":  # stock's graph in the caller's shape: the
            # statistics go unused
            out = xla_gated.rms_norm_gated_dense(x, *args[1:], **kwargs,
                                                 return_input=return_input)
        else:
            s = _Static(activation, eps, scale_offset, chosen, automatic=impl is None,
                        return_input=return_input, lead=lead if impl is None else None)
            out = _gated(s, *args, stats)
    if not return_input:
        return out.reshape(*lead, n)
    y, x_out = out
    return y.reshape(*lead, n), x_out.reshape(x.shape)
