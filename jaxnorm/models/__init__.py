"""Llama, Qwen2/3, Gemma 1/2/3 and OLMo 2 style NNX transformers, from stock Flax or jaxnorm layers.

    >>> from jaxnorm import models
    >>> model = models.Transformer(models.llama(fused=True), rngs=nnx.Rngs(0))
    >>> tokens = models.greedy_decode(model, jnp.array([[1, 2, 3]]), steps=8)
    >>> folded = models.flashify_model(model)   # gains folded into the projections
    >>> model = models.from_pretrained("path/to/hf-model-dir")   # a transformers checkpoint
"""

from jaxnorm.models.checkpoints import CheckpointError, from_pretrained, save_pretrained
from jaxnorm.models.config import (
    ModelConfig,
    RopeScaling,
    gemma,
    gemma2,
    gemma3,
    llama,
    llama3,
    olmo2,
    qwen2,
    qwen3,
)
from jaxnorm.models.folded import flashify_model, load_params, params_of
from jaxnorm.models.generate import greedy_decode
from jaxnorm.models.train import next_token_loss, train_step
from jaxnorm.models.transformer import Transformer

__all__ = [
    "CheckpointError",
    "ModelConfig",
    "RopeScaling",
    "Transformer",
    "flashify_model",
    "from_pretrained",
    "gemma",
    "gemma2",
    "gemma3",
    "greedy_decode",
    "llama",
    "llama3",
    "load_params",
    "next_token_loss",
    "olmo2",
    "params_of",
    "qwen2",
    "qwen3",
    "save_pretrained",
    "train_step",
]
