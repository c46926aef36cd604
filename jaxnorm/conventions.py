"""Where real RMSNorm implementations round differently in 16-bit dtypes, selectable by name.

With bfloat16 activations and a float32 (or bfloat16) gain the families differ only
in where they round (verify/references.py holds a float64 reference for each):

    "flax"      Flax's nnx/nn.RMSNorm: x and the gain promoted to their common dtype
                (float32 for bf16 x with f32 parameters), normalized, output in it.
    "hf_llama"  transformers' Llama, Qwen2, Qwen3: normalize in float32, cast to x's
                dtype, then multiply by the gain; output promote(x, gain).
    "gemma"     transformers' Gemma 1/2/3 and OLMo 2: normalize and multiply by the
                gain in float32, one cast to x's dtype (jaxnorm's functional ops).

In float32 all three agree. `dtype` (a layer's computation dtype) casts x and the
gain first, as Flax does.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax.nnx.nn.dtypes import promote_dtype

from jaxnorm import ops

Array = jax.Array
CONVENTIONS = ("flax", "hf_llama", "gemma")


def check_convention(convention: str) -> str:
    if convention not in CONVENTIONS:
        raise ValueError(f"convention must be one of {CONVENTIONS}; got {convention!r}")
    return convention


def rms_norm_as(convention: str, x: Array, scale: Array | None, *, eps: float,
                scale_offset: float, dtype=None, impl: str | None = None) -> Array:
    """RMSNorm(x) * (scale + scale_offset) rounded as `convention` rounds it."""
    check_convention(convention)
    if convention == "flax" or dtype is not None:
        x, scale = promote_dtype((x, scale), dtype=dtype)
    if convention != "hf_llama":
        return ops.rms_norm(x, scale, eps=eps, scale_offset=scale_offset, impl=impl)
    normed = ops.rms_norm(x, None, eps=eps, impl=impl)  # rounded to x's dtype
    if scale is None:
        return normed
    gain = scale + jnp.asarray(scale_offset, scale.dtype) if scale_offset else scale
    return normed * gain
