"""Greedy decoding with a KV cache: one jitted prefill, then a `lax.scan` of single-token steps."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from jaxnorm.models.transformer import Transformer

Array = jax.Array


def greedy_decode(model: Transformer, prompt: Array, steps: int) -> Array:
    """The `steps` tokens [B, steps] that greedy (argmax) decoding appends to `prompt` [B, P].

    >>> tokens = greedy_decode(model, jnp.array([[1, 2, 3]]), steps=8)
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1; got {steps}")
    graphdef, state = nnx.split(model)
    return _decode(graphdef, state, jnp.asarray(prompt, jnp.int32), steps)


@functools.partial(jax.jit, static_argnums=(0, 3))
def _decode(graphdef: nnx.GraphDef, state: nnx.State, prompt: Array, steps: int) -> Array:
    model = nnx.merge(graphdef, state)
    batch, length = prompt.shape
    cache = model.init_cache(batch, length + steps)
    logits, cache = model(prompt, cache=cache)
    first = jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32)

    def step(carry, _):
        token, cache, position = carry
        logits, cache = model(token[:, None], start=position, cache=cache)
        nxt = jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32)
        return (nxt, cache, position + 1), nxt

    _, rest = jax.lax.scan(step, (first, cache, jnp.int32(length)), length=steps - 1)
    return jnp.concatenate([first[:, None], rest.T], axis=1)
