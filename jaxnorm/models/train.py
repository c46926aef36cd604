"""Next-token training: the loss and one optimizer step."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxnorm.models.transformer import Transformer

Array = jax.Array


def next_token_loss(model: Transformer, tokens: Array) -> Array:
    """Mean cross-entropy of predicting tokens[:, 1:] from tokens[:, :-1], in float32.

    Written in jax.numpy so the package needs no optax; the optimizer is the caller's.
    """
    logits, _ = model(tokens[:, :-1])
    log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return -jnp.take_along_axis(log_probs, tokens[:, 1:, None], axis=-1).mean()


@nnx.jit
def train_step(model: Transformer, optimizer: nnx.Optimizer, tokens: Array) -> Array:
    """One optimizer step on a batch of token sequences [B, T + 1]; returns the loss.

    `optimizer` is any `nnx.Optimizer` (e.g. over optax, the `demo` extra).
    """
    loss, grads = nnx.value_and_grad(next_token_loss)(model, tokens)
    optimizer.update(model, grads)
    return loss
