"""Greedy decoding with a KV cache: one jitted prefill, then a `lax.scan` of single-token steps."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxnorm.models.transformer import Transformer

Array = jax.Array


def _left_padding(prompt_mask: Array, shape: tuple[int, int]) -> Array:
    """pad [B]: how many leading slots of each row are padding; the mask must be left-padded."""
    mask = np.asarray(prompt_mask)
    if mask.shape != shape:
        raise ValueError(f"prompt_mask must have the prompt's shape {shape}; got {mask.shape}")
    mask = mask.astype(bool)
    pad = (~mask).sum(axis=1)
    if not np.array_equal(mask, np.arange(shape[1])[None, :] >= pad[:, None]):
        raise ValueError("prompt_mask must be left-padded: zeros, then ones, in every row")
    if np.any(pad == shape[1]):
        raise ValueError("prompt_mask has a row with no tokens")
    return jnp.asarray(pad, jnp.int32)


def greedy_decode(model: Transformer, prompt: Array, steps: int, *,
                  prompt_mask: Array | None = None, eos_id: int | None = None) -> Array:
    """The `steps` tokens [B, steps] that greedy (argmax) decoding appends to `prompt` [B, P].

    `prompt_mask` [B, P] (1 for a token, 0 for padding) batches prompts of different
    lengths, left-padded as transformers' generate expects. With `eos_id`, a row that
    emits it is done: its later tokens are `eos_id`.

    >>> tokens = greedy_decode(model, jnp.array([[1, 2, 3]]), steps=8)
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1; got {steps}")
    prompt = jnp.asarray(prompt, jnp.int32)
    pad = None if prompt_mask is None else _left_padding(prompt_mask, prompt.shape)
    graphdef, state = nnx.split(model)
    return _decode(graphdef, state, prompt, steps, pad, eos_id)


@functools.partial(jax.jit, static_argnums=(0, 3, 5))
def _decode(graphdef: nnx.GraphDef, state: nnx.State, prompt: Array, steps: int,
            pad: Array | None, eos_id: int | None) -> Array:
    model = nnx.merge(graphdef, state)
    batch, length = prompt.shape
    cache = model.init_cache(batch, length + steps)
    logits, cache = model(prompt, cache=cache, pad=pad)
    first = jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32)
    done = jnp.zeros((batch,), bool) if eos_id is None else first == eos_id

    def step(carry, _):
        token, cache, position, done = carry
        logits, cache = model(token[:, None], start=position, cache=cache, pad=pad)
        nxt = jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32)
        if eos_id is not None:
            nxt = jnp.where(done, eos_id, nxt)
            done = done | (nxt == eos_id)
        return (nxt, cache, position + 1, done), nxt

    _, rest = jax.lax.scan(step, (first, cache, jnp.int32(length), done), length=steps - 1)
    return jnp.concatenate([first[:, None], rest.T], axis=1)
