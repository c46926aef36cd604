"""One frozen dataclass describes a model; presets name the Llama, Qwen3 and Gemma styles."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """A small pre-norm decoder-only transformer (GQA, RoPE, gated MLP).

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
    eps: float = 1e-6
    qk_norm: bool = False  # Qwen3 / Gemma 3: per-head RMSNorm of q and k before RoPE
    tied_embeddings: bool = False
    gemma: bool = False  # (1 + g) gains initialized at g = 0, sqrt(d) embedding scale, GeGLU
    fused: bool = True
    folded: bool = False
    impl: str | None = None
    dtype: Any = None  # computation dtype; None follows Flax promotion from param_dtype
    param_dtype: Any = jnp.float32

    def __post_init__(self) -> None:
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE; got {self.head_dim}")

    @property
    def scale_offset(self) -> float:
        """The norms' gain is scale + scale_offset: Gemma's 1 + g."""
        return 1.0 if self.gemma else 0.0

    def replace(self, **changes: Any) -> ModelConfig:
        return dataclasses.replace(self, **changes)


def llama(**overrides: Any) -> ModelConfig:
    """Llama style: RMSNorm, SwiGLU, untied embeddings (the final norm folds into the head)."""
    return ModelConfig(**{"tied_embeddings": False, **overrides})


def qwen3(**overrides: Any) -> ModelConfig:
    """Qwen3 style: Llama plus QK-norm, tied embeddings (as in the small Qwen3 models)."""
    return ModelConfig(**{"qk_norm": True, "tied_embeddings": True, **overrides})


def gemma(**overrides: Any) -> ModelConfig:
    """Gemma style: (1 + g) gains, QK-norm (Gemma 3), GeGLU, scaled tied embeddings."""
    return ModelConfig(**{"gemma": True, "qk_norm": True, "tied_embeddings": True, **overrides})
