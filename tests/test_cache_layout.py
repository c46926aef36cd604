"""The KV cache's layout (`ModelConfig.cache_layout`): [B, S, KV, D] as Flax keeps it, or
[B, KV, S, D] as XLA's attention dots read it (the fused models' default). Either layout
decodes the same tokens with the same logits; [B, KV, S, D] is never re-laid out."""

from __future__ import annotations

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from bench import model_suite
from jaxnorm import models


def test_fused_models_default_to_the_layout_attention_reads():
    cfg = models.qwen3(n_kv_heads=2, head_dim=16)
    assert cfg.replace(fused=True).kv_layout == "bksd"
    assert cfg.replace(fused=False).kv_layout == "bskd"
    assert cfg.replace(fused=True, cache_layout="bskd").kv_layout == "bskd"
    # One KV head: nothing to re-lay out, and [B, 1, S, D] measured slower (config.py).
    assert cfg.replace(fused=True, n_kv_heads=1).kv_layout == "bskd"
    assert cfg.replace(fused=True, n_kv_heads=1, cache_layout="bksd").kv_layout == "bksd"
    assert cfg.replace(fused=False).cache_shape(3, 10) == (3, 10, 2, 16)
    assert cfg.replace(fused=True).cache_shape(3, 10) == (3, 2, 10, 16)
    model = models.Transformer(cfg.replace(fused=True), rngs=nnx.Rngs(0))
    assert all(k.shape == v.shape == (3, 2, 10, 16) for k, v in model.init_cache(3, 10))
    with pytest.raises(ValueError, match="cache_layout must be one of"):
        cfg.replace(cache_layout="bsdk")


CONFIGS = {"qwen3": models.qwen3(), "gemma2": models.gemma2(n_layers=3, sliding_window=3)}


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("fused", [True, False])
def test_both_layouts_decode_the_same(name, fused):
    """Greedy tokens identical and cached logits equal (a prompt of 5, then 3 tokens), with
    QK-norm (Qwen3) and with a sliding window and soft-capped scores (Gemma 2)."""
    cfg = CONFIGS[name].replace(fused=fused, impl="xla" if fused else None)
    base = models.Transformer(cfg.replace(cache_layout="bskd"), rngs=nnx.Rngs(3))
    other = models.load_params(base, cache_layout="bksd")
    prompt = jax.random.randint(jax.random.key(1), (2, 5), 0, cfg.vocab_size)
    np.testing.assert_array_equal(models.greedy_decode(base, prompt, 6),
                                  models.greedy_decode(other, prompt, 6))
    sequence = jax.random.randint(jax.random.key(2), (2, 8), 0, cfg.vocab_size)
    logits = []
    for model in (base, other):
        _, cache = model(sequence[:, :5], cache=model.init_cache(2, 12))
        logits.append(model(sequence[:, 5:8], start=5, cache=cache)[0])
    np.testing.assert_allclose(*logits, rtol=1e-6, atol=1e-6)


def _cache_sized_relayouts(layout: str) -> list[str]:
    """Transposes and copies of a whole layer's keys or values in the optimized (CPU) program
    of the model suite's decode steps (a lax.scan), apart from the copy of each cache
    argument into the loop (the arguments are not donated)."""
    shape = dataclasses.replace(model_suite.SHAPES["qwen3-0.6b"], cache=256)
    cfg = shape.cfg.replace(n_layers=2, vocab_size=512, impl="xla", cache_layout=layout)
    shape = dataclasses.replace(shape, cfg=cfg)
    graphdef, state = nnx.split(nnx.eval_shape(lambda: models.Transformer(cfg,
                                                                          rngs=nnx.Rngs(0))))
    kv = jax.ShapeDtypeStruct(cfg.cache_shape(4, shape.cache), cfg.dtype)
    token = jax.ShapeDtypeStruct((4,), jnp.int32)
    text = jax.jit(model_suite.decode_steps(graphdef, shape)).trace(
        state, token, tuple((kv, kv) for _ in range(cfg.n_layers))).lower().compile().as_text()
    elements = int(np.prod(kv.shape))

    def size(line: str) -> int:
        found = re.search(r"= \w+\[([\d,]+)\]", line)
        return int(np.prod([int(d) for d in found.group(1).split(",")])) if found else 0

    return [line.strip() for line in text.splitlines()
            if re.search(r" (transpose|copy)\(", line) and size(line) == elements
            and not re.search(r"copy\(%cache_", line)]


def test_the_attention_layout_is_never_re_laid_out():
    """With [B, KV, S, D] no transpose or copy of a whole cache is left in the decode loop;
    with [B, S, KV, D] XLA re-lays the cache out for the attention dots (on this CPU, in
    every step; on the H200, around the loop: the "copy" kernels of decode at B >= 8)."""
    assert _cache_sized_relayouts("bksd") == []
    assert _cache_sized_relayouts("bskd")
