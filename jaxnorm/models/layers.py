"""The model's building blocks, each in a stock-Flax and a jaxnorm flavour with one tree.

A norm and the projections it feeds always share one module (`norm`, then one
child per projection name), whichever flavour builds it: that is the layout
`jaxnorm.nnx.RMSNormProjections` has, so the stock model, the jaxnorm model and
`jaxnorm.flashify.flashify` all see the same parameter paths.
"""

from __future__ import annotations

from collections.abc import Mapping

import jax
import jax.numpy as jnp
from flax import nnx
from flax.nnx.nn.dtypes import promote_dtype

from jaxnorm import nnx as jnnx
from jaxnorm.models.config import ModelConfig

Array = jax.Array


class OffsetRMSNorm(nnx.RMSNorm):
    """The stock-Flax way to write Gemma's norm: nnx.RMSNorm with gain (1 + scale)."""

    def __call__(self, x: Array) -> Array:
        scale = None if self.scale is None else self.scale[...]
        x, scale = promote_dtype((x, scale), dtype=self.dtype)
        x32 = x.astype(jnp.float32)
        y = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + self.epsilon)
        if scale is not None:
            y = y * (1.0 + scale.astype(jnp.float32))
        return y.astype(x.dtype)


class StockNormProjections(nnx.Module):
    """A stock norm applied once, then one stock nnx.Linear per name."""

    def __init__(self, norm: nnx.Module, linears: Mapping[str, nnx.Linear]):
        self.norm = norm
        self.names = tuple(linears)
        for name, linear in linears.items():
            setattr(self, name, linear)

    def __call__(self, x: Array) -> tuple[Array, ...]:
        h = self.norm(x)
        return tuple(getattr(self, name)(h) for name in self.names)


def rms_norm(cfg: ModelConfig, features: int, *, use_scale: bool = True,
             rngs: nnx.Rngs) -> nnx.Module:
    """A standalone RMSNorm in the config's flavour (QK-norm, the norm before a tied head)."""
    kw = dict(epsilon=cfg.eps, dtype=cfg.dtype, param_dtype=cfg.param_dtype, use_scale=use_scale,
              scale_init=nnx.initializers.zeros_init() if cfg.gemma else nnx.initializers.ones,
              rngs=rngs)
    if cfg.fused:
        return jnnx.RMSNorm(features, scale_offset=cfg.scale_offset, impl=cfg.impl, **kw)
    return OffsetRMSNorm(features, **kw) if cfg.gemma else nnx.RMSNorm(features, **kw)


def norm_projections(cfg: ModelConfig, out_features: Mapping[str, int], *,
                     rngs: nnx.Rngs) -> nnx.Module:
    """RMSNorm feeding bias-free projections; the gain is absent once folded."""
    if cfg.fused:
        return jnnx.RMSNormProjections(
            cfg.d_model, out_features, use_bias=False, epsilon=cfg.eps, dtype=cfg.dtype,
            param_dtype=cfg.param_dtype, use_scale=not cfg.folded,
            scale_init=nnx.initializers.zeros_init() if cfg.gemma else nnx.initializers.ones,
            scale_offset=cfg.scale_offset, impl=cfg.impl, rngs=rngs)
    norm = rms_norm(cfg, cfg.d_model, use_scale=not cfg.folded, rngs=rngs)
    return StockNormProjections(norm, {
        name: linear(cfg, cfg.d_model, n, rngs=rngs) for name, n in out_features.items()})


def linear(cfg: ModelConfig, in_features: int, out_features: int, *,
           rngs: nnx.Rngs) -> nnx.Linear:
    return nnx.Linear(in_features, out_features, use_bias=False, dtype=cfg.dtype,
                      param_dtype=cfg.param_dtype, rngs=rngs)


def tied_logits(cfg: ModelConfig, norm: nnx.Module, embed: nnx.Embed, x: Array) -> Array:
    """Final norm, then logits against the embedding table as stored ([V, D], never a
    transposed copy; it is shared with the input, so never folded either)."""
    return embed.attend(norm(x))


def rope(x: Array, positions: Array, theta: float) -> Array:
    """Rotary embedding of x [B, T, H, D] at positions [T], rotating halves (Llama layout)."""
    half = x.shape[-1] // 2
    freqs = theta ** (-jnp.arange(half, dtype=jnp.float32) / half)
    angles = positions.astype(jnp.float32)[:, None] * freqs  # [T, D/2]
    sin, cos = jnp.sin(angles)[:, None, :], jnp.cos(angles)[:, None, :]
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


def attend(q: Array, k: Array, v: Array, q_positions: Array) -> Array:
    """Causal grouped-query attention: q [B, T, H, D] over k, v [B, S, KV, D].

    Key j sits at position j, so a query at position p sees keys 0..p; with a
    cache, unwritten slots lie beyond every query position and stay masked.
    """
    b, t, h, d = q.shape
    kv = k.shape[2]
    q = q.reshape(b, t, kv, h // kv, d)
    scores = jnp.einsum("btkgd,bskd->bkgts", q, k, preferred_element_type=jnp.float32)
    scores = scores / jnp.sqrt(jnp.float32(d))
    visible = jnp.arange(k.shape[1])[None, :] <= q_positions[:, None]  # [T, S]
    probs = jax.nn.softmax(jnp.where(visible, scores, -jnp.inf), axis=-1)
    out = jnp.einsum("bkgts,bskd->btkgd", probs.astype(v.dtype), v)
    return out.reshape(b, t, h * d)
