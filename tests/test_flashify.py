"""flashify / unflashify: what folds, what must not, round trips, and equal logits."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from flax import nnx

import jaxnorm.linen as jlinen
import jaxnorm.nnx as jnnx
from jaxnorm import models
from jaxnorm.flashify import flashify, unflashify
from verify import references as ref
from verify import tolerances as tol
from verify.references import f64

EPS = 1e-6
K = 32


def _randomize_gains(model: models.Transformer, seed: int) -> None:
    """Every norm gain away from its initial 1 (or 0 for Gemma's 1 + g), so folding matters."""
    state = nnx.state(model, nnx.Param)
    keys = iter(jax.random.split(jax.random.key(seed), 64))

    def perturb(path, value):
        if path[-1] != "scale":
            return value
        return value + 0.3 * jax.random.normal(next(keys), value.shape, value.dtype)

    nnx.update(model, jax.tree.map_with_path(lambda p, v: perturb([k.key for k in p], v),
                                             nnx.to_pure_dict(state)))


def _model(preset, seed=0) -> models.Transformer:
    model = models.Transformer(preset(d_model=K, head_dim=8, d_ff=48), rngs=nnx.Rngs(seed))
    _randomize_gains(model, seed + 1)
    return model


def _paths(tree) -> set[str]:
    return {"/".join(str(k.key) for k in path)
            for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0]}


PRESETS = [models.llama, models.qwen3, models.gemma]


@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: p.__name__)
def test_what_folds_and_what_stays(preset):
    model = _model(preset)
    before = _paths(models.params_of(model))
    after = _paths(flashify(models.params_of(model),
                                 scale_offset=model.cfg.scale_offset).params)
    removed = before - after
    folded_norms = {f"layers/{i}/{g}/norm/scale" for i in range(model.cfg.n_layers)
                    for g in ("attn_in", "mlp_in")}
    if not model.cfg.tied_embeddings:
        folded_norms.add("head/norm/scale")
    assert removed == folded_norms
    assert after <= before
    if model.cfg.tied_embeddings:
        assert "head_norm/scale" in after  # shared with the input embedding: never folded
    if model.cfg.qk_norm:
        assert "layers/0/attn/q_norm/scale" in after and "layers/0/attn/k_norm/scale" in after


@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: p.__name__)
def test_round_trip(preset):
    params = models.params_of(_model(preset))
    back = unflashify(flashify(params, scale_offset=1.0 if preset is models.gemma
                                         else 0.0))
    assert jax.tree.structure(back) == jax.tree.structure(params)
    # fold then unfold: two float32 roundings of each weight
    for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(params)):
        np.testing.assert_allclose(a, b, rtol=4 * tol.U_F32, atol=0)


@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: p.__name__)
def test_flashified_logits_match(preset):
    """Within the verify error model: each folded group rounds its weights once more
    (a dense tolerance at its output); the residual stream carries those errors
    to the logits, so the bound is one head tolerance per folded group on the path."""
    model = _model(preset)
    folded = models.flashify_model(model)
    assert folded.cfg.folded
    tokens = jax.random.randint(jax.random.key(5), (2, 12), 0, model.cfg.vocab_size)
    logits, _ = model(tokens)
    logits_folded, _ = folded(tokens)

    cfg = model.cfg
    hidden, _ = model.hidden(tokens)
    params = models.params_of(model)
    if cfg.tied_embeddings:
        scale, kernel = params["head_norm"]["scale"], params["embed"]["embedding"].T
    else:
        scale, kernel = params["head"]["norm"]["scale"], params["head"]["lm_head"]["kernel"]
    normed = ref.rms_norm(np.asarray(hidden), scale, eps=cfg.eps, scale_offset=cfg.scale_offset)
    head = tol.dense_tolerance(normed, f64(kernel), f64(logits), np.float32, np.float32)
    groups = 2 * cfg.n_layers + (0 if cfg.tied_embeddings else 1)
    ratio = np.abs(f64(logits_folded) - f64(logits)) / (groups * head)
    assert ratio.max() <= 1.0, ratio.max()
    np.testing.assert_array_equal(models.greedy_decode(model, tokens[:, :4], 5),
                                  models.greedy_decode(folded, tokens[:, :4], 5))


def _layer_norm_params(use_bias: bool) -> tuple[jnnx.LayerNormLinear, dict]:
    layer = jnnx.LayerNormLinear(K, 20, use_bias=use_bias, epsilon=EPS,
                                 scale_init=lambda k, s, d: 1 + 0.3 * jax.random.normal(k, s, d),
                                 norm_bias_init=nnx.initializers.normal(0.5),
                                 bias_init=nnx.initializers.normal(0.5), rngs=nnx.Rngs(0))
    return layer, nnx.to_pure_dict(nnx.state(layer))


@pytest.mark.parametrize("use_bias", [True, False])
def test_layer_norm_group_folds_bias_and_gain(use_bias):
    layer, params = _layer_norm_params(use_bias)
    folded = flashify(params)
    assert "norm" not in folded.params and "bias" in folded.params["linear"]
    target = jnnx.LayerNormLinear(K, 20, use_bias=True, use_scale=False, use_norm_bias=False,
                                  epsilon=EPS, rngs=nnx.Rngs(1))
    nnx.update(target, folded.params)
    x = np.random.default_rng(0).standard_normal((6, K)).astype(np.float32)
    y, y_folded = layer(jnp.asarray(x)), target(jnp.asarray(x))
    normed = ref.layer_norm(x, params["norm"]["scale"], params["norm"]["bias"], eps=EPS)
    w = f64(params["linear"]["kernel"])
    bias = f64(params["linear"].get("bias"))
    bound = 2 * tol.dense_tolerance(normed, w, f64(y), np.float32, np.float32, bias=bias)
    assert np.all(np.abs(f64(y_folded) - f64(y)) <= bound)
    back = unflashify(folded)
    assert jax.tree.structure(back) == jax.tree.structure(params)
    np.testing.assert_allclose(back["linear"]["kernel"], params["linear"]["kernel"], rtol=1e-6)


def test_linen_tree_folds_too():
    layer = jlinen.RMSNormDense(16, scale_init=nn.initializers.normal(1.0))
    x = jnp.asarray(np.random.default_rng(1).standard_normal((3, K)), jnp.float32)
    params = layer.init(jax.random.key(0), x)["params"]
    folded = flashify(params).params
    assert set(folded) == {"dense"}
    y = jlinen.RMSNormDense(16, use_scale=False).apply({"params": folded}, x)
    np.testing.assert_allclose(y, layer.apply({"params": params}, x), rtol=1e-5, atol=1e-5)


def test_non_groups_are_untouched():
    params = {"norm": {"scale": jnp.ones(4)},  # a norm with no projection beside it
              "mixed": {"norm": {"scale": jnp.ones(4)}, "q": {"kernel": jnp.ones((4, 2))},
                        "other": {"embedding": jnp.ones((3, 4))}}}
    folded = flashify(params)
    assert folded.norms == {}
    assert jax.tree.structure(folded.params) == jax.tree.structure(params)
