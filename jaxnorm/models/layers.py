"""The model's building blocks, each in a stock-Flax and a jaxnorm flavour with one tree.

A norm and the projections it feeds always share one module (`norm`, then one
child per projection name), whichever flavour builds it: that is the layout
`jaxnorm.nnx.RMSNormProjections` has, so the stock model, the jaxnorm model and
`jaxnorm.flashify.flashify` all see the same parameter paths.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from flax.nnx.nn.dtypes import promote_dtype
from flax.typing import Initializer

import jaxnorm
from jaxnorm import nnx as jnnx
from jaxnorm.attention_input import rotate_half
from jaxnorm.row_stats import RowStats
from jaxnorm.models.config import ModelConfig, RopeScaling
from pallas_kernels.decode_attention_input import HEAD_DIMS as KERNEL_HEAD_DIMS

Array = jax.Array


class OffsetRMSNorm(nnx.RMSNorm):
    """The stock-Flax way to write Gemma's norm: nnx.RMSNorm with gain (offset + scale),
    rounding as `convention` says (`jaxnorm.conventions`: HF Llama casts before the gain)."""

    def __init__(self, num_features: int, *, offset: float, convention: str = "flax", **kw):
        super().__init__(num_features, **kw)
        self.offset = offset
        self.convention = convention

    def __call__(self, x: Array) -> Array:
        scale = None if self.scale is None else self.scale[...]
        if self.convention == "flax" or self.dtype is not None:
            x, scale = promote_dtype((x, scale), dtype=self.dtype)
        x32 = x.astype(jnp.float32)
        y = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + self.epsilon)
        if scale is not None and self.convention == "hf_llama":
            return y.astype(x.dtype) * (scale + jnp.asarray(self.offset, scale.dtype))
        if scale is not None:
            y = y * (self.offset + scale.astype(jnp.float32))
        return y.astype(x.dtype)


class StockNormProjections(nnx.Module):
    """A stock norm applied once (none for OLMo 2's unnormed inputs), then one nnx.Linear per
    name: also the jaxnorm flavour where no norm precedes the projections."""

    def __init__(self, norm: nnx.Module | None, linears: Mapping[str, nnx.Linear]):
        if norm is not None:
            self.norm = norm
        self.normed = norm is not None
        self.names = tuple(linears)
        for name, linear in linears.items():
            setattr(self, name, linear)

    def __call__(self, x: Array, statistics: RowStats | None = None) -> tuple[Array, ...]:
        del statistics  # x's statistics (a fused model's); the stock norm reduces x itself
        h = self.norm(x) if self.normed else x
        return tuple(getattr(self, name)(h) for name in self.names)


def _scale_init(cfg: ModelConfig) -> Initializer:
    """Unit gain at initialization: scale 1, or 0 where the gain is (1 + scale)."""
    return nnx.initializers.zeros_init() if cfg.norm_offset else nnx.initializers.ones


def rms_norm(cfg: ModelConfig, features: int, *, use_scale: bool = True,
             rngs: nnx.Rngs) -> nnx.Module:
    """A standalone RMSNorm in the config's flavour (QK-norm, the norm before a tied head)."""
    kw = dict(epsilon=cfg.eps, dtype=cfg.dtype, param_dtype=cfg.param_dtype, use_scale=use_scale,
              scale_init=_scale_init(cfg), rngs=rngs)
    if cfg.fused:
        return jnnx.RMSNorm(features, scale_offset=cfg.scale_offset,
                            convention=cfg.norm_convention, impl=cfg.impl, **kw)
    if cfg.norm_offset or cfg.norm_convention != "flax":
        return OffsetRMSNorm(features, offset=cfg.norm_offset, convention=cfg.norm_convention,
                             **kw)
    return nnx.RMSNorm(features, **kw)


def norm_projections(cfg: ModelConfig, out_features: Mapping[str, int], *,
                     use_bias: bool = False, normed: bool | None = None,
                     rngs: nnx.Rngs) -> nnx.Module:
    """RMSNorm feeding the projections; the gain is absent once folded. Without a norm
    (`normed`, default `cfg.pre_norms`: OLMo 2's sublayer inputs) just the projections."""
    normed = cfg.pre_norms if normed is None else normed
    if cfg.fused and normed:
        return jnnx.RMSNormProjections(
            cfg.d_model, out_features, use_bias=use_bias, epsilon=cfg.eps, dtype=cfg.dtype,
            param_dtype=cfg.param_dtype, use_scale=not cfg.folded, scale_init=_scale_init(cfg),
            scale_offset=cfg.scale_offset, impl=cfg.impl, rngs=rngs)
    norm = rms_norm(cfg, cfg.d_model, use_scale=not cfg.folded, rngs=rngs) if normed else None
    return StockNormProjections(norm, {
        name: linear(cfg, cfg.d_model, n, use_bias=use_bias, rngs=rngs)
        for name, n in out_features.items()})


def projections_and_stream(cfg: ModelConfig, module: nnx.Module, x: Array,
                           stats: RowStats | None) -> tuple[Array, ...]:
    """(the projections of x's input norm, x for the residual stream). In a fused model
    with input norms the x is the op's (`return_input`): in a training step the stream's
    cotangent then joins the norm's inside RMSNorm's backward kernel (docs/backward.md)."""
    if cfg.fused and cfg.pre_norms:
        return module(x, statistics=stats, return_input=True)
    return (*(module(x, statistics=stats) if stats is not None else module(x)), x)


def _stream(given: Array, outs: tuple[Array, ...]) -> tuple[Array, ...]:
    """An op's outputs with return_input's x last; the x given where promotion changed it."""
    *outs, x_out = outs
    return (*outs, x_out if x_out.dtype == given.dtype else given)


def gated_mlp_input(cfg: ModelConfig, mlp_in: nnx.Module, x: Array,
                    stats: RowStats | None) -> tuple[Array, Array]:
    """(act(gate) * up of the MLP's input norm and projections, x for the residual stream,
    as `projections_and_stream`). Under `cfg.fused` with input norms, one op
    (`jaxnorm.rms_norm_gated_dense`: the gate/up dual GEMM with the activation in its
    epilogue, where dispatch picks it); else the two projections; either takes x's
    statistics where the residual GEMM wrote them, then the activation."""
    if not (cfg.fused and cfg.pre_norms):
        gate, up, stream = projections_and_stream(cfg, mlp_in, x, stats)
        return activation(cfg, gate) * up, stream
    given = x
    scale = None if mlp_in.norm.scale is None else mlp_in.norm.scale[...]
    biases = [None if p.bias is None else p.bias[...] for p in (mlp_in.gate, mlp_in.up)]
    x, scale, w_gate, w_up, b_gate, b_up = promote_dtype(
        (x, scale, mlp_in.gate.kernel[...], mlp_in.up.kernel[...], *biases), dtype=cfg.dtype)
    return _stream(given, jaxnorm.rms_norm_gated_dense(
        x, scale, w_gate, w_up, b_gate, b_up, activation=cfg.activation, eps=cfg.eps,
        scale_offset=cfg.scale_offset, impl=cfg.impl, statistics=stats, return_input=True))


def fuses_attention_input(cfg: ModelConfig) -> bool:
    """Whether the attention input is one op (`jaxnorm.rms_norm_attention_input`): a fused
    model with input norms, per-head QK-norm or none (Llama), norms rounded as
    `jaxnorm.rms_norm` rounds them (not hf_llama's convention), no q/k/v biases and a
    head_dim its kernel serves (else the unfused ops, whatever `impl` forces)."""
    return (cfg.fused and cfg.pre_norms and (not cfg.qk_norm or cfg.qk_norm_over == "head")
            and cfg.norm_convention != "hf_llama" and not cfg.qkv_bias
            and cfg.head_dim in KERNEL_HEAD_DIMS)


def attention_input(cfg: ModelConfig, attn_in: nnx.Module, attn: nnx.Module, x: Array,
                    stats: RowStats | None, positions: Array,
                    inv_freq: np.ndarray) -> tuple[Array, Array, Array, Array]:
    """(q, k, v, x for the residual stream) of x [B, T, D], q and k QK-normed (where the model
    has QK-norm) and rotated at `positions` ([T] or [B, T]): the decode attention-input
    kernel where dispatch picks it, else the unfused ops (`projections_and_stream`)."""
    given = x
    angles = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)  # as `rope`
    norm_scale = None if attn_in.norm.scale is None else attn_in.norm.scale[...]
    qk_gains = ((attn.q_norm.scale[...], attn.k_norm.scale[...]) if cfg.qk_norm
                else (None, None))
    x, norm_scale, w_q, w_k, w_v, q_scale, k_scale = promote_dtype(
        (x, norm_scale, attn_in.q.kernel[...], attn_in.k.kernel[...], attn_in.v.kernel[...],
         *qk_gains), dtype=cfg.dtype)
    return _stream(given, jaxnorm.rms_norm_attention_input(
        x, norm_scale, w_q, w_k, w_v, q_scale, k_scale, jnp.cos(angles), jnp.sin(angles),
        head_dim=cfg.head_dim, eps=cfg.eps, qk_eps=cfg.eps, scale_offset=cfg.scale_offset,
        impl=cfg.impl, statistics=stats, return_input=True))


def linear(cfg: ModelConfig, in_features: int, out_features: int, *, use_bias: bool = False,
           rngs: nnx.Rngs) -> nnx.Linear:
    return nnx.Linear(in_features, out_features, use_bias=use_bias, dtype=cfg.dtype,
                      param_dtype=cfg.param_dtype, rngs=rngs)


def project_add(cfg: ModelConfig, proj: nnx.Linear, x: Array,
                residual: Array) -> tuple[Array, RowStats | None]:
    """(residual + proj(x), its row statistics): the sublayer's output added to the residual
    stream. Under `cfg.fused` one op, `jaxnorm.residual_dense`, whose statistics the next
    pre-norm GEMM takes instead of reducing the stream again; stock: no statistics."""
    if not cfg.fused:
        return residual + proj(x), None
    bias = None if proj.bias is None else proj.bias[...]
    x, kernel, bias, residual = promote_dtype((x, proj.kernel[...], bias, residual),
                                              dtype=cfg.dtype)
    return jaxnorm.residual_dense(x, kernel, residual, bias, impl=cfg.impl)


def project_then_norm(cfg: ModelConfig, proj: nnx.Linear, norm: nnx.Module, x: Array,
                      residual: Array | None = None, *,
                      statistics: bool = False) -> Array | tuple[Array, RowStats | None]:
    """norm(proj(x)), or with a residual (residual + norm(proj(x)), its row statistics or
    None): a sublayer's output norm (Gemma 2/3, OLMo 2), then the residual add. Under
    `cfg.fused` it is one post-norm op, `jaxnorm.dense_rms_norm` with `residual_after=`
    (the add in its epilogue), which with `statistics` also returns the sum's statistics
    for the next pre-norm GEMM (stock: None)."""
    if not cfg.fused:
        y = norm(proj(x))
        return y if residual is None else (residual + y, None)
    bias = None if proj.bias is None else proj.bias[...]
    x, kernel, bias, scale, residual = promote_dtype(
        (x, proj.kernel[...], bias, norm.scale[...], residual), dtype=cfg.dtype)
    out = jaxnorm.dense_rms_norm(x, kernel, bias, scale, eps=cfg.eps,
                                 scale_offset=cfg.scale_offset, residual_after=residual,
                                 return_statistics=statistics and residual is not None,
                                 impl=cfg.impl)
    if residual is None or statistics:
        return out
    return out, None


def tied_logits(norm: nnx.Module, embed: nnx.Embed, x: Array) -> Array:
    """Final norm, then logits against the embedding table as stored ([V, D], never a
    transposed copy; it is shared with the input, so never folded either)."""
    return embed.attend(norm(x))


@functools.lru_cache(maxsize=64)
def rope_frequencies(head_dim: int, theta: float, scaling: RopeScaling | None) -> np.ndarray:
    """The inverse frequencies [head_dim / 2] (float32) of RoPE with base `theta`, scaled."""
    inv = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    if scaling is not None and scaling.kind == "linear":
        inv = inv / scaling.factor
    elif scaling is not None:  # llama3
        old = scaling.original_max_position
        wavelen = 2 * np.pi / inv
        smooth = (old / wavelen - scaling.low_freq_factor) / (
            scaling.high_freq_factor - scaling.low_freq_factor)
        blended = (1 - smooth) * inv / scaling.factor + smooth * inv
        inv = np.where(wavelen > old / scaling.low_freq_factor, inv / scaling.factor,
                       np.where(wavelen < old / scaling.high_freq_factor, inv, blended))
    return inv.astype(np.float32)


def rope(x: Array, positions: Array, inv_freq: np.ndarray) -> Array:
    """Rotary embedding of x [B, T, H, D] at positions [T] (or per row, [B, T]), rotating
    halves (Llama layout)."""
    angles = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)  # [(B,) T, D/2]
    return rotate_half(x, jnp.cos(angles), jnp.sin(angles))


def softcap(x: Array, cap: float | None) -> Array:
    """cap * tanh(x / cap) (Gemma 2's attention and final-logit soft-capping); x if no cap."""
    return x if cap is None else cap * jnp.tanh(x / cap)


def attend(q: Array, k: Array, v: Array, q_positions: Array, *, scalar: float | None = None,
           cap: float | None = None, window: int | None = None,
           pad: Array | None = None, reference: bool = False) -> Array:
    """Causal grouped-query attention: q [B, T, H, D] over k, v [B, S, KV, D].

    Key j sits at slot j, so a query at slot p sees keys 0..p (p - window < j
    <= p with a sliding `window`); with a cache, unwritten slots lie beyond every query
    slot and stay masked. Row b's first pad[b] slots are left padding, seen by no real
    query (a padding query sees itself, so no row is empty). Scores are scaled by
    scalar^-1/2 (default D), then soft-capped by `cap`, then masked.

    Without a soft-cap (which it has no place for) this is `jax.nn.dot_product_attention`
    with the mask above and implementation=None: JAX's pick (XLA in jax 0.11, cuDNN's flash
    attention where JAX selects it); soft-capped scores, mixed dtypes and `reference=True`
    take the reference einsum path (docs/guide.md, attention).
    """
    b, t, h, d = q.shape
    visible = _visible(q_positions, k.shape[1], window, pad)  # [B or 1, 1, T, S]
    scale = 1.0 / np.sqrt(d if scalar is None else scalar)
    if cap is None and not reference and q.dtype == k.dtype == v.dtype:
        out = jax.nn.dot_product_attention(q, k, v, mask=visible, scale=float(scale),
                                           implementation=None)
        return out.reshape(b, t, h * d)
    kv = k.shape[2]
    q = q.reshape(b, t, kv, h // kv, d)
    scores = jnp.einsum("btkgd,bskd->bkgts", q, k, preferred_element_type=jnp.float32)
    scores = softcap(scores / jnp.sqrt(jnp.float32(d if scalar is None else scalar)), cap)
    probs = jax.nn.softmax(jnp.where(visible[:, :, None], scores, -jnp.inf), axis=-1)
    out = jnp.einsum("bkgts,bskd->btkgd", probs.astype(v.dtype), v)
    return out.reshape(b, t, h * d)


def _visible(q_positions: Array, num_keys: int, window: int | None,
             pad: Array | None) -> Array:
    """Which keys each query sees (see `attend`), [B, 1, T, S] with `pad`, else [1, 1, T, S]."""
    keys = jnp.arange(num_keys)[None, :]
    visible = keys <= q_positions[:, None]  # [T, S]
    if window is not None:
        visible = visible & (keys > q_positions[:, None] - window)
    visible = visible[None, None]
    if pad is not None:
        real = (keys >= pad[:, None])[:, None, None, :] | (keys == q_positions[:, None])[None, None]
        visible = visible & real
    return visible


def activation(cfg: ModelConfig, x: Array) -> Array:
    """The gate's activation: SiLU (SwiGLU), tanh-approximated GELU (GeGLU) or exact GELU."""
    if cfg.activation == "silu":
        return nnx.silu(x)
    return nnx.gelu(x, approximate=cfg.activation == "gelu_tanh")
