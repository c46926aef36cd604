"""FlashNorm weight folding: move a norm's gain (and LayerNorm's bias) into the kernels it feeds.

    RMSNorm(x; g) @ W + b             = rms_norm_dense(x, None, fold_gain(g, W), b)
    LayerNorm(x; g, beta) @ W + b     = layer_norm_dense(x, None, None, W*, beta @ W + b)
    with W* = diag(g + offset) W.

The lazy LayerNorm form also needs the column sums c = 1^T W* (the epilogue
subtracts mean(x) * c). Folding is done in float32 and cast back to the
kernel's dtype, so a float32 round trip is exact within rounding.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxnorm import _checks

Array = jax.Array


def _effective_gain(scale: jax.typing.ArrayLike, scale_offset: float) -> Array:
    return jnp.asarray(scale, jnp.float32) + scale_offset


def fold_gain(
    scale: jax.typing.ArrayLike, kernel: jax.typing.ArrayLike, scale_offset: float = 0.0
) -> Array:
    """W* = diag(scale + scale_offset) W, in the kernel's dtype."""
    _checks.check_float("kernel", kernel)
    w = jnp.asarray(kernel)
    if w.ndim != 2:
        raise ValueError(f"kernel must have rank 2 ([K, N]); got shape {w.shape}")
    _checks.check_vector("scale", scale, w.shape[0])
    g = _effective_gain(scale, scale_offset)
    return (g[:, None] * w.astype(jnp.float32)).astype(w.dtype)


def unfold_gain(
    scale: jax.typing.ArrayLike, folded_kernel: jax.typing.ArrayLike, scale_offset: float = 0.0
) -> Array:
    """Invert `fold_gain`: W = diag(1 / (scale + scale_offset)) W*. Zero gains cannot be undone."""
    folded_kernel = jnp.asarray(folded_kernel)
    _checks.check_vector("scale", scale, folded_kernel.shape[0])
    g = _effective_gain(scale, scale_offset)
    if not isinstance(g, jax.core.Tracer) and bool(jnp.any(g == 0)):
        raise ValueError("scale + scale_offset has zeros: the folded kernel lost those rows")
    return (folded_kernel.astype(jnp.float32) / g[:, None]).astype(folded_kernel.dtype)


def fold_norm_bias(
    norm_bias: jax.typing.ArrayLike,
    kernel: jax.typing.ArrayLike,
    bias: jax.typing.ArrayLike | None = None,
) -> Array:
    """beta @ W + b: the LayerNorm bias pushed through the (unfolded) kernel, float32."""
    kernel = jnp.asarray(kernel)
    _checks.check_vector("norm_bias", norm_bias, kernel.shape[0])
    _checks.check_vector("bias", bias, kernel.shape[1])
    folded = jnp.matmul(
        jnp.asarray(norm_bias, jnp.float32),
        kernel.astype(jnp.float32),
        precision=jax.lax.Precision.HIGHEST,
    )
    return folded if bias is None else folded + jnp.asarray(bias, jnp.float32)


def column_sums(folded_kernel: jax.typing.ArrayLike) -> Array:
    """c = 1^T W* in float32: the lazy LayerNorm epilogue subtracts mean(x) * c."""
    return jnp.sum(jnp.asarray(folded_kernel, jnp.float32), axis=0)


class FoldedLayerNorm(NamedTuple):
    """What a lazy LayerNorm + dense needs: W*, the folded bias, and c = 1^T W*."""

    kernel: Array
    bias: Array
    column_sums: Array


def fold_layer_norm(
    scale: jax.typing.ArrayLike | None,
    norm_bias: jax.typing.ArrayLike | None,
    kernel: jax.typing.ArrayLike,
    bias: jax.typing.ArrayLike | None = None,
    scale_offset: float = 0.0,
) -> FoldedLayerNorm:
    """Fold LayerNorm(x; g, beta) @ W + b into (W*, beta @ W + b, 1^T W*)."""
    kernel = jnp.asarray(kernel)
    folded = kernel if scale is None else fold_gain(scale, kernel, scale_offset)
    if norm_bias is None:
        norm_bias = jnp.zeros((kernel.shape[0],), jnp.float32)
    return FoldedLayerNorm(folded, fold_norm_bias(norm_bias, kernel, bias), column_sums(folded))

