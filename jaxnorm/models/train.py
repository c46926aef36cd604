"""Next-token training: the loss, an optimizer step, and the benchmark's tiny train step."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from jaxnorm.models.config import ModelConfig
from jaxnorm.models.transformer import Transformer

Array = jax.Array


def next_token_loss(model: Transformer, tokens: Array) -> Array:
    """Mean cross-entropy of predicting tokens[:, 1:] from tokens[:, :-1]."""
    logits, _ = model(tokens[:, :-1])
    return optax.softmax_cross_entropy_with_integer_labels(
        logits.astype(jnp.float32), tokens[:, 1:]).mean()


@nnx.jit
def train_step(model: Transformer, optimizer: nnx.Optimizer, tokens: Array) -> Array:
    """One optimizer step on a batch of token sequences [B, T + 1]; returns the loss."""
    loss, grads = nnx.value_and_grad(next_token_loss)(model, tokens)
    optimizer.update(model, grads)
    return loss


def tiny_train_step(variant: str, cfg: ModelConfig | None = None, *, batch: int = 8,
                    seq_len: int = 64, learning_rate: float = 1e-2,
                    seed: int = 0) -> tuple[Callable[..., Any], tuple[Array, ...]]:
    """(step, args) for `bench`: step(*args) is one SGD step of a tiny model, pure and jittable.

    `variant` is "stock" (stock Flax layers) or "jaxnorm"; args are flat arrays
    (the parameters, then a token batch) so a harness can time and rotate them.
    """
    if variant not in ("stock", "jaxnorm"):
        raise ValueError(f"variant must be 'stock' or 'jaxnorm'; got {variant!r}")
    cfg = (cfg or ModelConfig()).replace(fused=variant == "jaxnorm")
    graphdef, state = nnx.split(Transformer(cfg, rngs=nnx.Rngs(seed)))
    leaves, treedef = jax.tree.flatten(state)
    tokens = jax.random.randint(jax.random.key(seed), (batch, seq_len + 1), 0, cfg.vocab_size)

    def step(*args: Array) -> tuple[Array, ...]:
        params = jax.tree.unflatten(treedef, args[:-1])
        loss, grads = jax.value_and_grad(
            lambda p: next_token_loss(nnx.merge(graphdef, p), args[-1]))(params)
        updated = jax.tree.map(lambda p, g: p - learning_rate * g, params, grads)
        return (loss, *jax.tree.leaves(updated))

    return step, (*leaves, tokens)
