"""The RMSNorm layers' rounding conventions (`jaxnorm.conventions`) against verify's float64
reference of each, in bfloat16, with float32 and bfloat16 gains."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from flax import nnx

from jaxnorm import linen as jlinen
from jaxnorm import nnx as jnnx
from verify import references as ref
from verify import tolerances as tol

BF16 = np.dtype(ml_dtypes.bfloat16)
F32 = np.dtype(np.float32)


def _nnx(convention: str, g: np.ndarray, offset: float):
    layer = jnnx.RMSNorm(g.shape[0], param_dtype=g.dtype, scale_offset=offset,
                         convention=convention, impl="xla", rngs=nnx.Rngs(0))
    layer.scale[...] = jnp.asarray(g)
    return layer


def _linen(convention: str, g: np.ndarray, offset: float):
    layer = jlinen.RMSNorm(param_dtype=g.dtype, scale_offset=offset, convention=convention,
                           impl="xla")
    return lambda x: layer.apply({"params": {"scale": jnp.asarray(g)}}, x)


@pytest.mark.parametrize("make", [_nnx, _linen], ids=["nnx", "linen"])
@pytest.mark.parametrize("gain_dtype", [F32, BF16], ids=["f32-gain", "bf16-gain"])
@pytest.mark.parametrize("convention", ["flax", "hf_llama", "gemma"])
def test_layer_rounds_as_its_convention(make, gain_dtype, convention):
    """Output dtype and values of each convention, judged against its reference (which
    holds HF Llama's cast before the gain; Gemma's 1 + g gain with scale_offset=1)."""
    rng = np.random.default_rng(7)
    x = (3.0 * rng.standard_normal((6, 96))).astype(BF16)
    offset = 1.0 if convention == "gemma" else 0.0
    g = ((0.0 if offset else 1.0) + 0.3 * rng.standard_normal(96)).astype(gain_dtype)
    y = make(convention, g, offset)(jnp.asarray(x))
    assert y.dtype == ref.output_dtype(convention, x.dtype, g.dtype)
    y64 = ref.rms_norm(x, g, scale_offset=offset, convention=convention)
    intermediate = BF16 if convention == "hf_llama" else F32
    t = tol.norm_tolerance(y64, y64, y.dtype, intermediate_dtype=intermediate)
    err = np.abs(np.asarray(y, np.float64) - y64)
    assert np.all(err <= t), f"worst error/tolerance {np.max(err / t):.3f}"


def test_hf_llama_rounds_the_normalized_rows_before_the_gain():
    """With a bfloat16 gain the HF Llama form is bf16(g * bf16(normalize(x))): transliterated
    here in numpy, it matches the layer exactly, and differs from the cast-after form."""
    rng = np.random.default_rng(8)
    x = rng.standard_normal((8, 128)).astype(BF16)
    g = (1.0 + 0.3 * rng.standard_normal(128)).astype(BF16)
    x32 = x.astype(np.float32)
    hidden = (x32 / np.sqrt(np.mean(x32 * x32, -1, keepdims=True) + 1e-6)).astype(BF16)
    transliterated = (g.astype(np.float32) * hidden.astype(np.float32)).astype(BF16)
    y = np.asarray(_nnx("hf_llama", g, 0.0)(jnp.asarray(x)))
    mismatch = np.mean(y.astype(np.float32) != transliterated.astype(np.float32))
    assert mismatch < 0.01  # rsqrt vs 1/sqrt may move a rare element by one ulp
    after = np.asarray(_nnx("gemma", g, 0.0)(jnp.asarray(x)))
    assert np.any(after.astype(np.float32) != y.astype(np.float32))


def test_unknown_convention_names_the_choices():
    with pytest.raises(ValueError, match=r"convention must be one of \('flax', 'hf_llama'"):
        jnnx.RMSNorm(8, convention="torch", rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="convention must be one of"):
        jlinen.RMSNorm(convention="torch").init(jax.random.key(0), jnp.ones((2, 8)))


@pytest.mark.parametrize("fused", [True, False], ids=["jaxnorm", "stock"])
@pytest.mark.parametrize("convention", ["flax", "hf_llama", "gemma"])
def test_model_norms_follow_the_config_convention(fused, convention):
    """`ModelConfig.norm_convention` reaches the standalone norms of both flavours (here a
    bf16 Qwen3's per-head QK-norm, Gemma-style 1 + g for "gemma"), judged as above."""
    from jaxnorm import models

    offset = 1.0 if convention == "gemma" else 0.0
    cfg = models.qwen3(fused=fused, impl="xla", param_dtype=jnp.bfloat16, norm_offset=offset,
                       norm_convention=convention)
    norm = models.Transformer(cfg, rngs=nnx.Rngs(0)).layers[0].attn.q_norm
    rng = np.random.default_rng(9)
    g = ((0.0 if offset else 1.0) + 0.3 * rng.standard_normal(cfg.head_dim)).astype(BF16)
    norm.scale[...] = jnp.asarray(g)
    x = (2.0 * rng.standard_normal((5, cfg.head_dim))).astype(BF16)
    y = norm(jnp.asarray(x))
    assert y.dtype == ref.output_dtype(convention, x.dtype, g.dtype)
    y64 = ref.rms_norm(x, g, eps=cfg.eps, scale_offset=offset, convention=convention)
    intermediate = BF16 if convention == "hf_llama" else F32
    t = tol.norm_tolerance(y64, y64, y.dtype, intermediate_dtype=intermediate)
    assert np.all(np.abs(np.asarray(y, np.float64) - y64) <= t)


def test_from_pretrained_picks_the_family_convention_when_asked(tmp_path):
    from hf_reference import random_tensors, write_checkpoint

    from jaxnorm import models

    base = dict(vocab_size=31, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                num_attention_heads=2, num_key_value_heads=1, rms_norm_eps=1e-5)
    for model_type, expected in (("qwen3", "hf_llama"), ("gemma2", "gemma"),
                                 ("olmo2", "gemma")):
        hf = dict(base, model_type=model_type, head_dim=16)
        write_checkpoint(tmp_path / model_type, hf, random_tensors(hf, seed=1))
        picked = models.from_pretrained(tmp_path / model_type, norm_convention="hf")
        assert picked.cfg.norm_convention == expected
        assert models.from_pretrained(tmp_path / model_type).cfg.norm_convention == "flax"
    with pytest.raises(ValueError, match="norm_convention must be one of"):
        models.from_pretrained(tmp_path / "qwen3", norm_convention="torch")
