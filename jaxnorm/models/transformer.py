"""A small Llama-style decoder: pre-norm blocks, GQA with RoPE, gated MLP, KV cache.

Parameter tree (identical for stock and jaxnorm layers):

    embed/embedding
    layers/<i>/attn_in/{norm/scale, q/kernel, k/kernel, v/kernel}
    layers/<i>/attn/{q_norm/scale, k_norm/scale (qk_norm), o/kernel}
    layers/<i>/mlp_in/{norm/scale, gate/kernel, up/kernel}
    layers/<i>/down/kernel
    head/{norm/scale, lm_head/kernel}     untied embeddings
    head_norm/scale                       tied embeddings (logits = normed @ embedding^T)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxnorm.models import layers
from jaxnorm.models.config import ModelConfig

Array = jax.Array
KVCache = tuple[tuple[Array, Array], ...]  # per layer: keys, values [B, S, KV, D]


class Attention(nnx.Module):
    """QK-norm (optional), RoPE, grouped-query attention over the cache, output projection."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        if cfg.qk_norm:
            self.q_norm = layers.rms_norm(cfg, cfg.head_dim, rngs=rngs)
            self.k_norm = layers.rms_norm(cfg, cfg.head_dim, rngs=rngs)
        self.o = layers.linear(cfg, cfg.n_heads * cfg.head_dim, cfg.d_model, rngs=rngs)

    def __call__(self, q: Array, k: Array, v: Array, positions: Array,
                 cache: tuple[Array, Array] | None) -> tuple[Array, tuple[Array, Array] | None]:
        cfg = self.cfg
        b, t, _ = q.shape
        q = q.reshape(b, t, cfg.n_heads, cfg.head_dim)
        k = k.reshape(b, t, cfg.n_kv_heads, cfg.head_dim)
        v = v.reshape(b, t, cfg.n_kv_heads, cfg.head_dim)
        if cfg.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = layers.rope(q, positions, cfg.rope_theta), layers.rope(k, positions, cfg.rope_theta)
        if cache is not None:
            start = positions[0]
            cache = tuple(jax.lax.dynamic_update_slice_in_dim(c, new.astype(c.dtype), start, axis=1)
                          for c, new in zip(cache, (k, v)))
            k, v = cache
        return self.o(layers.attend(q, k, v, positions)), cache


class Block(nnx.Module):
    """x + Attn(Norm(x)), then x + Down(act(Gate(Norm(x))) * Up(Norm(x)))."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.attn_in = layers.norm_projections(cfg, {
            "q": cfg.n_heads * cfg.head_dim, "k": cfg.n_kv_heads * cfg.head_dim,
            "v": cfg.n_kv_heads * cfg.head_dim}, rngs=rngs)
        self.attn = Attention(cfg, rngs=rngs)
        self.mlp_in = layers.norm_projections(cfg, {"gate": cfg.d_ff, "up": cfg.d_ff}, rngs=rngs)
        self.down = layers.linear(cfg, cfg.d_ff, cfg.d_model, rngs=rngs)
        self.gemma = cfg.gemma

    def __call__(self, x: Array, positions: Array, cache: tuple[Array, Array] | None):
        q, k, v = self.attn_in(x)
        attn, cache = self.attn(q, k, v, positions, cache)
        x = x + attn
        gate, up = self.mlp_in(x)
        act = nnx.gelu(gate, approximate=True) if self.gemma else nnx.silu(gate)
        return x + self.down(act * up), cache


class Transformer(nnx.Module):
    """Token ids [B, T] -> logits [B, T, vocab]; with a cache, continues at `start`.

    >>> from jaxnorm.models import Transformer, llama
    >>> model = Transformer(llama(fused=True), rngs=nnx.Rngs(0))
    >>> logits, _ = model(jnp.zeros((2, 8), jnp.int32))
    """

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.embed = nnx.Embed(cfg.vocab_size, cfg.d_model, dtype=cfg.dtype,
                               param_dtype=cfg.param_dtype, rngs=rngs)
        self.layers = nnx.List([Block(cfg, rngs=rngs) for _ in range(cfg.n_layers)])
        if cfg.tied_embeddings:
            # Shared with the input embedding, so its gain is never folded.
            self.head_norm = layers.rms_norm(cfg, cfg.d_model, rngs=rngs)
        else:
            self.head = layers.norm_projections(cfg, {"lm_head": cfg.vocab_size}, rngs=rngs)

    def init_cache(self, batch: int, max_len: int) -> KVCache:
        """Zeroed keys and values for `max_len` positions, in the computation dtype."""
        cfg = self.cfg
        dtype = cfg.dtype or cfg.param_dtype
        shape = (batch, max_len, cfg.n_kv_heads, cfg.head_dim)
        return tuple((jnp.zeros(shape, dtype), jnp.zeros(shape, dtype))
                     for _ in range(cfg.n_layers))

    def hidden(self, tokens: Array, *, start: int | Array = 0,
               cache: KVCache | None = None) -> tuple[Array, KVCache | None]:
        """The residual stream after the last block [B, T, d_model] (before the final norm)."""
        cfg = self.cfg
        x = self.embed(tokens)
        if cfg.gemma:
            x = x * jnp.sqrt(jnp.float32(cfg.d_model)).astype(x.dtype)
        positions = start + jnp.arange(tokens.shape[1])
        new_cache = []
        for i, block in enumerate(self.layers):
            x, layer_cache = block(x, positions, None if cache is None else cache[i])
            new_cache.append(layer_cache)
        return x, None if cache is None else tuple(new_cache)

    def __call__(self, tokens: Array, *, start: int | Array = 0,
                 cache: KVCache | None = None) -> tuple[Array, KVCache | None]:
        x, cache = self.hidden(tokens, start=start, cache=cache)
        if self.cfg.tied_embeddings:
            return layers.tied_logits(self.cfg, self.head_norm, self.embed, x), cache
        (logits,) = self.head(x)
        return logits, cache
