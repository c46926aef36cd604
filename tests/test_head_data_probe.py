"""bench/gpu/head_data_probe.py times the head on the operands the training step gives it."""


import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from bench import model_suite
from bench.gpu import head_data_probe
from jaxnorm import models


def test_head_operands_are_the_models_logits_input_and_their_cotangent():
    shape = model_suite.QUICK
    cfg = shape.cfg.replace(fused=False, tied_embeddings=True)
    model = models.Transformer(cfg, rngs=nnx.Rngs(3))
    tokens = model_suite._tokens(jax.random.key(1), 2, 9, cfg.vocab_size)
    ops = head_data_probe.head_operands(model, tokens)
    logits, _ = model(tokens[:, :-1])
    logits = np.asarray(logits, np.float64).reshape(-1, cfg.vocab_size)
    h, e = (np.asarray(ops[k], np.float64) for k in ("h", "E"))
    np.testing.assert_allclose(h @ e.T, logits, rtol=2e-2, atol=2e-2 * np.abs(logits).max())
    labels = np.asarray(tokens[:, 1:]).reshape(-1)
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    p[np.arange(labels.size), labels] -= 1.0
    expected = p / labels.size
    np.testing.assert_allclose(np.asarray(ops["g"], np.float64), expected, rtol=3e-2,
                               atol=3e-2 * np.abs(expected).max())


def test_describe_counts_zeros_and_tiny_values():
    stats = head_data_probe.describe(jnp.array([0.0, 1e-9, 1.0, -2.0], jnp.float32))
    assert stats["zeros"] == 0.25 and stats["tiny"] == 0.5
    np.testing.assert_allclose(stats["rms"], np.sqrt(5 / 4), rtol=1e-6)
