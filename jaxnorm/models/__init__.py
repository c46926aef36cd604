"""A small Llama/Qwen3/Gemma-style NNX transformer, built from stock Flax or jaxnorm layers.

    >>> from jaxnorm import models
    >>> model = models.Transformer(models.llama(fused=True), rngs=nnx.Rngs(0))
    >>> tokens = models.greedy_decode(model, jnp.array([[1, 2, 3]]), steps=8)
    >>> folded = models.flashify_model(model)   # gains folded into the projections
"""

from jaxnorm.models.config import ModelConfig, gemma, llama, qwen3
from jaxnorm.models.folded import flashify_model, load_params, params_of
from jaxnorm.models.generate import greedy_decode
from jaxnorm.models.train import next_token_loss, train_step
from jaxnorm.models.transformer import Transformer

__all__ = [
    "ModelConfig",
    "Transformer",
    "flashify_model",
    "gemma",
    "greedy_decode",
    "llama",
    "load_params",
    "next_token_loss",
    "params_of",
    "qwen3",
    "train_step",
]
