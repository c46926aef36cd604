"""A decoder of the Llama, Qwen, Gemma and OLMo 2 families: GQA with RoPE, gated MLP, KV cache.

Parameter tree (identical for stock and jaxnorm layers; `bias` beside a kernel
where the config has biases):

    embed/embedding
    layers/<i>/attn_in/{norm/scale, q/kernel, k/kernel, v/kernel}   no norm without pre_norms
    layers/<i>/attn/{q_norm/scale, k_norm/scale (qk_norm), o/kernel}
    layers/<i>/attn/o_norm/scale           post_norms: the norm on the attention output
    layers/<i>/mlp_in/{norm/scale, gate/kernel, up/kernel}          no norm without pre_norms
    layers/<i>/down/kernel
    layers/<i>/down_norm/scale             post_norms: the norm on the MLP output
    head/{norm/scale, lm_head/kernel}     untied embeddings
    head_norm/scale                       tied embeddings (logits = normed @ embedding^T)

A post-norm sublayer adds Norm(W_o a) (or Norm(W_down h)) to the residual; under
`fused` that norm runs with its projection as one post-norm op (`jaxnorm.dense_rms_norm`).
In a fused pre-norm model the o- and down-projections write the residual stream with its
row statistics (`jaxnorm.residual_dense`, or with post-norms too, as Gemma 2/3,
`dense_rms_norm(..., return_statistics=True)`), and the next block's input norm takes them
(`statistics=`) instead of reducing the stream again (docs/design.md). OLMo 2 has no
input norms, so nothing reads its stream's statistics and none are asked for.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxnorm.models import layers
from jaxnorm.models.config import ModelConfig
from jaxnorm.row_stats import RowStats

Array = jax.Array
# Per layer: keys, values, [B, S, KV, D] or [B, KV, S, D] (`ModelConfig.kv_layout`).
KVCache = tuple[tuple[Array, Array], ...]


class Attention(nnx.Module):
    """Per-head QK-norm (optional; over the projection it is the block's), RoPE,
    grouped-query attention over the cache, output projection (and its norm with
    `post_norms`). Layer `layer` is sliding when the config says so."""

    def __init__(self, cfg: ModelConfig, layer: int, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.layer = layer
        if cfg.qk_norm:
            whole = cfg.qk_norm_over == "projection"
            self.q_norm = layers.rms_norm(
                cfg, cfg.head_dim * (cfg.n_heads if whole else 1), rngs=rngs)
            self.k_norm = layers.rms_norm(
                cfg, cfg.head_dim * (cfg.n_kv_heads if whole else 1), rngs=rngs)
        self.o = layers.linear(cfg, cfg.n_heads * cfg.head_dim, cfg.d_model,
                               use_bias=cfg.o_bias, rngs=rngs)
        if cfg.post_norms:
            self.o_norm = layers.rms_norm(cfg, cfg.d_model, rngs=rngs)

    def rope_positions(self, slots: Array, pad: Array | None) -> tuple[Array, np.ndarray]:
        """(positions [T] or [B, T], this layer's inverse frequencies [head_dim / 2])."""
        cfg = self.cfg
        if cfg.is_sliding(self.layer) and cfg.local_rope_theta is not None:
            inv_freq = layers.rope_frequencies(cfg.head_dim, cfg.local_rope_theta, None)
        else:
            inv_freq = layers.rope_frequencies(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
        return (slots if pad is None else slots[None, :] - pad[:, None]), inv_freq

    def __call__(self, q: Array, k: Array, v: Array, slots: Array,
                 cache: tuple[Array, Array] | None, pad: Array | None = None,
                 residual: Array | None = None, rotated: bool = False
                 ) -> tuple[Array, RowStats | None, tuple[Array, Array] | None]:
        """(the attention output plus `residual` when given, the sum's row statistics where
        the fused residual GEMM wrote them, the cache). With post_norms the add is part of
        the output norm's post-norm op. `rotated`: q and k come QK-normed and rotated
        (`jaxnorm.rms_norm_attention_input`)."""
        cfg = self.cfg
        sliding = cfg.is_sliding(self.layer)
        b, t, _ = q.shape
        q = q.reshape(b, t, cfg.n_heads, cfg.head_dim)
        k = k.reshape(b, t, cfg.n_kv_heads, cfg.head_dim)
        v = v.reshape(b, t, cfg.n_kv_heads, cfg.head_dim)
        if not rotated:
            if cfg.qk_norm and cfg.qk_norm_over == "head":
                q, k = self.q_norm(q), self.k_norm(k)
            positions, inv_freq = self.rope_positions(slots, pad)
            q, k = layers.rope(q, positions, inv_freq), layers.rope(k, positions, inv_freq)
        if cache is not None:
            cache, k, v = _write_cache(cache, k, v, slots[0], cfg.kv_layout)
        heads = layers.attend(q, k, v, slots, scalar=cfg.query_pre_attn_scalar,
                              cap=cfg.attn_softcap, window=cfg.sliding_window if sliding else None,
                              pad=pad)
        if cfg.post_norms and residual is not None:
            # Gemma 2/3: the sum's statistics for the pre-feedforward norm; OLMo 2 has no
            # pre-norm to read them.
            out, stats = layers.project_then_norm(cfg, self.o, self.o_norm, heads, residual,
                                                  statistics=cfg.pre_norms)
            return out, stats, cache
        if cfg.post_norms:
            return layers.project_then_norm(cfg, self.o, self.o_norm, heads), None, cache
        if residual is None:
            return self.o(heads), None, cache
        out, stats = layers.project_add(cfg, self.o, heads, residual)
        return out, stats, cache


def _write_cache(cache: tuple[Array, Array], k: Array, v: Array, start: Array,
                 layout: str) -> tuple[tuple[Array, Array], Array, Array]:
    """(the cache with k and v [B, T, KV, D] written from slot `start`, its keys and values
    as [B, S, KV, D] for `layers.attend`). With "bksd" the new rows are transposed (T of
    them) and the cache is read through a transpose that XLA folds into the attention
    dots, which read [B, KV, S, D]: the cache itself is never re-laid out."""
    axis = 2 if layout == "bksd" else 1
    new = (k, v) if layout == "bskd" else (k.swapaxes(1, 2), v.swapaxes(1, 2))
    cache = tuple(jax.lax.dynamic_update_slice_in_dim(c, n.astype(c.dtype), start, axis=axis)
                  for c, n in zip(cache, new))
    k, v = cache if layout == "bskd" else (c.swapaxes(1, 2) for c in cache)
    return cache, k, v


class Block(nnx.Module):
    """x + Attn(Norm(x)), then x + Down(act(Gate(Norm(x))) * Up(Norm(x))); with post_norms
    each sublayer's output is normed before the add, and without pre_norms its input is not."""

    def __init__(self, cfg: ModelConfig, layer: int = 0, *, rngs: nnx.Rngs):
        self.attn_in = layers.norm_projections(cfg, {
            "q": cfg.n_heads * cfg.head_dim, "k": cfg.n_kv_heads * cfg.head_dim,
            "v": cfg.n_kv_heads * cfg.head_dim}, use_bias=cfg.qkv_bias, rngs=rngs)
        self.attn = Attention(cfg, layer, rngs=rngs)
        self.mlp_in = layers.norm_projections(cfg, {"gate": cfg.d_ff, "up": cfg.d_ff},
                                              use_bias=cfg.mlp_bias, rngs=rngs)
        self.down = layers.linear(cfg, cfg.d_ff, cfg.d_model, use_bias=cfg.mlp_bias, rngs=rngs)
        if cfg.post_norms:
            self.down_norm = layers.rms_norm(cfg, cfg.d_model, rngs=rngs)
        self.cfg = cfg

    def _qkv(self, x: Array, stats: RowStats | None, slots: Array,
             pad: Array | None) -> tuple[Array, Array, Array, Array, bool]:
        """q, k, v, x for the residual stream (`layers.projections_and_stream`), and whether
        q and k are already QK-normed and rotated (the fused attention input); normed over
        the whole projection here for QK-norm over "projection"."""
        cfg, attn_in, attn = self.cfg, self.attn_in, self.attn
        if layers.fuses_attention_input(cfg):
            positions, inv_freq = attn.rope_positions(slots, pad)
            return (*layers.attention_input(cfg, attn_in, attn, x, stats, positions, inv_freq),
                    True)
        return (*self._projections(x, stats), False)

    def _projections(self, x: Array, stats: RowStats | None) -> tuple[Array, ...]:
        cfg, attn_in, attn = self.cfg, self.attn_in, self.attn
        if not (cfg.qk_norm and cfg.qk_norm_over == "projection"):
            return layers.projections_and_stream(cfg, attn_in, x, stats)
        if not cfg.pre_norms:  # OLMo 2: Norm(x @ W_q) and Norm(x @ W_k) are post-norm ops
            return (layers.project_then_norm(cfg, attn_in.q, attn.q_norm, x),
                    layers.project_then_norm(cfg, attn_in.k, attn.k_norm, x), attn_in.v(x), x)
        q, k, v, stream = layers.projections_and_stream(cfg, attn_in, x, None)
        return attn.q_norm(q), attn.k_norm(k), v, stream

    def __call__(self, x: Array, slots: Array, cache: tuple[Array, Array] | None,
                 pad: Array | None = None, stats: RowStats | None = None):
        """(x after the block, the layer's cache, x's row statistics or None).

        `stats`: the input's statistics from the previous block's down-projection."""
        cfg = self.cfg
        q, k, v, x, rotated = self._qkv(x, stats, slots, pad)
        x, stats, cache = self.attn(q, k, v, slots, cache, pad, residual=x, rotated=rotated)
        h, x = layers.gated_mlp_input(cfg, self.mlp_in, x, stats)
        if cfg.post_norms:  # the statistics for the next layer's input norm (Gemma 2/3)
            x, stats = layers.project_then_norm(cfg, self.down, self.down_norm, h, x,
                                                statistics=cfg.pre_norms)
            return x, cache, stats
        x, stats = layers.project_add(cfg, self.down, h, x)
        return x, cache, stats


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
        self.layers = nnx.List([Block(cfg, i, rngs=rngs) for i in range(cfg.n_layers)])
        if cfg.tied_embeddings:
            # Shared with the input embedding, so its gain is never folded.
            self.head_norm = layers.rms_norm(cfg, cfg.d_model, rngs=rngs)
        else:
            self.head = layers.norm_projections(cfg, {"lm_head": cfg.vocab_size}, normed=True,
                                                  rngs=rngs)

    def init_cache(self, batch: int, max_len: int) -> KVCache:
        """Zeroed keys and values for `max_len` positions, in the computation dtype and the
        config's layout (`ModelConfig.kv_layout`)."""
        cfg = self.cfg
        dtype = cfg.dtype or cfg.param_dtype
        shape = cfg.cache_shape(batch, max_len)
        return tuple((jnp.zeros(shape, dtype), jnp.zeros(shape, dtype))
                     for _ in range(cfg.n_layers))

    def hidden(self, tokens: Array, *, start: int | Array = 0, cache: KVCache | None = None,
               pad: Array | None = None) -> tuple[Array, KVCache | None]:
        """The residual stream after the last block [B, T, d_model] (before the final norm).

        `pad` [B]: row b's first pad[b] slots are left padding; its tokens sit at
        positions slot - pad[b] and no real token attends to the padding.
        """
        x, _, cache = self._blocks(tokens, start=start, cache=cache, pad=pad)
        return x, cache

    def _blocks(self, tokens: Array, *, start: int | Array, cache: KVCache | None,
                pad: Array | None) -> tuple[Array, RowStats | None, KVCache | None]:
        """`hidden`, plus the stream's row statistics where the last block wrote them."""
        cfg = self.cfg
        x = self.embed(tokens)
        if cfg.embed_scale:  # sqrt(d) rounded once to the embedding's dtype, as Gemma does
            x = x * jnp.asarray(np.sqrt(cfg.d_model), x.dtype)
        slots = start + jnp.arange(tokens.shape[1])
        new_cache, stats = [], None
        for i, block in enumerate(self.layers):
            x, layer_cache, stats = block(x, slots, None if cache is None else cache[i], pad,
                                          stats)
            new_cache.append(layer_cache)
        return x, stats, None if cache is None else tuple(new_cache)

    def __call__(self, tokens: Array, *, start: int | Array = 0, cache: KVCache | None = None,
                 pad: Array | None = None) -> tuple[Array, KVCache | None]:
        x, stats, cache = self._blocks(tokens, start=start, cache=cache, pad=pad)
        if self.cfg.tied_embeddings:
            logits = layers.tied_logits(self.head_norm, self.embed, x)
        else:
            (logits,) = self.head(x, statistics=stats) if stats is not None else self.head(x)
        return layers.softcap(logits, self.cfg.final_softcap), cache
