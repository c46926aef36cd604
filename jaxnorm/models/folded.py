"""Moving parameters between model variants: stock <-> jaxnorm layers, plain <-> flashified."""

from __future__ import annotations

from typing import Any

from flax import nnx

from jaxnorm.flashify import flashify
from jaxnorm.models.transformer import Transformer


def params_of(model: Transformer) -> dict:
    """The model's parameters as a plain nested dict (the form `jaxnorm.flashify.flashify` takes)."""
    return nnx.to_pure_dict(nnx.state(model, nnx.Param))


def load_params(model: Transformer, params: dict | None = None, **changes: Any) -> Transformer:
    """A model of `model.cfg.replace(**changes)` holding `params` (default: `model`'s own).

    Stock and jaxnorm layers share one tree, so `load_params(m, fused=False)` is
    the same network on stock Flax layers.
    """
    new = nnx.eval_shape(lambda: Transformer(model.cfg.replace(**changes), rngs=nnx.Rngs(0)))
    state = nnx.state(new, nnx.Param)
    nnx.replace_by_pure_dict(state, params_of(model) if params is None else params)
    nnx.update(new, state)
    return new


def flashify_model(model: Transformer) -> Transformer:
    """The same network with every foldable norm gain folded into the projections it feeds.

    Attention-input norms fold into q/k/v, MLP-input norms into gate/up, the
    final norm into the LM head when embeddings are untied; QK-norm gains,
    post-sublayer norms and a tied head's norm stay (see `jaxnorm.flashify`).
    """
    folded = flashify(params_of(model), scale_offset=model.cfg.scale_offset)
    return load_params(model, folded.params, folded=True)
