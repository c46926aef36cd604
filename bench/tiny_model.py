"""The train-step suite's tiny model: one SGD step as a pure function of flat arrays.

It lives in bench/ because only the benchmark needs a step whose inputs a
timing harness can rotate; users train with `jaxnorm.models.train_step`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
from flax import nnx

from jaxnorm.models import ModelConfig, Transformer, next_token_loss

Array = jax.Array

VARIANTS = ("stock", "jaxnorm")


def tiny_train_step(variant: str, cfg: ModelConfig | None = None, *, batch: int = 8,
                    seq_len: int = 64, learning_rate: float = 1e-2,
                    seed: int = 0) -> tuple[Callable[..., Any], tuple[Array, ...]]:
    """(step, args): step(*args) is one SGD step of a tiny model, pure and jittable.

    `variant` is "stock" (stock Flax layers) or "jaxnorm"; args are flat arrays
    (the parameters, then a token batch) so a harness can time and rotate them.
    """
    if variant not in VARIANTS:
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
