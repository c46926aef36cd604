"""One frozen dataclass describes a model; presets name real families with their real defaults.

Each architectural difference between the families is its own field, so a
checkpoint's config maps onto them one by one (`jaxnorm.models.hf_config`):

    norm placement      pre_norms (input norms), post_norms (a norm on each sublayer's output
                        before the residual add: Gemma 2/3 with pre_norms, OLMo 2 without)
    norms               norm_offset (Gemma's 1 + g), qk_norm over "head" or "projection"
    biases              qkv_bias, o_bias, mlp_bias
    attention           query_pre_attn_scalar, attn_softcap, sliding_window, layer_types
    position            rope_theta, rope_scaling, local_rope_theta (sliding layers' base)
    embeddings, head    embed_scale (sqrt(d) on the input), tied_embeddings, final_softcap
    activation          "silu" (SwiGLU), "gelu_tanh" (GeGLU), "gelu"
    numerics            norm_convention: where standalone RMSNorms round in 16-bit dtypes
                        ("flax", "hf_llama", "gemma": `jaxnorm.conventions`)
    KV cache            cache_layout: "bskd" ([B, S, KV, D], Flax's attention cache) or
                        "bksd" ([B, KV, S, D], the layout XLA's attention dots read)
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp

from jaxnorm.conventions import CONVENTIONS

ACTIVATIONS = ("silu", "gelu_tanh", "gelu")
LAYER_TYPES = ("full", "sliding")
QK_NORM_OVER = ("head", "projection")
CACHE_LAYOUTS = ("bskd", "bksd")


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """Rotary frequency scaling of the long-context checkpoints.

    "linear": every inverse frequency divided by `factor` (Gemma 3 global layers).
    "llama3": Llama 3.1/3.2's blend: wavelengths longer than
    original_max_position / low_freq_factor are divided by `factor`, shorter than
    original_max_position / high_freq_factor kept, and those between interpolated.
    """

    kind: str
    factor: float
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192

    def __post_init__(self) -> None:
        if self.kind not in ("linear", "llama3"):
            raise ValueError(f"rope scaling kind must be 'linear' or 'llama3'; got {self.kind!r}")
        if self.factor <= 0:
            raise ValueError(f"rope scaling factor must be positive; got {self.factor}")
        if self.kind == "llama3" and self.high_freq_factor <= self.low_freq_factor:
            raise ValueError("llama3 rope scaling needs high_freq_factor > low_freq_factor; got "
                             f"{self.high_freq_factor} <= {self.low_freq_factor}")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """A decoder-only transformer (GQA, RoPE, gated MLP); see the module docstring.

    `fused` is the one switch between stock Flax layers (False) and jaxnorm
    layers (True); both build the same parameter tree with the same values from
    the same `Rngs`. `folded` builds the flashified form (`jaxnorm.flashify.flashify`):
    norms whose gains moved into the projections they feed carry no scale.
    """

    vocab_size: int = 64
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int = 2
    head_dim: int = 16
    d_ff: int = 128
    rope_theta: float = 10_000.0
    rope_scaling: RopeScaling | None = None  # applies to full-attention layers only
    local_rope_theta: float | None = None  # sliding layers' base (Gemma 3); None: rope_theta
    eps: float = 1e-6
    pre_norms: bool = True  # RMSNorm on each sublayer's input
    post_norms: bool = False  # RMSNorm on each sublayer's output, before the residual add
    norm_offset: float = 0.0  # every norm's gain is scale + norm_offset (Gemma: 1)
    qk_norm: bool = False  # RMSNorm of q and k before RoPE
    qk_norm_over: str = "head"  # "head": per head (Qwen3, Gemma 3); "projection": OLMo 2
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    activation: str = "silu"
    embed_scale: bool = False  # multiply the input embedding by sqrt(d_model) (Gemma)
    tied_embeddings: bool = False
    query_pre_attn_scalar: float | None = None  # scores scaled by its -1/2; None: head_dim
    attn_softcap: float | None = None  # scores -> cap * tanh(scores / cap) before the mask
    final_softcap: float | None = None  # logits -> cap * tanh(logits / cap)
    sliding_window: int | None = None  # a sliding layer's query at q sees q - W < k <= q
    layer_types: tuple[str, ...] = ()  # per layer "full" or "sliding"; empty: all full
    # How the standalone RMSNorms (QK-norm, a tied head's norm; every norm with fused=False)
    # round 16-bit inputs: "flax" (promote), "hf_llama" (cast before the gain), "gemma"
    # (cast after). The fused projections round once after the gain, as "gemma" does.
    norm_convention: str = "flax"
    fused: bool = True
    folded: bool = False
    impl: str | None = None
    # The KV cache's layout; None: "bksd" for fused models (the attention input writes k and v
    # in the layout attention reads), "bskd" (Flax's) for stock ones.
    cache_layout: str | None = None
    dtype: Any = None  # computation dtype; None follows Flax promotion from param_dtype
    param_dtype: Any = jnp.float32

    def __post_init__(self) -> None:
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE; got {self.head_dim}")
        for name, value, allowed in (("activation", self.activation, ACTIVATIONS),
                                     ("qk_norm_over", self.qk_norm_over, QK_NORM_OVER),
                                     ("norm_convention", self.norm_convention, CONVENTIONS),
                                     ("cache_layout", self.kv_layout, CACHE_LAYOUTS)):
            if value not in allowed:
                raise ValueError(f"{name} must be one of {allowed}; got {value!r}")
        if self.layer_types:
            if len(self.layer_types) != self.n_layers or not set(self.layer_types) <= set(
                    LAYER_TYPES):
                raise ValueError(f"layer_types must give one of {LAYER_TYPES} per layer "
                                 f"({self.n_layers}); got {self.layer_types}")
            if "sliding" in self.layer_types and not self.sliding_window:
                raise ValueError("sliding layers need a positive sliding_window")
        if not self.pre_norms and not self.post_norms:
            raise ValueError("a model needs pre_norms, post_norms or both")

    @property
    def kv_layout(self) -> str:
        """The KV cache's layout in effect: `cache_layout`, else "bksd" for a fused model
        with several KV heads, "bskd" otherwise.

        XLA's attention dots (B > 1) read keys and values as [B, KV, S, D]; a [B, S, KV, D]
        cache is re-laid out for them: once around a jitted decode loop (both directions),
        or on every step of a jitted single step (H200: bench/results/2026-12-04-model-suite,
        the "copy" kernels of decode at B >= 8). With one KV head there is nothing to
        re-lay out, and [B, 1, S, D] cost copies that [B, S, 1, D] did not (Gemma-3-1B
        decode at B = 64: 125 against 27.5 us a step, bench/results/2026-12-05-decode-cold)."""
        if self.cache_layout is not None:
            return self.cache_layout
        return "bksd" if self.fused and self.n_kv_heads > 1 else "bskd"

    def cache_shape(self, batch: int, max_len: int) -> tuple[int, int, int, int]:
        """The shape of one layer's keys (and values) in `kv_layout`."""
        if self.kv_layout == "bksd":
            return batch, self.n_kv_heads, max_len, self.head_dim
        return batch, max_len, self.n_kv_heads, self.head_dim

    @property
    def scale_offset(self) -> float:
        """The norms' gain is scale + scale_offset: Gemma's 1 + g."""
        return self.norm_offset

    def is_sliding(self, layer: int) -> bool:
        return bool(self.layer_types) and self.layer_types[layer] == "sliding"

    def replace(self, **changes: Any) -> ModelConfig:
        return dataclasses.replace(self, **changes)


def _preset(defaults: dict[str, Any], overrides: dict[str, Any]) -> ModelConfig:
    return ModelConfig(**{**defaults, **overrides})


def llama(**overrides: Any) -> ModelConfig:
    """Llama 2/3 style: pre-norm RMSNorm, SwiGLU, untied embeddings, no biases."""
    return _preset({"tied_embeddings": False}, overrides)


def llama3(**overrides: Any) -> ModelConfig:
    """Llama 3.1/3.2: Llama with rope base 500000 and llama3 rope scaling (factor 8 at 8192)."""
    return _preset({"rope_theta": 500_000.0, "eps": 1e-5,
                    "rope_scaling": RopeScaling("llama3", 8.0, 1.0, 4.0, 8192)}, overrides)


def qwen2(**overrides: Any) -> ModelConfig:
    """Qwen2/2.5: Llama with q/k/v biases (none on o), rope base 1e6, tied in the small sizes."""
    return _preset({"qkv_bias": True, "rope_theta": 1_000_000.0, "tied_embeddings": True},
                   overrides)


def qwen3(**overrides: Any) -> ModelConfig:
    """Qwen3: Llama plus per-head QK-norm, tied embeddings (as in the small Qwen3 models)."""
    return _preset({"qk_norm": True, "tied_embeddings": True}, overrides)


_GEMMA = {"norm_offset": 1.0, "activation": "gelu_tanh", "embed_scale": True,
          "tied_embeddings": True}


def gemma(**overrides: Any) -> ModelConfig:
    """Gemma 1: (1 + g) gains, GeGLU (tanh GELU), sqrt(d)-scaled tied embeddings."""
    return _preset(_GEMMA, overrides)


def gemma2(**overrides: Any) -> ModelConfig:
    """Gemma 2: Gemma 1 plus sandwich norms, soft-capping, every other layer sliding."""
    n_layers = overrides.get("n_layers", ModelConfig.n_layers)
    return _preset({**_GEMMA, "post_norms": True, "attn_softcap": 50.0, "final_softcap": 30.0,
                    "sliding_window": 4096,
                    "layer_types": tuple("sliding" if i % 2 == 0 else "full"
                                         for i in range(n_layers))}, overrides)


def gemma3(**overrides: Any) -> ModelConfig:
    """Gemma 3 (text): sandwich norms, per-head (1 + g) QK-norm, five sliding layers per
    full one, rope base 1e6 on full layers and 10000 on sliding ones, no soft-capping."""
    n_layers = overrides.get("n_layers", ModelConfig.n_layers)
    return _preset({**_GEMMA, "post_norms": True, "qk_norm": True, "rope_theta": 1_000_000.0,
                    "local_rope_theta": 10_000.0, "sliding_window": 512,
                    "layer_types": tuple("sliding" if (i + 1) % 6 else "full"
                                         for i in range(n_layers))}, overrides)


def olmo2(**overrides: Any) -> ModelConfig:
    """OLMo 2: no input norms, a norm on each sublayer's output, QK-norm over the whole
    q and k projections, rope base 500000, untied embeddings."""
    return _preset({"pre_norms": False, "post_norms": True, "qk_norm": True,
                    "qk_norm_over": "projection", "rope_theta": 500_000.0}, overrides)
